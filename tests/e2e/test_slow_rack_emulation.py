"""`make emulate SCENARIO=slow-rack`, short (as root): two racks of three hosts in network
namespaces behind a leaf softswitch each and a spine, the second rack computing 2x slower,
the adaptive policy at every level. Every rank reaches the scenario's accuracy, the
replicas end as one model, the spine's policy left the slow rack out (partial) at some
point, and the run leaves no namespace, link or process behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hysync.controlplane.testbed.netns import missing_netns_tools
from hysync.topologies.scenario import load_scenario

REPO = Path(__file__).resolve().parents[2]
SLOW_RACK = REPO / "topologies" / "scenarios" / "slow-rack.toml"
STEPS = 120  # the shipped scenario's 300 shortened; its lr and target kept
WAIT = 900  # seconds: a generous deadline for 3 switches and 6 ranks on a busy machine
CONFIG = "hysync-adaptive"
pytestmark = [pytest.mark.slow, pytest.mark.root]


def short_slow_rack(tmp_path: Path) -> Path:
    text = SLOW_RACK.read_text()
    assert "\nsteps = 300\n" in text
    path = tmp_path / "slow-rack.toml"
    path.write_text(text.replace("\nsteps = 300\n", f"\nsteps = {STEPS}\n"))
    return path


def namespaces(tag: str) -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.startswith(f"{tag}-")]


def processes_naming(text: str) -> list[str]:
    """The command lines of live processes that contain `text`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # ended meanwhile
        if text in argv:
            found.append(f"{proc.name}: {argv}")
    return found


def test_slow_rack_trains_through_leaves_and_a_spine_that_goes_partial(tmp_path: Path) -> None:
    reason = missing_netns_tools("the racks, leaves and spine are network namespaces")
    if reason:
        pytest.skip(reason)
    scenario_file = short_slow_rack(tmp_path)
    scenario = load_scenario(scenario_file)
    out = tmp_path / "run"
    run = subprocess.run([sys.executable, "-m", "hysync.topologies.run", str(scenario_file),
                          "--policy", "adaptive", "--out", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=WAIT)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    tag = summary["tag"]
    assert summary["racks"] == 2 and tag.startswith("hye"), summary
    logs = [json.loads((out / CONFIG / f"worker-{w}.json").read_text())
            for w in range(scenario.workers)]
    for log in logs:
        assert log["ended"] == "completed", log["ended"]
        assert log["final_accuracy"] >= scenario.target_accuracy, (log["worker"],
                                                                   log["final_accuracy"])
    # after the final averaging round, through both leaves and the spine: one model
    params = [torch.load(out / CONFIG / f"worker-{w}.pt") for w in range(scenario.workers)]
    for name, reference in params[0].items():
        for w, other in enumerate(params[1:], start=1):
            assert torch.equal(reference, other[name]), f"replica {w} differs in {name}"
    # the spine's policy took the slow rack out of its rounds at some point
    swaps = summary["swaps"][CONFIG]
    assert any(s["level"] == "spine" and s["action"] == "set_mode" and s["mode"] == "partial"
               for s in swaps), swaps
    decisions = [json.loads(line) for line in
                 (out / CONFIG / "policy.jsonl").read_text().splitlines()]
    assert {d.get("level") for d in decisions} >= {"spine", "leaf:leaf-1", "leaf:leaf-2"}
    assert "policy at spine: mode partial(1)" in run.stdout, run.stdout[-4000:]
    # nothing left: namespaces, root-namespace links, softswitches, workers
    assert namespaces(tag) == []
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f" {tag}m0" not in links and f" {tag}m2" not in links
    assert processes_naming(str(out)) == []
    assert processes_naming(f"@{tag}r") == []  # a softswitch's -i PORT@<tag>r<r>...
