"""The ```python blocks of the README and the documentation pages, as a reader finds them.

A page's blocks run in order in one namespace, in a fresh Python process whose working
directory is an empty temporary folder, so a block must define or import every name it uses
and set ``XLA_FLAGS`` itself when it needs several CPU devices. A page that needs an
optional suite (RLlib, torch, Brax, ...) says so with the comment
``<!-- docs-test: integration -->``; its test then carries ``pytest.mark.integration``.
A block that is not meant to run is not a python block (```text or ```console).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INTEGRATION = "<!-- docs-test: integration -->"
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclass(frozen=True)
class Block:
    """One fenced code block: its language, its first line (1-based) and its code."""

    lang: str
    line: int
    code: str


def pages() -> list[Path]:
    """README.md and every Markdown page under docs/, in a stable order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(text: str) -> list[Block]:
    """Every fenced block of a Markdown text, list indentation removed."""
    out: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = m.group("indent"), m.group("fence")
        lang = m.group("info").strip().split(" ")[0] if m.group("info").strip() else ""
        start, body = i + 1, []
        i += 1
        while i < len(lines) and lines[i].strip() != fence:
            line = lines[i]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            i += 1
        out.append(Block(lang, start + 1, "\n".join(body) + "\n"))
        i += 1
    return out


def python_blocks(path: Path) -> list[Block]:
    """The page's ```python blocks."""
    return [b for b in blocks(path.read_text()) if b.lang in ("python", "py")]


def is_integration(path: Path) -> bool:
    """The page's blocks need an optional suite (the integration marker comment)."""
    return INTEGRATION in path.read_text()
