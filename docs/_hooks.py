"""mkdocs hooks: the benchmark results, read from ``benchmarks/results/`` at build time.

Every file there (tables in ``.md``, plots in ``.png``) is added to the site under the same
path, so pages link to ``benchmarks/results/<name>`` and the site shows what the benchmark
scripts last wrote, never a copy made by hand. A page line ``<!-- results: NAME.md -->``
is replaced by that file (headings moved down two levels); ``<!-- results: all -->`` by
every results file in turn (``docs/results.md``). A marker naming a missing file fails
the build.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
MARKER = re.compile(r"^<!-- results: (?P<name>\S+) -->$", re.MULTILINE)


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


def _section(path: Path, heading: bool) -> str:
    """One results file, ready to inline: demoted headings, links from the site root."""
    name = path.relative_to(RESULTS).as_posix()
    body = _demote(path.read_text(), path.parent.relative_to(ROOT).as_posix())
    return f"## `{name}`\n\n{body}\n" if heading else f"{body}\n"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Replaces each results marker with the file (or files) it names."""

    def expand(m: re.Match[str]) -> str:
        name = m.group("name")
        if name == "all":
            return "\n".join(_section(p, True) for p in sorted(RESULTS.rglob("*.md")))
        path = RESULTS / name
        if not path.is_file():
            raise FileNotFoundError(f"{page.file.src_uri}: no results file {path}")
        return _section(path, False)

    return MARKER.sub(expand, markdown)
