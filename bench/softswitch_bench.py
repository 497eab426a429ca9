"""Softswitch aggregation rate on UDP loopback, against the machine's zero-work limit.

Every run in one process, one after the other, with the same senders: the native load
generator (hysync._core.bench.LoadGenerator: a thread and socket per worker, batched
sends, one contribution in flight per slot of a window), so the switch, not the
senders, is what is measured. Rows:

* reflector — `python -m hysync.softswitch.reflect`'s core: every datagram straight back.
  The limit no switch on this machine can beat (datagrams/s each way);
* native — the compiled data plane, sync and partial(3), 4 and 8 workers, 1/2/4
  data-plane threads; its datagrams in per second as a share of the best reflector rate
  for the same workers (in partial(q) the late contributions are answered too);
* python — the reference model's UDP data plane (one thread), for comparison.

Each configuration runs --repeat times, interleaved with the others; the median is kept.
The switch counts contributions itself (its counters) over a steady-state interval
after a warm-up. Beside each rate, the CPU time this process (server threads and
senders together) spent per datagram in over the same interval: what the rate costs,
which other load on the machine moves far less than the rate itself. The machine's
load is recorded beside the numbers: on a shared machine, rerun on a quiet one with
the same command:

    .venv/bin/python -m bench.softswitch_bench [--seconds 3] [--window 128] [--repeat 3]

Writes bench/results/softswitch.json and bench/results/softswitch.png.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from hysync import _core, p4names, wire
from hysync.softswitch.native import NativePipeline, NativeUdpDataPlane
from hysync.softswitch.pipeline import Pipeline
from hysync.softswitch.tables import Entry, Replica
from hysync.softswitch.udp_dataplane import UdpDataPlane
from hysync.wire import Mode

RESULTS = Path(__file__).resolve().parent / "results"
JOB = 1
BASE_PORT = 47100
SENDERS = 4  # bmv2_bench's loopback row
WARMUP_S = 0.7
RTO_MS = 500.0  # nothing is lost on loopback but to full buffers: a short RTO only adds load
MODES = ((Mode.SYNC, 0), (Mode.PARTIAL, 3))
WORKERS = (4, 8)
THREADS = (1, 2, 4)
CONTRIBUTIONS = p4names.STATS_CONTRIBUTIONS


def mode_name(mode: int, quorum: int) -> str:
    return Mode(mode).name.lower() + (f"({quorum})" if mode == Mode.PARTIAL else "")


def configured_pipeline(pipeline: Pipeline, mode: int, quorum: int, workers: int) -> Pipeline:
    """One job of `workers` members on 127.0.0.1:BASE_PORT+w, slots 0-4095."""
    ip = wire.ip_to_int("127.0.0.1")
    writes = [Entry(p4names.ADMISSION_JOBS, (JOB,), p4names.ADMISSION_SET_JOB,
                    (0, 4096, workers, JOB, 1)),
              Entry(p4names.SYNC_MODE_MODES, (JOB, (0, 4095)), p4names.SYNC_MODE_SET_MODE,
                    (mode, quorum), 1)]
    for w in range(workers):
        writes.append(Entry(p4names.ADMISSION_MEMBERS, (JOB, w, ip, BASE_PORT + w),
                            p4names.ADMISSION_ADMIT))
        writes.append(Entry(p4names.REPLICATION_REWRITE, (wire.member_rid(JOB, w),),
                            p4names.REPLICATION_REWRITE_DST, (0, ip, BASE_PORT + w)))
    with pipeline.batch():
        for entry in writes:
            pipeline.write_entry("INSERT", entry)
        pipeline.write_group("INSERT", JOB, [Replica(1, wire.member_rid(JOB, w))
                                             for w in range(workers)])
    return pipeline


def _steady_rates(counts: Callable[[], tuple[int, int]], port: int, workers: int, window: int,
                  seconds: float) -> tuple[float, float, float, int, float]:
    """Load the server on `port`; over the steady interval: (contributions/s, datagrams in/s,
    interval, retransmits, CPU µs of this process per datagram in), `counts` giving the
    (contributions, datagrams in) so far."""
    senders = _core.bench.LoadGenerator("127.0.0.1", port, JOB, workers, BASE_PORT, 0, window,
                                        RTO_MS)
    senders.start()
    try:
        time.sleep(WARMUP_S)
        (c0, d0), t0, cpu0 = counts(), time.perf_counter(), time.process_time()
        time.sleep(seconds)
        (c1, d1), t1, cpu1 = counts(), time.perf_counter(), time.process_time()
    finally:
        senders.stop()
    return ((c1 - c0) / (t1 - t0), (d1 - d0) / (t1 - t0), t1 - t0, senders.retransmits,
            (cpu1 - cpu0) / max(1, d1 - d0) * 1e6)


def _row(kind: str, mode: str, workers: int, threads: int, window: int,
         measured: tuple[float, float, float, int, float]) -> dict:
    rate, datagrams, elapsed, retransmits, cpu_us = measured
    return {"dataplane": kind, "mode": mode, "workers": workers, "threads": threads,
            "window": window, "seconds": round(elapsed, 2), "contributions_per_s": round(rate),
            "datagrams_in_per_s": round(datagrams), "elements_per_s": round(rate * wire.LANES),
            "retransmits": retransmits, "cpu_us_per_datagram": round(cpu_us, 2)}


def reflector(workers: int, threads: int, window: int, seconds: float) -> dict:
    """The zero-work limit; every datagram it answers counts as a contribution."""
    server = _core.dataplane.Reflector("127.0.0.1", 0, threads)
    server.start()
    try:
        measured = _steady_rates(lambda: (server.packets_in, server.packets_in), server.port,
                                 workers, window, seconds)
    finally:
        server.stop()
    return _row("reflector", "-", workers, threads, window, measured)


def switch(engine: str, mode: int, quorum: int, workers: int, threads: int, window: int,
           seconds: float) -> dict:
    """The softswitch's UDP data plane on `engine` (native or python)."""
    plane: NativeUdpDataPlane | UdpDataPlane
    if engine == "native":
        native = NativePipeline()
        plane = NativeUdpDataPlane(native, "127.0.0.1", 0, threads)
        pipeline: Pipeline = configured_pipeline(native, mode, quorum, workers)
    else:
        pipeline = configured_pipeline(Pipeline(), mode, quorum, workers)
        plane = UdpDataPlane(pipeline, "127.0.0.1", 0)
    plane.start()
    counter = pipeline.counters[CONTRIBUTIONS].packets
    members = slice(JOB * wire.MAX_WORKERS, JOB * wire.MAX_WORKERS + workers)
    try:
        measured = _steady_rates(lambda: (sum(counter[members]), plane.packets_in),
                                 plane.address[1], workers, window, seconds)
    finally:
        plane.stop()
    return _row(engine, mode_name(mode, quorum), workers, threads, window, measured)


