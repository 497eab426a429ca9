"""Softswitch aggregation rate on loopback: 4 sending processes, K = 64 lanes.

Each sender keeps a window of slots in flight (SwitchML-style: the next round of a
slot is sent when that slot's result arrives), so the switch is never flooded
past its socket buffer and every contribution is aggregated. The switch runs in
its own process (one core), configured directly on its pipeline: this bench
measures the data plane, not the control plane.

    .venv/bin/python -m bench.softswitch_bench [--seconds 5] [--window 128]

Writes bench/results/softswitch.json: one row per mode.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from pathlib import Path

from bench.senders import BASE_PORT, sender_main
from hysync import wire
from hysync.wire import Mode

RESULTS = Path(__file__).resolve().parent / "results"
JOB = 1
SENDERS = 4


def _switch_main(ready, stop, mode: int, quorum: int, stats) -> None:
    from softswitch import pipeline as sw
    from softswitch.tables import Entry, Replica
    from softswitch.udp_dataplane import UdpDataPlane

    p = sw.Pipeline()
    ip = wire.ip_to_int("127.0.0.1")
    for w in range(SENDERS):
        p.write_entry("INSERT", Entry(sw.MEMBERS, (JOB, w, ip, BASE_PORT + w),
                                      "HySyncIngress.admission.admit"))
        p.write_entry("INSERT", Entry(sw.REWRITE, (wire.member_rid(JOB, w),),
                                      "HySyncEgress.replication.rewrite_dst",
                                      (0, ip, BASE_PORT + w)))
    p.write_entry("INSERT", Entry(sw.JOBS, (JOB,), "HySyncIngress.admission.set_job",
                                  (0, 4096, SENDERS, JOB)))
    p.write_entry("INSERT", Entry(sw.MODES, (JOB, (0, 4095)), "HySyncIngress.sync_mode.set_mode",
                                  (mode, quorum), 1))
    p.write_group("INSERT", JOB, [Replica(1, wire.member_rid(JOB, w)) for w in range(SENDERS)])
    plane = UdpDataPlane(p, "127.0.0.1", 0)
    ready.put(plane.address[1])
    plane.start()
    stop.wait()
    plane.stop()
    stats.put(sum(p.counters["HySyncIngress.stats.contributions"].packets))


def run(mode: Mode, quorum: int, seconds: float, window: int) -> dict:
    ctx = mp.get_context("spawn")
    ready, stats, out = ctx.Queue(), ctx.Queue(), ctx.Queue()
    stop, start = ctx.Event(), ctx.Event()
    switch = ctx.Process(target=_switch_main, args=(ready, stop, mode, quorum, stats))
    switch.start()
    port = ready.get(timeout=30)
    senders = [ctx.Process(target=sender_main,
                           args=(w, JOB, port, (0, window), seconds, start, out))
               for w in range(SENDERS)]
    for s in senders:
        s.start()
    time.sleep(1.0)
    before = time.perf_counter()
    start.set()
    sent = sum(out.get(timeout=seconds + 60)[0] for _ in senders)
    elapsed = time.perf_counter() - before
    stop.set()
    aggregated = stats.get(timeout=30)
    for p in [*senders, switch]:
        p.join(timeout=10)
    rate = aggregated / elapsed
    return {"mode": mode.name.lower() + (f"({quorum})" if mode == Mode.PARTIAL else ""),
            "senders": SENDERS, "window": window, "seconds": round(elapsed, 2),
            "contributions_sent": sent, "contributions_aggregated": aggregated,
            "contributions_per_s": round(rate), "elements_per_s": round(rate * wire.LANES)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--window", type=int, default=128)
    args = parser.parse_args(argv)
    rows = []
    for mode, quorum in ((Mode.SYNC, 0), (Mode.PARTIAL, 3)):
        print(f"softswitch bench: {mode.name.lower()} for {args.seconds:.0f} s ...", flush=True)
        rows.append(run(mode, quorum, args.seconds, args.window))
        r = rows[-1]
        print(f"  {r['contributions_per_s']:>9,} contributions/s "
              f"{r['elements_per_s']:>12,} elements/s", flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "softswitch.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {RESULTS / 'softswitch.json'}")


if __name__ == "__main__":
    main()
