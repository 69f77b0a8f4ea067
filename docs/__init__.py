"""The documentation site's sources; a package so that tests import its build hooks."""