def udp(mode: int, quorum: int, seconds: float, window: int) -> dict:
    """The default softswitch (native, one thread per core) with SENDERS workers:
    bench/bmv2_bench.py's loopback row."""
    threads = len(os.sched_getaffinity(0))
    row = switch("native", mode, quorum, SENDERS, threads, window, seconds)
    return {**row, "dataplane": "udp-loopback", "senders": SENDERS}


def configurations(window: int, seconds: float,
                   threads: tuple[int, ...]) -> list[Callable[[], dict]]:
    runs: list[Callable[[], dict]] = [
        lambda w=w, t=t: reflector(w, t, window, seconds) for w in WORKERS for t in threads]
    for mode, quorum in MODES:
        runs += [lambda m=mode, q=quorum, w=w, t=t: switch("native", m, q, w, t, window, seconds)
                 for w in WORKERS for t in threads]
        runs.append(lambda m=mode, q=quorum: switch("python", m, q, SENDERS, 1, window, seconds))
    return runs


def run(seconds: float, window: int, threads: tuple[int, ...], repeat: int) -> list[dict]:
    """Every configuration `repeat` times, interleaved (a burst of load elsewhere on the
    machine hits one run of several configurations, not every run of one); the median."""
    runs = configurations(window, seconds, threads)
    samples: list[list[dict]] = [[] for _ in runs]
    for i in range(repeat):
        print(f"round {i + 1} of {repeat}", flush=True)
        for measure, got in zip(runs, samples, strict=True):
            got.append(measure())
            _print(got[-1])
    rows = []
    for got in samples:
        got.sort(key=lambda r: r["contributions_per_s"])
        rows.append({**got[len(got) // 2],
                     "runs_per_s": [r["contributions_per_s"] for r in got],
                     "cpu_us_per_datagram": statistics.median(
                         r["cpu_us_per_datagram"] for r in got)})
    best = {w: max(r["contributions_per_s"] for r in rows
                   if r["dataplane"] == "reflector" and r["workers"] == w) for w in WORKERS}
    for r in rows:  # datagrams in: in partial(q), the n-q late ones are work too (a resend)
        r["share_of_reflector"] = round(r["datagrams_in_per_s"] / best[r["workers"]], 3)
    return rows


def _print(r: dict) -> None:
    print(f"  {r['dataplane']:>9} {r['mode']:>10} {r['workers']} workers {r['threads']} threads:"
          f" {r['contributions_per_s']:>9,}/s, {r['cpu_us_per_datagram']:.2f} CPU us/datagram in"
          f" ({r['retransmits']} retransmits)", flush=True)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(WORKERS), figsize=(11, 4.2), sharey=True)
    for ax, workers in zip(axes, WORKERS, strict=True):
        mine = [r for r in rows if r["workers"] == workers]
        labels = [f"{r['dataplane']}\n{r['mode']}\n{r['threads']}t".replace("\n-", "")
                  for r in mine]
        colors = [{"reflector": "0.6", "native": "C0", "python": "C3"}[r["dataplane"]]
                  for r in mine]
        ax.bar(range(len(mine)), [r["datagrams_in_per_s"] / 1e3 for r in mine], color=colors)
        ax.set_xticks(range(len(mine)), labels, fontsize=6.5)
        ax.set_title(f"{workers} workers, UDP loopback")
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("thousand datagrams in / s")
    fig.suptitle(f"softswitch vs the reflector limit — {os.cpu_count()} cores, "
                 f"load {os.getloadavg()[0]:.1f} at the end", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="steady interval per run")
    parser.add_argument("--window", type=int, default=128, help="slots in flight per worker")
    parser.add_argument("--threads", type=int, nargs="+", default=list(THREADS),
                        help="data-plane thread counts to run (default %(default)s)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs per configuration, interleaved; the median is reported")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    rows = run(args.seconds, args.window, tuple(args.threads), args.repeat)
    conditions = {"cpus": os.cpu_count(), "load_avg_1min_before": round(load_before, 2),
                  "load_avg_1min_after": round(os.getloadavg()[0], 2),
                  "command": "python -m bench.softswitch_bench " + " ".join(
                      sys.argv[1:] if argv is None else argv)}
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "softswitch.json"
    out.write_text(json.dumps({"conditions": conditions, "rows": rows}, indent=2) + "\n")
    plot(rows, RESULTS / "softswitch.png")
    print(f"wrote {out} and {RESULTS / 'softswitch.png'}")


if __name__ == "__main__":
    main()
