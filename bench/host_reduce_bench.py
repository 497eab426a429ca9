"""The host-level reduction of CPU tensors: gloo (what HySync runs) against shared memory.

R ranks on this machine, one process each, all-reduce a float32 tensor among themselves
the way a host's ranks do before the switch (hysync/host_group.py): onto the leader, and
its result back to every rank. The switch's part is left out (the leader's result is
the host's mean), so this is the host level alone:

- `gloo`: `HostGroup.allreduce` itself: a gloo reduce onto local rank 0, then two gloo
  broadcasts (what the leader applied, the result), over TCP on loopback;
- `shm`: a shared-memory segment of R rows: each rank copies its tensor into its row,
  a barrier, the leader adds the rows up in its tensor and writes the mean into row 0, a
  barrier, every other rank copies row 0 out, a barrier before the next call reuses the
  rows (multiprocessing's semaphore barriers).

Every call is checked against the exact mean. Medians of the leader's per-call times
after a warm-up, per size and rank count; the machine's load average is written too,
since the ranks share its cores with whatever else runs.

    .venv/bin/python -m bench.host_reduce_bench [--ranks 2 4] [--calls 60]

Writes bench/results/host_reduce.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import socket
import statistics
import time
from multiprocessing import shared_memory
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
SIZES = (1_024, 65_536, 1_048_576)  # float32 elements: a small bucket .. DDP's 4 MiB
WARMUP = 5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gloo_rank(rank: int, ranks: int, port: int, size: int, calls: int, out: mp.Queue) -> None:
    import torch
    import torch.distributed as dist

    from hysync.host_group import Applied, HostGroup, HostLayout

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, ranks, rank == 0,
                          timeout=datetime.timedelta(seconds=120))
    group = HostGroup(store, HostLayout(1, ranks, 0, rank), timeout=120)
    mine = torch.full((size,), float(rank + 1))
    expected = sum(range(1, ranks + 1)) / ranks
    times = []
    for _ in range(WARMUP + calls):
        tensor = mine.clone()
        start = time.perf_counter()
        group.allreduce(tensor, (lambda t: Applied(1.0, False)) if rank == 0 else None).wait()
        times.append(time.perf_counter() - start)
        assert float(tensor[0]) == expected and float(tensor[-1]) == expected
    group.close()
    if rank == 0:
        out.put(statistics.median(times[WARMUP:]))


def shm_rank(rank: int, ranks: int, name: str, barrier: mp.Barrier, size: int, calls: int,
             out: mp.Queue) -> None:
    import numpy as np
    import torch

    torch.set_num_threads(1)
    segment = shared_memory.SharedMemory(name=name)
    rows = torch.from_numpy(np.ndarray((ranks, size), dtype=np.float32, buffer=segment.buf))
    mine = torch.full((size,), float(rank + 1))
    expected = sum(range(1, ranks + 1)) / ranks
    times = []
    for _ in range(WARMUP + calls):
        tensor = mine.clone()
        start = time.perf_counter()
        rows[rank].copy_(tensor)
        barrier.wait()
        if rank == 0:
            tensor.copy_(rows[0])
            for other in range(1, ranks):
                tensor.add_(rows[other])
            tensor.div_(ranks)
            rows[0].copy_(tensor)
        barrier.wait()
        if rank != 0:
            tensor.copy_(rows[0])
        barrier.wait()  # nobody writes its row again before every rank has read row 0
        times.append(time.perf_counter() - start)
        assert float(tensor[0]) == expected and float(tensor[-1]) == expected
    del rows
    segment.close()
    if rank == 0:
        out.put(statistics.median(times[WARMUP:]))


def measure(path: str, ranks: int, size: int, calls: int) -> float:
    """The leader's median seconds per call."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    segment = None
    if path == "gloo":
        port = free_port()
        procs = [ctx.Process(target=gloo_rank, args=(r, ranks, port, size, calls, out))
                 for r in range(ranks)]
    else:
        segment = shared_memory.SharedMemory(create=True, size=ranks * size * 4)
        barrier = ctx.Barrier(ranks)
        procs = [ctx.Process(target=shm_rank, args=(r, ranks, segment.name, barrier, size,
                                                    calls, out)) for r in range(ranks)]
    try:
        for p in procs:
            p.start()
        median = out.get(timeout=600)
        for p in procs:
            p.join(timeout=60)
            if p.exitcode != 0:
                raise SystemExit(f"{path} rank failed (exit code {p.exitcode})")
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        if segment is not None:
            segment.close()
            segment.unlink()
    return median


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--calls", type=int, default=60)
    args = p.parse_args(argv)
    load_before = os.getloadavg()[0]
    rows = []
    for ranks in args.ranks:
        for size in SIZES:
            calls = args.calls if size < 1_000_000 else max(args.calls // 2, 5)
            row = {"ranks": ranks, "elements": size, "calls": calls}
            for path in ("gloo", "shm"):
                row[f"{path}_ms"] = round(measure(path, ranks, size, calls) * 1e3, 3)
            row["shm_speedup"] = round(row["gloo_ms"] / row["shm_ms"], 2)
            print(json.dumps(row), flush=True)
            rows.append(row)
    out = {"what": "host-level all-reduce of float32 CPU tensors (reduce onto local rank "
           "0, result back): median ms per call at the leader", "warmup": WARMUP,
           "cpus": os.cpu_count(), "load_average_before": load_before,
           "load_average_after": os.getloadavg()[0], "rows": rows}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "host_reduce.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
