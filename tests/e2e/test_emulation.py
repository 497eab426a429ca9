"""End to end: the README demo, and Mininet runs over the softswitch and BMv2 (as root)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hysync.topologies import run as run_cli
from hysync.topologies.mininet_harness import HarnessError, check_mininet
from hysync.topologies.switches import Bmv2Node
from tests.p4tools import skip_unless_available

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _scenario(tmp_path: Path, workers: int, steps: int, schedule: str) -> Path:
    path = tmp_path / "e2e.toml"
    path.write_text(f'name = "e2e"\nworkers = {workers}\nsteps = {steps}\ncompute_ms = 10.0\n'
                    'target_accuracy = 0.8\n[[straggler]]\nworker = 2\npattern = "constant"\n'
                    f'factor = 2.0\n{schedule}')
    return path


SWAP_AND_BACK = ('[[schedule]]\nat_step = 10\nmode = "partial"\nquorum = 2\n'
                 '[[schedule]]\nat_step = 40\nmode = "sync"\n')
# BMv2 is far slower than the workers' compute on a busy machine; partial mode there lets a
# fast worker carry its gradients for many calls and apply the pile late (docs/protocol.md,
# "A switch slower than the workers"), so the BMv2 run swaps to async, which counts every
# contribution as it arrives.
SWAP_TO_ASYNC_AND_BACK = ('[[schedule]]\nat_step = 10\nmode = "async"\n'
                          '[[schedule]]\nat_step = 40\nmode = "sync"\n')


def _check_run(out: Path, config: str, workers: int, swapped_to: str = "partial") -> None:
    logs = [json.loads((out / config / f"worker-{w}.json").read_text()) for w in range(workers)]
    for log in logs:
        assert log["ended"] == "completed", log["ended"]
        first = next(s["accuracy"] for s in log["steps"] if s["accuracy"] is not None)
        assert log["final_accuracy"] > first + 0.3, "training did not improve the model"
    modes = {s["mode"] for s in logs[0]["steps"]}
    assert {"sync", swapped_to} <= modes, f"the swap did not show in the results: {modes}"
    # Before the final averaging the replicas that trained to the end of the job clock are
    # the same model up to drift (momentum applied to rounds a straggler combined in one
    # step): close in accuracy. A fast replica in partial mode behind a switch slower than
    # its compute (BMv2 on a busy machine) may run to its local-step bound first, with
    # the job's later rounds not yet applied: the final averaging catches it up (below).
    stayed = [log for log in logs if "stopped_at_step_bound" not in log["extra"]]
    assert len(stayed) >= 2, [log["extra"] for log in logs]
    before = [log["extra"]["accuracy_before_averaging"] for log in stayed]
    assert max(before) - min(before) < 0.1, f"replicas drifted apart: {before}"
    # After the final averaging round they are one model.
    params = [torch.load(out / config / f"worker-{w}.pt") for w in range(workers)]
    for name, reference in params[0].items():
        for other in params[1:]:
            assert torch.allclose(reference, other[name], atol=1e-4), f"replicas differ: {name}"
    summary = json.loads((out / "summary.json").read_text())
    assert [s["mode"] for s in summary["swaps"][config]] == [swapped_to, "sync"]


def test_demo_runs_end_to_end_without_root(tmp_path):
    scenario = _scenario(tmp_path, 3, 60, SWAP_AND_BACK)
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "hysync.topologies.demo",
                           "--scenario", str(scenario),
                           "--out", str(out), "--skip-baseline", "--policy", "manual-schedule"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # not a terminal: plain progress lines, counted on the job clock
    assert "[hysync-sync-then-partial]" in proc.stdout and "job clock" in proc.stdout
    written = json.loads((out / "summary.json").read_text())
    outcome = written["outcome"]  # one sentence, first in the summary
    assert outcome.startswith("hysync-sync-then-partial ") and "held-out accuracy" in outcome
    summary = proc.stdout[proc.stdout.index(outcome):]
    for shown in ("local steps/s", "waiting for the switch", "plot:", "logs:"):
        assert shown in summary, shown
    # every step's time split into compute, waiting for the switch, communication
    split = written["configs"][0]
    assert split["compute_ms"] > 10.0  # the scenario emulates 10 ms, more on the straggler
    assert split["wait_ms"] is not None and split["wait_ms"] >= 0 and split["comm_ms"] > 0
    assert (out / "plot.png").stat().st_size > 10_000
    _check_run(out, "hysync-sync-then-partial", 3)


def _mininet_or_skip() -> None:
    try:
        check_mininet()
    except HarnessError as err:
        pytest.skip(str(err))


@pytest.mark.root
def test_mininet_run_over_the_softswitch_with_a_mode_swap(tmp_path):
    _mininet_or_skip()
    scenario = _scenario(tmp_path, 3, 60, SWAP_AND_BACK)
    assert run_cli.main([str(scenario), "--switch", "softswitch", "--out",
                         str(tmp_path / "run")]) == 0
    _check_run(tmp_path / "run", "hysync-manual-schedule", 3)


@pytest.mark.root
def test_mininet_run_over_bmv2_with_a_mode_swap(tmp_path):
    try:
        check_mininet()
    except HarnessError as err:
        skip_unless_available(str(err))
    skip_unless_available(Bmv2Node.unavailable())
    subprocess.run(["make", "-s", "p4"], cwd=REPO, check=True, capture_output=True)
    scenario = _scenario(tmp_path, 3, 60, SWAP_TO_ASYNC_AND_BACK)
    assert run_cli.main([str(scenario), "--switch", "bmv2", "--out",
                         str(tmp_path / "run")]) == 0
    _check_run(tmp_path / "run", "hysync-manual-schedule", 3, swapped_to="async")


def test_bad_scenario_file_is_refused_with_the_reason(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nworkers = 99\nsteps = 5\n')
    assert run_cli.main([str(bad)]) == 2
    assert "'workers' = 99 is out of range" in capsys.readouterr().err


def test_unknown_switch_is_refused_naming_the_choices(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        run_cli.main([str(tmp_path / "x.toml"), "--switch", "ovs"])
    assert exit_.value.code == 2
    assert "invalid choice: 'ovs'" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() == 0, reason="checks the message a non-root user gets")
def test_mininet_without_root_says_so(tmp_path, capsys):
    scenario = _scenario(tmp_path, 3, 5, "")
    assert run_cli.main([str(scenario)]) == 2
    assert "need root" in capsys.readouterr().err
