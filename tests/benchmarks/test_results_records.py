"""Every benchmark result says where and when it was measured (benchmarks/harness.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks import harness

RESULTS = sorted((Path(__file__).resolve().parents[2] / "benchmarks" / "results").glob("*.json"))
SHA = re.compile(r"[0-9a-f]{40}")


def test_write_results_records_commit_date_machine_and_load(tmp_path):
    harness.write_results({"rows": [1]}, "# t\n", tmp_path, "t")
    got = json.loads((tmp_path / "t.json").read_text())
    at = got["measured_at"]
    assert got["rows"] == [1] and SHA.fullmatch(at["commit"]) and isinstance(at["changed"], list)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", at["date"])
    assert at["machine"]["cpus"] >= 1 and at["machine"]["cpu"] and at["machine"]["python"]
    assert len(at["load"]) == 3 and all(x >= 0 for x in at["load"])


def test_write_results_keeps_a_record_the_run_made_itself(tmp_path):
    mine = {"commit": "c", "date": "d", "machine": {}, "load": [0, 0, 0]}
    harness.write_results({"measured_at": mine}, "", tmp_path, "t")
    assert json.loads((tmp_path / "t.json").read_text())["measured_at"] == mine


@pytest.mark.parametrize("path", RESULTS, ids=[p.name for p in RESULTS])
def test_every_result_file_says_where_and_when_it_was_measured(path):
    """Written by the harness (``measured_at``), or older than it: then what git history
    proves (``provenance_from_git``), marked as such."""
    rec = json.loads(path.read_text())
    if "measured_at" in rec:
        assert {"commit", "date", "machine", "load"} <= set(rec["measured_at"]), path.name
    else:
        prov = rec["provenance_from_git"]
        assert SHA.fullmatch(prov["file_added_in"]) and SHA.fullmatch(prov["last_written_in"])
        assert "from git history" in prov["note"]
