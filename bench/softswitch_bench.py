"""Softswitch aggregation rate: 4 sending processes on loopback, K = 64 lanes.

Each sender keeps a window of slots in flight (bench/senders.py), so the switch is
loaded to capacity and every contribution is aggregated. The switch runs in its own
process (one core), configured directly on its pipeline (this bench measures the data
plane, not the control plane), and counts contributions itself over a steady-state
interval that excludes start-up. A second row per mode runs the pipeline model alone
on pre-encoded datagrams (no sockets): the ceiling the socket loop approaches.

    .venv/bin/python -m bench.softswitch_bench [--seconds 5] [--window 128]

Writes bench/results/softswitch.json: one row per (data plane, mode).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from pathlib import Path

import numpy as np

from bench.senders import BASE_PORT, sender_main
from hysync import p4names, wire
from hysync.wire import Mode

RESULTS = Path(__file__).resolve().parent / "results"
JOB = 1
SENDERS = 4
WARMUP_S = 1.0


def configured_pipeline(mode: int, quorum: int):
    """A pipeline with one job of SENDERS members on 127.0.0.1:BASE_PORT+w, slots 0-4095."""
    from softswitch import pipeline as sw
    from softswitch.tables import Entry, Replica

    p = sw.Pipeline()
    ip = wire.ip_to_int("127.0.0.1")
    for w in range(SENDERS):
        p.write_entry("INSERT", Entry(p4names.ADMISSION_MEMBERS, (JOB, w, ip, BASE_PORT + w),
                                      p4names.ADMISSION_ADMIT))
        p.write_entry("INSERT", Entry(p4names.REPLICATION_REWRITE, (wire.member_rid(JOB, w),),
                                      p4names.REPLICATION_REWRITE_DST,
                                      (0, ip, BASE_PORT + w)))
    p.write_entry("INSERT", Entry(p4names.ADMISSION_JOBS, (JOB,), p4names.ADMISSION_SET_JOB,
                                  (0, 4096, SENDERS, JOB)))
    p.write_entry("INSERT", Entry(p4names.SYNC_MODE_MODES, (JOB, (0, 4095)),
                                  p4names.SYNC_MODE_SET_MODE, (mode, quorum), 1))
    p.write_group("INSERT", JOB, [Replica(1, wire.member_rid(JOB, w)) for w in range(SENDERS)])
    return p


def _switch_main(ready, start, seconds: float, mode: int, quorum: int, stats) -> None:
    from softswitch.udp_dataplane import UdpDataPlane

    p = configured_pipeline(mode, quorum)
    plane = UdpDataPlane(p, "127.0.0.1", 0)
    ready.put(plane.address[1])
    plane.start()
    counter = p.counters[p4names.STATS_CONTRIBUTIONS].packets
    start.wait()
    time.sleep(WARMUP_S)  # senders open their windows
    c0, t0 = sum(counter), time.perf_counter()
    time.sleep(seconds - 2 * WARMUP_S)
    c1, t1 = sum(counter), time.perf_counter()
    plane.stop()
    stats.put((c1 - c0, t1 - t0))


def _row(plane: str, mode: int, quorum: int, window: int, seconds: float,
         contributions: int) -> dict:
    rate = contributions / seconds
    return {"dataplane": plane,
            "mode": Mode(mode).name.lower() + (f"({quorum})" if mode == Mode.PARTIAL else ""),
            "senders": SENDERS, "window": window, "seconds": round(seconds, 2),
            "contributions": contributions, "contributions_per_s": round(rate),
            "elements_per_s": round(rate * wire.LANES)}


def udp(mode: int, quorum: int, seconds: float, window: int) -> dict:
    ctx = mp.get_context("spawn")
    ready, stats, out, start = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Event()
    switch = ctx.Process(target=_switch_main, args=(ready, start, seconds, mode, quorum, stats))
    switch.start()
    port = ready.get(timeout=30)
    senders = [ctx.Process(target=sender_main, args=(w, JOB, port, (0, window), seconds, start,
                                                     out)) for w in range(SENDERS)]
    for s in senders:
        s.start()
    time.sleep(2.0)  # let the senders import and bind before the clock starts
    start.set()
    for _ in senders:
        out.get(timeout=seconds + 60)
    counted, elapsed = stats.get(timeout=30)
    for p in [*senders, switch]:
        p.join(timeout=10)
    return _row("udp-loopback", mode, quorum, window, elapsed, counted)


def pipeline_only(mode: int, quorum: int, rounds: int = 60, window: int = 128) -> dict:
    """The model alone on one core: pre-encoded contributions, no sockets."""
    p = configured_pipeline(mode, quorum)
    ip = wire.ip_to_int("127.0.0.1")
    batch = wire.empty_batch(window)
    batch["op"], batch["job_id"], batch["slot"] = wire.Op.CONTRIB, JOB, np.arange(window)
    stream = []
    for rnd in range(rounds):
        batch["round"] = rnd
        for w in range(SENDERS):
            batch["worker_id"] = w
            stream += [(BASE_PORT + w, d) for d in wire.encode_batch(batch)]
    process = p.process_datagram
    t0 = time.perf_counter()
    for port, datagram in stream:
        process(ip, port, datagram)
    elapsed = time.perf_counter() - t0
    counted = sum(p.counters[p4names.STATS_CONTRIBUTIONS].packets)
    return _row("pipeline-only", mode, quorum, window, elapsed, counted)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--window", type=int, default=128)
    args = parser.parse_args(argv)
    rows = []
    for mode, quorum in ((Mode.SYNC, 0), (Mode.PARTIAL, 3)):
        label = mode.name.lower()
        print(f"softswitch bench: {label}, UDP loopback for {args.seconds:.0f} s ...", flush=True)
        rows.append(udp(mode, quorum, args.seconds, args.window))
        rows.append(pipeline_only(mode, quorum, window=args.window))
        for r in rows[-2:]:
            print(f"  {r['dataplane']:>14}: {r['contributions_per_s']:>9,} contributions/s "
                  f"{r['elements_per_s']:>12,} elements/s", flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "softswitch.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {RESULTS / 'softswitch.json'}")


if __name__ == "__main__":
    main()
