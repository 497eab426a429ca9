"""The `hysync` torch.distributed backend under real `torchrun`, one launcher per emulated
host, against the softswitch and `hysync serve`: `dist.all_reduce` equals the exact sum
within quantization, DDP trains with no hook as well as over gloo, a trainer that builds
DDP itself (PyTorch Lightning) trains through it, and what the switch cannot sum is
refused in one line."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from hysync.backend import HySyncProcessGroup, Options
from hysync.controlplane.testbed.inventory import Inventory
from hysync.topologies.rendezvous import torchrun_rendezvous
from hysync.torch import AttachError

from .conftest import ROOT, kill_tree, rank_records, tree
from .test_torchrun import jobs_on, served  # noqa: F401 - the softswitch + serve fixture

pytestmark = pytest.mark.slow
WAIT = 300  # seconds: a generous deadline for two torchrun launchers on a busy machine


def run_ranks(inv: Inventory | None, script: Path, *args: str,
              env: dict[str, str] | None = None) -> list[str]:
    """`torchrun --nnodes 2 script` per host, as on two servers; returns each launcher's
    output after asserting that it succeeded."""
    with torchrun_rendezvous(2, timeout_s=WAIT) as rendezvous:
        return _run_ranks(inv, script, rendezvous, *args, env=env)


def _run_ranks(inv: Inventory | None, script: Path, rendezvous: list[str], *args: str,
               env: dict[str, str] | None) -> list[str]:
    procs = []
    for node in range(2):
        penv = dict(os.environ, HYSYNC_HOST=f"h{node + 1}", GLOO_SOCKET_IFNAME="lo",
                    PYTHONFAULTHANDLER="1", PYTHONUNBUFFERED="1",
                    OMP_NUM_THREADS="1", **(env or {}))
        if inv is not None:
            penv["HYSYNC_INVENTORY"] = str(inv.path)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", *rendezvous,
             "--nproc-per-node", "1", str(script), *args],
            cwd=ROOT, env=penv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + WAIT
    try:
        outputs = [p.communicate(timeout=max(deadline - time.monotonic(), 1))[0]
                   for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:  # every rank's stack (PYTHONFAULTHANDLER), then the launchers go
            for pid in tree(p.pid)[1:]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGABRT)
        time.sleep(2)
        for p in procs:
            kill_tree(p)
        tails = [p.communicate()[0][-6000:] for p in procs]  # what each launcher said
        pytest.fail(f"the ranks did not finish within {WAIT} s; their last output: {tails}")
    finally:
        for p in procs:
            kill_tree(p)
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out[-3000:]
    return outputs


def results(outputs: list[str]) -> list[dict]:
    lines = rank_records(outputs)
    assert sorted(r["rank"] for r in lines) == [0, 1], outputs
    return lines


# torch installs a Python backend as the whole group: the mixed forms give the same group
@pytest.mark.parametrize("backend", ["hysync", "cpu:gloo,cuda:hysync", "cpu:hysync,cuda:nccl"])
def test_all_reduce_is_the_exact_sum_within_quantization(
        served: tuple[Inventory, list[str]], backend: str) -> None:  # noqa: F811
    inv, events = served
    # examples/allreduce.py asserts every result against the exact sum itself
    for r in results(run_ranks(inv, ROOT / "examples" / "allreduce.py", "--backend", backend)):
        assert r["ok"] and r["group"] == backend, r
        assert 0 < r["max_error"] <= 0.1, r  # float16's rounding of sums near 8
    assert events[0].startswith("admitted job 1 'torchrun': 2 members, slots 0-31")
    assert events[-1] == "job 1 removed: released by its training script"
    assert jobs_on(inv) == []


def test_ddp_without_a_hook_trains_as_well_as_over_gloo(
        served: tuple[Inventory, list[str]]) -> None:  # noqa: F811
    inv, events = served
    script = ROOT / "examples" / "ddp_backend.py"
    # the inventory through pg_options (the script's --inventory), not the environment
    hysync = results(run_ranks(None, script, "--inventory", str(inv.path), "--steps", "150"))
    gloo = results(run_ranks(None, script, "--steps", "150", "--backend", "gloo"))
    assert events[0].startswith("admitted job 1")  # only the hysync run asked for a job
    # sync mode: every replica applied the same averaged gradients, so they are one model
    assert hysync[0]["accuracy"] == hysync[1]["accuracy"]
    assert hysync[0]["accuracy"] >= 0.9
    assert abs(hysync[0]["accuracy"] - gloo[0]["accuracy"]) <= 0.02, (hysync, gloo)
    assert events[-1] == "job 1 removed: released by its training script"


def test_lightning_builds_ddp_over_the_backend(
        served: tuple[Inventory, list[str]]) -> None:  # noqa: F811
    pytest.importorskip("pytorch_lightning", reason="PyTorch Lightning is not installed "
                        "(pip install pytorch-lightning)")
    inv, events = served
    out = results(run_ranks(inv, ROOT / "examples" / "lightning_ddp.py", "--steps", "150"))
    assert all(r["backend"] == "hysync" for r in out)
    assert out[0]["accuracy"] == out[1]["accuracy"] >= 0.9
    assert events[0].startswith("admitted job 1")


def test_the_other_collectives_go_to_gloo_and_never_deadlock(
        served: tuple[Inventory, list[str]], tmp_path: Path) -> None:  # noqa: F811
    """Every collective but the all-reduce reaches the inner gloo group with the right
    result, and a thousand rounds of broadcast, all_gather and barrier on temporaries
    finish: called through torch's Python ProcessGroup with the GIL held, gloo's enqueue
    and its worker thread (which takes the GIL to free a finished work's tensors) wait on
    each other, within a few hundred rounds on a busy machine."""
    inv, events = served
    script = tmp_path / "collectives.py"
    script.write_text(COLLECTIVES)
    for r in results(run_ranks(inv, script, "1000")):
        assert r["checked"] == ["broadcast", "all_gather", "all_gather_single", "gather",
                                "scatter", "reduce", "all_to_all_single", "send/recv"], r
        assert r["rounds"] == 1000, r
    assert events[-1] == "job 1 removed: released by its training script"


def test_what_the_switch_cannot_sum_is_refused_in_one_line(
        served: tuple[Inventory, list[str]], tmp_path: Path) -> None:  # noqa: F811
    inv, _ = served
    script = tmp_path / "refusals.py"
    script.write_text(REFUSALS)
    for r in results(run_ranks(inv, script)):
        assert r["errors"] == [
            "the hysync backend all-reduces SUM or AVG of float32, float16, bfloat16 or "
            "float64 tensors, got MAX of a float32 tensor; HYSYNC_EXACT_OPS=gloo sends the "
            "others to gloo",
            "the hysync backend all-reduces SUM or AVG of float32, float16, bfloat16 or "
            "float64 tensors, got PRODUCT of a float32 tensor; HYSYNC_EXACT_OPS=gloo sends "
            "the others to gloo",
            "the hysync backend all-reduces SUM or AVG of float32, float16, bfloat16 or "
            "float64 tensors, got SUM of a int64 tensor; HYSYNC_EXACT_OPS=gloo sends the "
            "others to gloo"], r
        assert r["after"] == 3.0  # the group still works after the refusals
    out = results(run_ranks(inv, script, env={"HYSYNC_EXACT_OPS": "gloo"}))
    for r in out:
        assert r["errors"] == [] and r["exact"] == [2.0, 2.0, 3], r


def test_the_job_runs_in_the_mode_the_environment_names(
        served: tuple[Inventory, list[str]], tmp_path: Path) -> None:  # noqa: F811
    inv, events = served
    script = tmp_path / "modes.py"
    script.write_text(MODES)
    for r in results(run_ranks(inv, script, env={"HYSYNC_MODE": "async"})):
        assert r["group"] == "HySyncProcessGroup" and r["modes"] == [2], r  # Mode.ASYNC
    assert events[-1] == "job 1 removed: released by its training script"


def test_options_come_from_pg_options_then_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HYSYNC_INVENTORY", "HYSYNC_MODE", "HYSYNC_POLICY", "HYSYNC_SCALE",
                 "HYSYNC_EXACT_OPS"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(AttachError, match="the hysync backend needs an inventory: set "
                                          "HYSYNC_INVENTORY or pass pg_options="):
        Options().resolved()
    monkeypatch.setenv("HYSYNC_INVENTORY", "rack.toml")
    assert Options().resolved() == Options(inventory="rack.toml", mode="sync", policy=None,
                                           scale=2.0**20, exact_ops="error")
    monkeypatch.setenv("HYSYNC_MODE", "async")
    monkeypatch.setenv("HYSYNC_POLICY", "adaptive")
    monkeypatch.setenv("HYSYNC_SCALE", "65536")
    monkeypatch.setenv("HYSYNC_EXACT_OPS", "gloo")
    assert Options(inventory="other.toml", mode="partial").resolved() == Options(
        inventory="other.toml", mode="partial", policy="adaptive", scale=65536.0,
        exact_ops="gloo")
    monkeypatch.setenv("HYSYNC_EXACT_OPS", "nccl")
    with pytest.raises(AttachError, match="exact_ops \\(HYSYNC_EXACT_OPS\\) is 'error' or "
                                          "'gloo', got 'nccl'"):
        Options().resolved()


def test_a_group_without_an_inventory_says_what_to_set(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HYSYNC_INVENTORY", raising=False)
    with pytest.raises(AttachError, match="needs an inventory: set HYSYNC_INVENTORY"):
        HySyncProcessGroup(dist.HashStore(), 0, 1, timedelta(seconds=10))
    with pytest.raises(TypeError, match="takes pg_options=hysync.backend.Options"):
        dist.init_process_group("hysync", store=dist.HashStore(), rank=0, world_size=1,
                                pg_options=object())
    assert not dist.is_initialized()


COLLECTIVES = '''
import json
import sys
import torch
import torch.distributed as dist
import hysync.backend  # noqa: F401

dist.init_process_group("hysync")
rank, world = dist.get_rank(), dist.get_world_size()
checked = []
value = torch.tensor([rank + 1.0])
dist.broadcast(value, src=1)
assert value.item() == 2.0
checked.append("broadcast")
gathered = [torch.zeros(1) for _ in range(world)]
dist.all_gather(gathered, torch.tensor([float(rank)]))
assert [g.item() for g in gathered] == [0.0, 1.0]
checked.append("all_gather")
flat = torch.zeros(world)
dist.all_gather_single(flat, torch.tensor([rank + 10.0]))
assert flat.tolist() == [10.0, 11.0]
checked.append("all_gather_single")
parts = [torch.zeros(1) for _ in range(world)] if rank == 0 else None
dist.gather(torch.tensor([rank * 3.0]), parts, dst=0)
assert rank != 0 or [p.item() for p in parts] == [0.0, 3.0]
checked.append("gather")
got = torch.zeros(1)
dist.scatter(got, [torch.tensor([5.0]), torch.tensor([6.0])] if rank == 0 else None, src=0)
assert got.item() == 5.0 + rank
checked.append("scatter")
total = torch.tensor([rank + 1.0])
dist.reduce(total, dst=0)  # a SUM through dist.reduce: gloo's, exact
assert rank != 0 or total.item() == 3.0
checked.append("reduce")
out = torch.zeros(world)
dist.all_to_all_single(out, torch.tensor([rank * 10.0, rank * 10.0 + 1]))
assert out.tolist() == [float(rank), 10.0 + rank]
checked.append("all_to_all_single")
if rank == 0:
    dist.send(torch.tensor([42.0]), dst=1)
else:
    box = torch.zeros(1)
    dist.recv(box, src=0)
    assert box.item() == 42.0
checked.append("send/recv")
rounds = 0
for _ in range(int(sys.argv[1])):
    temporary = torch.tensor([float(rank)])
    dist.broadcast(temporary, src=0)
    dist.all_gather([torch.zeros(1) for _ in range(world)], torch.tensor([float(rank)]))
    dist.barrier()
    rounds += 1
print(json.dumps({"rank": rank, "checked": checked, "rounds": rounds}), flush=True)
dist.destroy_process_group()
'''


REFUSALS = '''
import json
import torch
import torch.distributed as dist
import hysync.backend  # noqa: F401

dist.init_process_group("hysync")
rank = dist.get_rank()
errors, exact = [], []
for tensor, op in ((torch.tensor([rank + 1.0]), dist.ReduceOp.MAX),
                   (torch.tensor([rank + 1.0]), dist.ReduceOp.PRODUCT),
                   (torch.tensor([rank + 1]), dist.ReduceOp.SUM)):
    try:
        dist.all_reduce(tensor, op=op)
        exact.append(tensor.item())
    except ValueError as err:
        errors.append(str(err))
after = torch.tensor([rank + 1.0])
dist.all_reduce(after)
print(json.dumps({"rank": rank, "errors": errors, "exact": exact,
                  "after": round(after.item(), 3)}), flush=True)
dist.destroy_process_group()
'''


MODES = '''
import json
import torch
import torch.distributed as dist
import hysync.backend  # noqa: F401

dist.init_process_group("hysync")
group = dist.group.WORLD
tensor = torch.ones(1000)
dist.all_reduce(tensor)
# the modes the switch reported for the job's slots in its replies (-1: no reply yet)
modes = sorted({m for m in group.worker.last_stats().slot_modes if m >= 0})
print(json.dumps({"rank": dist.get_rank(), "group": type(group).__name__, "modes": modes}),
      flush=True)
dist.destroy_process_group()
'''
