"""bench.adaptive_bench keeps the rows of the scenarios it did not run again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.adaptive_bench import goals, kept_rows


def test_a_rerun_replaces_its_scenarios_rows_and_keeps_the_others(tmp_path: Path) -> None:
    path = tmp_path / "adaptive.json"
    old = [{"scenario": "homogeneous", "config": "sync", "final_accuracy": 0.96},
           {"scenario": "cnn", "config": "sync", "final_accuracy": 0.95},
           {"scenario": "cnn", "config": "gloo", "final_accuracy": 0.95}]
    path.write_text(json.dumps({"rows": old, "goals": []}))
    assert kept_rows(path, ["cnn"]) == old[:1]
    assert kept_rows(path, ["homogeneous", "cnn"]) == []
    assert kept_rows(tmp_path / "none.json", ["cnn"]) == []
    # The goals are judged on the merged rows: a scenario's own rows only.
    merged = kept_rows(path, ["cnn"]) + [
        {"scenario": "cnn", "config": "adaptive", "final_accuracy": 0.94}]
    assert goals(merged) == []  # no sync row for cnn any more: nothing to compare


@pytest.mark.parametrize("text", ["not json", '{"goals": []}', "[1, 2]"])
def test_a_file_that_is_not_this_bench_s_results_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "adaptive.json"
    path.write_text(text)
    with pytest.raises(SystemExit, match="is not a results file of this bench"):
        kept_rows(path, ["cnn"])
    assert path.read_text() == text
