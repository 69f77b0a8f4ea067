"""Every ```python block of the README and of docs/ runs as written (see tests/docs/blocks.py).

This file runs the README and the pages outside the folders of :data:`GROUPS`: the quick tier.
``test_code_blocks_guides.py`` runs ``docs/guides/`` and ``docs/migration/``, and
``test_code_blocks_concepts.py`` runs ``docs/concepts/``; both are in the integration tier
(tests/tiers.py), one process per page, and separate files so that pytest-xdist's
``--dist loadfile`` can give them to different workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.blocks import ROOT, blocks, is_integration, pages, python_blocks

# Runs one page's blocks in order in one namespace; a failure names the page and line.
_RUNNER = """
import json, sys, traceback
page, blocks = json.loads(sys.stdin.read())
namespace = {"__name__": "__main__"}
for line, code in blocks:
    try:
        exec(compile(code, f"{page}:{line}", "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        print(f"FAILED: the block at {page}:{line}", file=sys.stderr)
        sys.exit(1)
"""


#: Page groups run by their own test files: the folders each covers. Every other page is "rest".
GROUPS: dict[str, tuple[str, ...]] = {
    "guides": ("docs/guides/", "docs/migration/"),
    "concepts": ("docs/concepts/",),
}


def page_group(rel: str) -> str:
    """The group of the page at the root-relative path ``rel``: a key of GROUPS or "rest"."""
    return next((name for name, folders in GROUPS.items() if rel.startswith(folders)), "rest")


def page_params(group: str) -> list:
    """One pytest param per page with python blocks in ``group`` (see :func:`page_group`)."""
    if group not in (*GROUPS, "rest"):
        raise ValueError(f"unknown page group {group!r}; known: {[*GROUPS, 'rest']}")
    params = []
    for path in pages():
        if page_group(path.relative_to(ROOT).as_posix()) != group:
            continue
        found = python_blocks(path)
        if not found:
            continue
        marks = [pytest.mark.integration] if is_integration(path) else []
        rel = path.relative_to(ROOT).as_posix()
        params.append(pytest.param(path, id=rel, marks=marks))
    return params


def run_page(path: Path, tmp_path: Path) -> None:
    """Runs the page's blocks in order in one fresh process; fails naming page and line."""
    rel = path.relative_to(ROOT).as_posix()
    payload = json.dumps([rel, [[b.line, b.code] for b in python_blocks(path)]])
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # blocks set their own
    env["PYTHONPATH"] = str(ROOT)
    env["JAXSAMPLER_QUIET"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER],
        input=payload,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, f"{rel}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


@pytest.mark.parametrize("path", page_params("rest"))
def test_page_blocks_run(path: Path, tmp_path: Path) -> None:
    run_page(path, tmp_path)


def test_every_group_has_pages_and_the_readme_runs_here() -> None:
    """The split is total and none of its files is empty: a page is in exactly one group."""
    rels = [p.relative_to(ROOT).as_posix() for p in pages() if python_blocks(p)]
    groups = {rel: page_group(rel) for rel in rels}
    assert groups["README.md"] == "rest"
    assert groups["docs/concepts/buffers.md"] == "concepts"
    assert groups["docs/migration/from-rllib.md"] == "guides"
    assert set(groups.values()) == {*GROUPS, "rest"}
    counted = sum(len(page_params(g)) for g in (*GROUPS, "rest"))
    assert counted == len(rels)


def test_blocks_are_found() -> None:
    """The extractor sees the README's quick start and keeps unlabelled fences out."""
    readme = python_blocks(ROOT / "README.md")
    assert readme and "js.make(" in readme[0].code
    text = (
        "a\n\n```python\nx = 1\n```\n\n- item\n\n  ```python\n  y = x\n  ```\n\n```text\nz\n```\n"
    )
    found = blocks(text)
    assert [(b.lang, b.code) for b in found] == [
        ("python", "x = 1\n"),
        ("python", "y = x\n"),
        ("text", "z\n"),
    ]


def test_no_unlabelled_fences() -> None:
    """Every fence names its language, so a Python block cannot hide as an unlabelled one."""
    bad = [
        f"{p.relative_to(ROOT)}:{b.line}"
        for p in pages()
        for b in blocks(p.read_text())
        if not b.lang
    ]
    assert not bad, f"fences without a language: {bad}"


def test_readme_results_match_the_results_file() -> None:
    """Each figure of the README's results table is in benchmarks/results/throughput.md."""
    readme = (ROOT / "README.md").read_text()
    results = (ROOT / "benchmarks" / "results" / "throughput.md").read_text()
    section = readme[readme.index("## Results") : readme.index("## Documentation")]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "W=1" not in line]
    cells = [c.strip() for row in rows for c in row.strip("|").split("|")[1:]]
    figures = [c for c in cells if c and c != "—"]
    assert len(figures) >= 12
    missing = [f for f in figures if f"| {f} |" not in results and f"| {f}\n" not in results]
    assert not missing, f"README figures not in throughput.md: {missing}"
