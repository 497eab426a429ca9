"""bench/side_by_side.py: metrics picked out of a bench's JSON, and each tree's results
folder put back as it was after a run."""

from __future__ import annotations

import json
import sys

import pytest

from bench import side_by_side


def test_a_metric_is_the_field_of_the_first_object_its_selector_matches():
    data = [{"case": "machine"},
            {"case": "allreduce", "elements": 1000000, "hysync_s": 0.2},
            {"case": "allreduce", "elements": 10000000, "hysync_s": 2.5,
             "cpu": [1.0, 2.0, 3.0]}]
    name, selector, field = side_by_side.parse_metric(
        "ten=case=allreduce,elements=10000000:hysync_s")
    assert (name, selector, field) == ("ten", {"case": "allreduce", "elements": "10000000"},
                                       "hysync_s")
    assert side_by_side.find(data, selector, field) == 2.5
    assert side_by_side.find(data, selector, "cpu") == 2.0  # a list counts as its mean
    assert side_by_side.find({"rows": data}, {"elements": "5"}, "hysync_s") is None


def test_a_metric_without_a_field_is_refused_with_an_example():
    with pytest.raises(ValueError, match="NAME=key=value"):
        side_by_side.parse_metric("no_field")


def test_a_run_leaves_the_trees_results_as_they_were(tmp_path):
    repo = tmp_path / "repo"
    results = repo / "bench" / "results"
    results.mkdir(parents=True)
    (results / "kept.json").write_text('{"old": 1}')
    venv = repo / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    bench = ("import json, pathlib; p = pathlib.Path('bench/results'); "
             "(p / 'kept.json').write_text(json.dumps({'x': 7})); "
             "(p / 'new.png').write_text('plot')")
    data, _, rc, _ = side_by_side.run_once(repo, ["-c", bench],
                                           side_by_side.Path("bench/results/kept.json"),
                                           nice=0, timeout=60)
    assert rc == 0 and data == {"x": 7}
    assert json.loads((results / "kept.json").read_text()) == {"old": 1}
    assert not (results / "new.png").exists()
