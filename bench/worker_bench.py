"""Worker bench: quantize+packetize throughput, and HySync all-reduce next to gloo.

1. Quantize + packetize (in this process): float32 gradient + residual -> fixed point
   -> the key's PACKET_DTYPE batch, as `Transport` does before a call.
2. Four worker processes on loopback, each a `HySyncWorker` against the softswitch's
   UDP data plane (its own process), all-reduce 1M and 10M float32; in the same
   processes, over a gloo process group, `torch.distributed.all_reduce` of the same
   tensors. Times are the slowest worker's, from a common start (a gloo barrier).
3. One 1M sync call of worker 0 under cProfile: the top functions go to
   bench/results/worker_profile.txt.

    .venv/bin/python -m bench.worker_bench [--window 256] [--reps 3]

Writes bench/results/worker.json: [{"elements", "hysync_s", "gloo_s", "mode", ...}].
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import multiprocessing as mp
import pstats
import socket
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from hysync import p4names

RESULTS = Path(__file__).resolve().parent / "results"
WORKERS = 4
JOB = 1
SCALE = 2.0**20
SIZES = (1_000_000, 10_000_000)
TIMEOUT = 600


# ---------------------------------------------------------------- the switch
def switch_main(cmd: Any, out: Any) -> None:
    """The softswitch UDP data plane in its own process; installs the job it is sent."""
    from hysync import wire
    from softswitch.pipeline import JOBS, MEMBERS, REWRITE, Pipeline
    from softswitch.tables import Entry, Replica
    from softswitch.udp_dataplane import UdpDataPlane

    pipeline = Pipeline()
    dataplane = UdpDataPlane(pipeline, "127.0.0.1", 0).start()
    out.put(dataplane.address)
    while True:
        op, arg = cmd.get()
        if op == "install":
            members, slot_count = arg
            ip = wire.ip_to_int("127.0.0.1")
            for w, port in enumerate(members):
                pipeline.write_entry("INSERT", Entry(MEMBERS, (JOB, w, ip, port),
                                                     p4names.ADMISSION_ADMIT))
                pipeline.write_entry("INSERT", Entry(REWRITE, (wire.member_rid(JOB, w),),
                                                     p4names.REPLICATION_REWRITE_DST,
                                                     (0, ip, port)))
            pipeline.write_group("INSERT", JOB, [Replica(1, wire.member_rid(JOB, w))
                                                 for w in range(len(members))])
            pipeline.write_entry("INSERT", Entry(JOBS, (JOB,), p4names.ADMISSION_SET_JOB,
                                                 (0, slot_count, len(members), JOB)))
            pipeline.write_entry("INSERT", _modes(slot_count, 0, 0))
        elif op == "mode":
            mode, slot_count = arg
            pipeline.write_entry("MODIFY", _modes(slot_count, mode, 0))
        elif op == "stop":
            out.put(dataplane.packets_in)
            dataplane.stop()
            return
        out.put("ok")


def _modes(slot_count: int, mode: int, quorum: int) -> Any:
    from softswitch.pipeline import MODES
    from softswitch.tables import Entry

    return Entry(MODES, (JOB, (0, slot_count - 1)), p4names.SYNC_MODE_SET_MODE,
                 (mode, quorum), priority=1)


# ---------------------------------------------------------------- workers
def worker_main(rank: int, switch: tuple[str, int], window: int, gloo_port: int, plan: list,
                out: Any, go: Any, mode_set: Any) -> None:
    import torch
    import torch.distributed as dist

    from worker.api import HySyncWorker
    from worker.transport import TransportConfig

    config = TransportConfig(job_id=JOB, worker_id=rank, switch_host=switch[0],
                             switch_port=switch[1], bind_host="127.0.0.1", slot_base=0,
                             slot_count=window, members=WORKERS, dead_after=30.0)
    torch.set_num_threads(1)  # four workers and the switch share the machine's cores
    hw = HySyncWorker(config, scale=SCALE)
    out.put((rank, "bound", hw.address[1]))
    go.wait(TIMEOUT)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{gloo_port}", rank=rank,
                            world_size=WORKERS)
    tensors = {n: torch.from_numpy(np.random.default_rng((rank, n)).standard_normal(n)
                                   .astype(np.float32)) for n in SIZES}
    hw.allreduce(tensors[SIZES[0]][:100_000], key="warmup")  # every slot heard from
    for step, (kind, n, key) in enumerate(plan):
        if kind == "mode":
            dist.barrier()  # the test process switches the mode in between
            out.put((rank, "mode-ack", step))
            mode_set.wait(TIMEOUT)  # the switch latches the new mode at each slot's next round
            continue
        dist.barrier()
        start = time.perf_counter()
        if kind == "hysync":
            hw.allreduce(tensors[n], key=key)
            stats = hw.last_stats(key)
            extra = {"retransmits": stats.retransmits, "rounds": len(stats.results)}
        elif kind == "gloo":
            t = tensors[n].clone()
            dist.all_reduce(t)
            extra = {}
        elif kind == "profile":
            if rank == 0:
                profiler = cProfile.Profile()
                profiler.enable()
                hw.transport.allreduce(key, tensors[n].numpy())
                profiler.disable()
                text = io.StringIO()
                pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
                extra = {"profile": text.getvalue()}
            else:
                hw.transport.allreduce(key, tensors[n].numpy())
                extra = {}
        out.put((rank, "timing", (step, time.perf_counter() - start, extra)))
    dist.destroy_process_group()
    hw.close()
    out.put((rank, "bye", None))


# ---------------------------------------------------------------- the run
def quantize_packetize_mb_s(n: int = SIZES[1]) -> float:
    from worker.quantize import FixedPointQuantizer
    from worker.transport import Transport, TransportConfig

    config = TransportConfig(job_id=JOB, worker_id=0, switch_host="127.0.0.1",
                             bind_host="127.0.0.1", slot_count=256, members=WORKERS)
    tr = Transport(config, FixedPointQuantizer(SCALE, WORKERS))
    grad = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    reg = tr._register("q", n)  # noqa: SLF001 - the transport's own preparation step
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        tr._prepare(reg, grad)  # noqa: SLF001
        best = min(best, time.perf_counter() - start)
    tr.close()
    return n * 4 / best / 1e6


def free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(window: int, reps: int) -> tuple[list[dict], str, int]:
    from hysync.wire import Mode

    plan: list[tuple[str, int, str]] = []
    for n in SIZES:
        for _ in range(reps if n == SIZES[0] else 1):
            plan += [("hysync", n, f"sync-{n}"), ("gloo", n, "")]
    plan += [("profile", SIZES[0], f"sync-{SIZES[0]}")]
    plan += [("mode", 0, "async"), ("hysync", SIZES[0], "async"), ("gloo", SIZES[0], "")]
    ctx = mp.get_context("spawn")
    cmd, sw_out = ctx.Queue(), ctx.Queue()
    switch = ctx.Process(target=switch_main, args=(cmd, sw_out), daemon=True)
    switch.start()
    address = sw_out.get(timeout=60)
    out, go, mode_set = ctx.Queue(), ctx.Event(), ctx.Event()
    gloo_port = free_port(socket.SOCK_STREAM)
    procs = [ctx.Process(target=worker_main, daemon=True,
                         args=(r, address, window, gloo_port, plan, out, go, mode_set))
             for r in range(WORKERS)]
    for p in procs:
        p.start()
    ports = {}
    while len(ports) < WORKERS:
        rank, _, port = out.get(timeout=120)
        ports[rank] = port
    cmd.put(("install", ([ports[r] for r in range(WORKERS)], window)))
    sw_out.get(timeout=60)
    go.set()
    timings: dict[int, list[tuple[float, dict]]] = {}
    profile = ""
    done = 0
    mode_acks = 0
    while done < WORKERS:
        rank, kind, payload = out.get(timeout=TIMEOUT)
        if kind == "timing":
            step, seconds, extra = payload
            timings.setdefault(step, []).append((seconds, extra))
            profile = extra.get("profile", profile)
        elif kind == "mode-ack":
            mode_acks += 1
            if mode_acks == WORKERS:
                cmd.put(("mode", (int(Mode.ASYNC), window)))
                sw_out.get(timeout=60)
                mode_set.set()
        elif kind == "bye":
            done += 1
    cmd.put(("stop", None))
    packets = sw_out.get(timeout=60)
    for p in [*procs, switch]:
        p.join(timeout=30)
    rows = summarize(plan, timings, window)
    return rows, profile, packets


def summarize(plan: list, timings: dict, window: int) -> list[dict]:
    by_case: dict[tuple[str, int], dict[str, list[float]]] = {}
    mode = "sync"
    extras: dict[tuple[str, int], dict] = {}
    for step, (kind, n, key) in enumerate(plan):
        if kind == "mode":
            mode = key
            continue
        if kind == "profile":
            continue
        slowest = max(s for s, _ in timings[step])
        case = by_case.setdefault((mode, n), {"hysync": [], "gloo": []})
        case[kind].append(slowest)
        if kind == "hysync":
            extras[(mode, n)] = {"retransmits": sum(e.get("retransmits", 0)
                                                    for _, e in timings[step])}
    rows = []
    for (mode, n), case in by_case.items():
        rows.append({"elements": n, "hysync_s": round(statistics.median(case["hysync"]), 3),
                     "gloo_s": round(statistics.median(case["gloo"]), 4), "mode": mode,
                     "workers": WORKERS, "window": window, "reps": len(case["hysync"]),
                     "hysync_elements_per_s": round(n / statistics.median(case["hysync"])),
                     **extras[(mode, n)]})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=256, help="slots in flight per worker")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of the 1M case")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    mb_s = quantize_packetize_mb_s()
    print(f"quantize+packetize: {mb_s:,.0f} MB/s of float32 input", flush=True)
    print(f"all-reduce, {WORKERS} worker processes, window {args.window} ...", flush=True)
    rows, profile, packets = run(args.window, args.reps)
    rows.insert(0, {"elements": SIZES[1], "quantize_packetize_mb_s": round(mb_s),
                    "mode": "local", "hysync_s": None, "gloo_s": None})
    print(f"{'mode':>6} {'elements':>11} {'hysync s':>9} {'gloo s':>8} {'ratio':>7} "
          f"{'HySync elem/s':>14} {'retx':>6}")
    for r in rows[1:]:
        print(f"{r['mode']:>6} {r['elements']:>11,} {r['hysync_s']:>9.3f} {r['gloo_s']:>8.4f} "
              f"{r['hysync_s'] / r['gloo_s']:>7.0f} {r['hysync_elements_per_s']:>14,} "
              f"{r['retransmits']:>6}")
    print(f"softswitch handled {packets:,} datagrams; bench took "
          f"{time.perf_counter() - started:.0f} s")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "worker.json").write_text(json.dumps(rows, indent=2) + "\n")
    (RESULTS / "worker_profile.txt").write_text(
        f"cProfile of worker 0, one {SIZES[0]:,}-element sync Transport.allreduce with "
        f"{WORKERS} workers and window {args.window} (sorted by own time):\n\n{profile}")
    print(f"wrote {RESULTS / 'worker.json'} and {RESULTS / 'worker_profile.txt'}")


if __name__ == "__main__":
    main()
