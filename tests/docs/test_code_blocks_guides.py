"""The ```python blocks of docs/guides/ and docs/migration/ run as written (see
tests/docs/test_code_blocks.py, which runs the other pages)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.test_code_blocks import page_params, run_page


@pytest.mark.parametrize("path", page_params("guides"))
def test_guide_blocks_run(path: Path, tmp_path: Path) -> None:
    run_page(path, tmp_path)
