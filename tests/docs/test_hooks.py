"""The site's build hook renders benchmarks/results/ files in place of their markers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.docs.blocks import ROOT

pytest.importorskip("mkdocs")  # the docs extra (the integration tier installs it)

from docs import _hooks as hooks

PAGE = SimpleNamespace(file=SimpleNamespace(src_uri="page.md"))


def test_a_marker_becomes_the_file() -> None:
    text = (ROOT / "benchmarks" / "results" / "throughput.md").read_text()
    out = hooks.on_page_markdown("before\n<!-- results: throughput.md -->\nafter", PAGE, {}, [])
    title = text.splitlines()[0].lstrip("# ")
    assert out.startswith("before\n") and out.endswith("after")
    assert f"### {title}" in out  # the file's own title, two levels down
    assert "| jaxsampler (measure_rollout) |" in out


def test_all_renders_every_results_file() -> None:
    out = hooks.on_page_markdown("<!-- results: all -->", PAGE, {}, [])
    names = sorted(p.name for p in (ROOT / "benchmarks" / "results").glob("*.md"))
    assert all(f"## `{name}`" in out for name in names)


def test_relative_links_point_into_results() -> None:
    out = hooks.on_page_markdown("<!-- results: ppo_breakout.md -->", PAGE, {}, [])
    assert "](benchmarks/results/ppo_breakout.png)" in out


def test_a_missing_file_fails_the_build() -> None:
    with pytest.raises(FileNotFoundError, match="nope.md"):
        hooks.on_page_markdown("<!-- results: nope.md -->", PAGE, {}, [])


def test_text_without_markers_is_unchanged() -> None:
    text = "# Title\n\nno markers here\n"
    assert hooks.on_page_markdown(text, PAGE, {}, []) == text
