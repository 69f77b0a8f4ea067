"""mkdocs hooks: the benchmark results, read from ``benchmarks/results/`` at build time.

Every file there (tables in ``.md``, plots in ``.png``) is added to the site under the same
path, so pages link to ``benchmarks/results/<name>`` and the site shows what the benchmark
scripts last wrote, never a copy made by hand. ``docs/results.md`` holds the marker
``<!-- results: all -->``, replaced by every results table in turn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
MARKER = "<!-- results: all -->"


def on_files(files: Files, config: Any) -> Files:
    """Adds every plot of ``benchmarks/results/`` to the site (tables are inlined below)."""
    for path in sorted(RESULTS.rglob("*.png")):
        uri = path.relative_to(ROOT).as_posix()
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def _demote(markdown: str, folder: str) -> str:
    """One results file as a section: headings two levels down, relative links re-rooted."""
    out = []
    for line in markdown.splitlines():
        if line.startswith("#"):
            line = "##" + line
        out.append(line.replace("](", f"]({folder}/"))
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Replaces the results marker with every ``benchmarks/results/*.md`` table."""
    if MARKER not in markdown:
        return markdown
    parts = []
    for path in sorted(RESULTS.rglob("*.md")):
        name = path.relative_to(RESULTS).as_posix()
        folder = path.parent.relative_to(ROOT).as_posix()
        parts.append(f"## `{name}`\n\n{_demote(path.read_text(), folder)}\n")
    return markdown.replace(MARKER, "\n".join(parts))
