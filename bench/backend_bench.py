"""The `hysync` process-group backend next to `attach`'s DDP hook and to gloo.

Two ranks under real `torchrun` on loopback, against the native softswitch (its own
process) and `hysync serve` (this process, no policy), each path in a run of its own:

- `allreduce`: one 1M-float32 all-reduce per call, `--calls` calls: through the backend
  (`dist.all_reduce`), through the hook path's worker (`HySyncWorker.allreduce`, in place,
  what the hook runs for a bucket), and over gloo;
- `ddp`: a DDP step (forward, backward with its gradient all-reduces, optimizer step) of
  an MLP of 1.1M parameters, `--steps` steps: no hook over the backend, `attach`'s hook
  over gloo, and plain gloo.

Medians of rank 0's per-call / per-step times after a warm-up. The backend's own cost
is what separates it from the worker's call: the C++ -> Python dispatch of the process
group and its Work and future.

    .venv/bin/python -m bench.backend_bench [--calls 50] [--steps 50]

Writes bench/results/backend.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.launcher_logs import read_back, records

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]
ELEMENTS = 1_000_000
WARMUP = 5
WAIT = 240


# ---------------------------------------------------------------- one rank
def rank_main(path: str, what: str, n: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    import hysync.backend
    import hysync.torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("hysync" if path == "backend" else "gloo")
    rank = dist.get_rank()
    inventory = os.environ["HYSYNC_INVENTORY"]
    times = []
    if what == "allreduce":
        tensor = torch.randn(ELEMENTS)
        worker = None
        if path == "hook":  # the hook's worker, admitted as attach admits it
            worker = hysync.torch.admit(dist.distributed_c10d._get_default_store(), rank,
                                        dist.get_world_size(), inventory).training
        for _ in range(WARMUP + n):
            dist.barrier()
            t0 = time.perf_counter()
            if worker is not None:
                worker.allreduce(tensor, key="t", in_place=True)
            else:
                dist.all_reduce(tensor, op=dist.ReduceOp.AVG)
            times.append(time.perf_counter() - t0)
    else:
        model = DistributedDataParallel(nn.Sequential(
            nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(),
            nn.Linear(512, 10)))
        if path == "hook":
            hysync.torch.attach(model, inventory=inventory)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(32, 512), torch.randint(0, 10, (32,))
        for _ in range(WARMUP + n):
            dist.barrier()
            t0 = time.perf_counter()
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - t0)
    if rank == 0:
        print(json.dumps({"median_ms": round(statistics.median(times[WARMUP:]) * 1e3, 3)}),
              flush=True)
    dist.barrier()
    # attach's job (no steps() here) and the worker of the `allreduce` run go with the
    # process; the serve removes them when rank 0's connection closes
    if path == "backend":
        dist.destroy_process_group()
    del hysync


# ---------------------------------------------------------------- the harness
def run_path(inventory: Path, path: str, what: str, n: int) -> float:
    from hysync.topologies.rendezvous import torchrun_rendezvous

    with torchrun_rendezvous(2, timeout_s=WAIT) as rendezvous:
        return _run_path(inventory, rendezvous, path, what, n)


def _run_path(inventory: Path, rendezvous: list[str], path: str, what: str, n: int) -> float:
    procs, logs = [], []
    for node in range(2):
        env = dict(os.environ, HYSYNC_HOST=f"h{node + 1}", HYSYNC_INVENTORY=str(inventory),
                   GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        # a file, not a pipe: nobody reads the output before the launcher ends
        logs.append(tempfile.TemporaryFile("w+"))  # noqa: SIM115 - closed once read, below
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", *rendezvous,
             "--nproc-per-node", "1", "-m", "bench.backend_bench",
             "--rank", path, what, str(n)],
            cwd=ROOT, env=env, stdout=logs[-1], stderr=subprocess.STDOUT, text=True,
            start_new_session=True))
    deadline = time.monotonic() + WAIT
    try:
        # One launcher that fails leaves the other waiting in its rendezvous: stop both.
        while any(p.poll() is None for p in procs) and not any(p.returncode for p in procs):
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)  # torchrun and its worker: their session
            p.wait()
    outputs = read_back(logs)
    for p, out in zip(procs, outputs, strict=True):
        if p.returncode:
            raise SystemExit(f"{path} {what} failed (rc {p.returncode}):\n{out[-3000:]}")
    # rank 0's line (ranks go in the order the launchers joined)
    return records(outputs, "median_ms")[0]["median_ms"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--rank", nargs=3, metavar=("PATH", "WHAT", "N"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank:
        rank_main(args.rank[0], args.rank[1], int(args.rank[2]))
        return
    from hysync.controlplane.serve.server import Server
    from hysync.controlplane.testbed.deploy import deploy
    from hysync.controlplane.testbed.inventory import Inventory
    from hysync.topologies.runner import start_softswitch

    with tempfile.TemporaryDirectory() as tmp:
        # the softswitch and serve bind ports the kernel chose, and say which
        switch, grpc_addr, udp_port = start_softswitch(Path(tmp) / "softswitch.log")
        inventory = Path(tmp) / "loopback.toml"
        # loopback.toml with its ports here and a second host: each rank a host of its own
        text = (ROOT / "examples" / "loopback.toml").read_text()
        text = text.replace('"127.0.0.1:9559"', f'"{grpc_addr}"').replace(
            "data_udp_port = 48620", f"data_udp_port = {udp_port}").replace(
            '"127.0.0.1:9600"', '"127.0.0.1:0"')
        text += ('\n[[hosts]]\nname = "h2"\ninterface = "lo"\nipv4 = "127.0.0.1"\n'
                 'mac = "02:00:00:00:01:02"\nswitch_port = 2\n')
        inventory.write_text(text)
        try:
            inv = Inventory.load(inventory)
            deploy(inv)
            server = Server(inv, policy=None, say=lambda _: None).start()
            # the ranks read serve's address from the inventory: the one it bound
            inventory.write_text(text.replace('"127.0.0.1:0"', f'"{server.address}"'))
            try:
                result: dict[str, dict[str, float]] = {}
                for what, n in (("allreduce", args.calls), ("ddp", args.steps)):
                    result[what] = {path: run_path(inventory, path, what, n)
                                    for path in ("backend", "hook", "gloo")}
                    print(what, result[what], flush=True)
            finally:
                server.close()
        finally:
            switch.terminate()
            switch.wait(timeout=10)
    out = {"elements": ELEMENTS, "calls": args.calls, "steps": args.steps, "ranks": 2,
           "median_ms": result, "cpus": os.cpu_count()}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "backend.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
