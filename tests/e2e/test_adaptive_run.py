"""End to end, no root: training under the adaptive policy on the embedded default.

A worker is a heavy straggler for the first seconds and then recovers. The run must
show the policy at work on the real switch - detection, a mode change, the straggler
excluded and readmitted once it is healthy - and the model averaging through the
switch: the readmitted replica resynchronized by a background round, and every replica
the same model after the final round.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

STRAGGLER = 3
SCENARIO = f"""name = "adaptive-e2e"
workers = 4
steps = 1000
compute_ms = 30.0
target_accuracy = 0.9
[[straggler]]
worker = {STRAGGLER}
pattern = "recovering"
factor = 6.0
until_s = 22.0
"""


def test_adaptive_policy_excludes_and_readmits_a_straggler_while_training(tmp_path):
    scenario = tmp_path / "adaptive-e2e.toml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "hysync.topologies.demo",
                           "--scenario", str(scenario),
                           "--out", str(out), "--skip-baseline", "--policy", "adaptive"],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    config = out / "hysync-adaptive"

    decisions = [json.loads(line) for line in (config / "policy.jsonl").read_text().splitlines()]
    acted = [d for d in decisions if d["action"] != "start"]
    assert all(d["applied"] and d["reason"] for d in acted), acted
    membership = [(d["action"], d["worker"]) for d in acted if d["action"] != "set_mode"]
    assert ("exclude", STRAGGLER) in membership, f"the straggler was not excluded: {acted}"
    excluded_at = membership.index(("exclude", STRAGGLER))
    assert ("readmit", STRAGGLER) in membership[excluded_at:], (
        f"the recovered straggler was not readmitted by the policy: {acted}")
    assert {w for _, w in membership} == {STRAGGLER}, f"a healthy worker was excluded: {acted}"
    assert any(d["action"] == "set_mode" and d["mode"] != "sync" for d in acted)

    logs = [json.loads((config / f"worker-{w}.json").read_text()) for w in range(4)]
    for log in logs:
        assert log["ended"] == "completed", log["ended"]
        first = next(s["accuracy"] for s in log["steps"] if s["accuracy"] is not None)
        assert log["final_accuracy"] > first + 0.3, "training did not improve the model"
    # The excluded replica missed results: a background averaging round resynchronized it.
    rounds = logs[STRAGGLER]["extra"]["averaging"]
    assert any(not r["healthy"] for r in rounds if not r["final"]), rounds
    # Every replica made the same averaging rounds (they pair up at the switch) ...
    assert len({len(log["extra"]["averaging"]) for log in logs}) == 1
    # ... and the final one made them one model, bit for bit.
    params = [torch.load(config / f"worker-{w}.pt") for w in range(4)]
    for name, reference in params[0].items():
        for other in params[1:]:
            assert torch.equal(reference, other[name]), f"replicas differ after averaging: {name}"
