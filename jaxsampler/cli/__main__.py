"""``python -m jaxsampler.cli``: the ``jaxsampler`` command."""

import sys

from jaxsampler.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
