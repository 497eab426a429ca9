"""The seed sweep the two-level simulations share: totals, failures with their replay
command, and a results file written as it goes."""

from __future__ import annotations

import json

from tests.sim.seed_sweep import sweep_seeds
from tests.sim.two_level_pipeline import sweep


def test_a_real_sweep_writes_its_totals(tmp_path):
    out = tmp_path / "deep" / "pipeline.json"
    assert sweep("python", 0, 3, out) == 0
    summary = json.loads(out.read_text())
    assert summary["seeds"] == 3 and summary["complete"] and summary["failing_seeds"] == 0
    assert summary["packets"] > 0 and summary["violations"] == 0


def test_failing_seeds_are_kept_with_their_replay_and_kind(tmp_path, capsys):
    def run(seed):
        problems = [f"agreement: seed {seed}", f"divisor: seed {seed}"] if seed % 2 else []
        return problems, {"packets": 10, "sim_seconds": 0.25}

    out = tmp_path / "sweep.json"
    failing = sweep_seeds(run, label="t", start=4, seeds=4, out=out, about={"target": "T"},
                          replay="replay --seed {seed}", every=3,
                          kind=lambda stats: "odd")
    assert failing == 2
    summary = json.loads(out.read_text())
    assert summary["target"] == "T" and summary["first_seed"] == 4
    assert summary["packets"] == 40 and summary["sim_seconds"] == 1.0
    assert summary["violations"] == 4
    assert summary["violations_by_invariant"] == {"agreement": 2, "divisor": 2}
    assert summary["failing_by_kind"] == {"odd": 2}
    assert [f["replay"] for f in summary["failures"]] == ["replay --seed 5", "replay --seed 7"]
    captured = capsys.readouterr()
    assert "t: 3/4 seeds, 1 failing" in captured.err
    assert "replay --seed 5 -> agreement: seed 5" in captured.out
