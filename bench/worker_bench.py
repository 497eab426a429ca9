"""Worker bench: the native engine at the kernel's UDP rate, and all-reduce next to gloo.

1. One worker against the zero-work switch (`python -m hysync.softswitch.reflect --answer
   result`'s core: each contribution back as its own result): packets/s and payload
   Gbit/s of 10M-float32 calls, as a share of this machine's UDP loopback limit
   measured in the same run, interleaved: the same reflector answering echo, loaded by
   the native load generator (one sender, the same window), as bench.softswitch_bench
   measures it.
2. Four worker processes on loopback, each a `HySyncWorker` against the native
   softswitch's UDP data plane (its own process, one thread per core: what `python -m
   hysync.softswitch` runs by default), all-reduce 1M, 10M and 100M float32 in place; in the
   same processes, over a gloo process group, `torch.distributed.all_reduce` of the
   same tensors. Times are the slowest worker's, from a common start (a gloo barrier).
   Peak RSS of worker 0 during the 100M call (VmHWM, reset just before).
3. The pure-Python worker engine's numbers (recorded in bench/results/worker.json
   before the native engine, `--python-baseline`) beside them; a PNG of both.

    .venv/bin/python -m bench.worker_bench [--reps 3]

`--late ELEMENTS` measures only a sync step's critical path when one member computes
slower: workers 0-2 call at once, worker 3 `LATE_S` later, and its call is timed (the
others' rounds wait for it, so what its call takes is what the step takes beyond its
compute), for HySync and for gloo, with HySync's split: the engine's call, of it the
time blocked until the switch answered, and the Python around the engine (the hand-off to
the worker's thread and back). `--reps` calls each, interleaved.

Writes bench/results/worker.json and bench/results/worker.png.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from hysync import p4names

RESULTS = Path(__file__).resolve().parent / "results"
WORKERS = 4
JOB = 1
SCALE = 2.0**20
SIZES = (1_000_000, 10_000_000, 100_000_000)
RSS_SIZE = 100_000_000  # the call whose peak RSS is bounded (< 3x the tensor's bytes)
REFLECT_ELEMENTS = 10_000_000
TIMEOUT = 1800
LATE_S = 0.03  # --late: how long after the others the last worker calls


# ---------------------------------------------------------------- the switch
def switch_main(cmd: Any, out: Any) -> None:
    """The native softswitch's UDP data plane in its own process, one thread per core (the
    default of `python -m hysync.softswitch`); installs the job it is sent, as one write batch."""
    from hysync import wire
    from hysync.softswitch.native import NativePipeline, NativeUdpDataPlane
    from hysync.softswitch.tables import Entry, Replica

    pipeline = NativePipeline()
    dataplane = NativeUdpDataPlane(pipeline, "127.0.0.1", 0).start()
    out.put((dataplane.address, dataplane.threads))
    while True:
        op, arg = cmd.get()
        if op == "install":
            members, slot_count = arg
            ip = wire.ip_to_int("127.0.0.1")
            with pipeline.batch():
                for w, port in enumerate(members):
                    pipeline.write_entry("INSERT", Entry(
                        p4names.ADMISSION_MEMBERS, (JOB, w, ip, port), p4names.ADMISSION_ADMIT))
                    pipeline.write_entry("INSERT", Entry(
                        p4names.REPLICATION_REWRITE, (wire.member_rid(JOB, w),),
                        p4names.REPLICATION_REWRITE_DST, (0, ip, port)))
                pipeline.write_group("INSERT", JOB, [Replica(1, wire.member_rid(JOB, w))
                                                     for w in range(len(members))])
                pipeline.write_entry("INSERT", Entry(
                    p4names.ADMISSION_JOBS, (JOB,), p4names.ADMISSION_SET_JOB,
                    (0, slot_count, len(members), JOB, 1)))
                pipeline.write_entry("INSERT", _modes(slot_count, 0, 0))
        elif op == "mode":
            mode, slot_count = arg
            pipeline.write_entry("MODIFY", _modes(slot_count, mode, 0))
        elif op == "stop":
            cpu = os.times()
            out.put((dataplane.packets_in, cpu.user, cpu.system))
            dataplane.stop()
            return
        out.put("ok")


def _modes(slot_count: int, mode: int, quorum: int) -> Any:
    from hysync.softswitch.tables import Entry

    return Entry(p4names.SYNC_MODE_MODES, (JOB, (0, slot_count - 1)), p4names.SYNC_MODE_SET_MODE,
                 (mode, quorum), priority=1)


# ---------------------------------------------------------------- workers
def rss_bytes(field: str) -> int:
    """VmHWM (peak) or VmRSS of this process, from /proc."""
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.M)[1]) * 1024  # type: ignore[index]


def worker_main(rank: int, switch: tuple[str, int], window: int, rendezvous: str, plan: list,
                out: Any, go: Any, mode_set: Any) -> None:
    import torch
    import torch.distributed as dist

    from hysync.worker.api import HySyncWorker
    from hysync.worker.config import TransportConfig

    config = TransportConfig(job_id=JOB, worker_id=rank, switch_host=switch[0],
                             switch_port=switch[1], bind_host="127.0.0.1", slot_base=0,
                             slot_count=window, members=WORKERS, dead_after=60.0)
    torch.set_num_threads(1)  # four workers and the switch share the machine's cores
    hw = HySyncWorker(config, scale=SCALE)
    out.put((rank, "bound", hw.address[1]))
    go.wait(TIMEOUT)
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank,
                            world_size=WORKERS)

    def source(n: int) -> torch.Tensor:
        return torch.from_numpy(np.random.default_rng((rank, n)).standard_normal(
            n, dtype=np.float32))

    hw.allreduce(source(100_000), key="warmup")  # every slot heard from
    for step, (kind, n, key) in enumerate(plan):
        if kind == "mode":
            dist.barrier()  # the test process switches the mode in between
            out.put((rank, "mode-ack", step))
            mode_set.wait(TIMEOUT)  # the switch latches the new mode at each slot's next round
            continue
        # Both all-reduce in place on a fresh tensor (gloo's all_reduce is in place too).
        work = source(n)
        extra: dict[str, Any] = {}
        dist.barrier()
        if key.startswith("late") and rank == WORKERS - 1:
            time.sleep(LATE_S)  # the straggler: the others' calls are waiting for it
        if kind == "hysync" and n == RSS_SIZE:
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
            extra["rss_before"] = rss_bytes("VmRSS")
        start, cpu = time.perf_counter(), os.times()
        if kind == "hysync":
            hw.allreduce(work, key=key, in_place=True)
            stats = hw.last_stats(key)
            after = os.times()
            extra.update(retransmits=stats.retransmits, rounds=len(stats.results),
                         engine_s=stats.elapsed_s, waited_s=stats.waited_s,
                         cpu_user_s=after.user - cpu.user, cpu_sys_s=after.system - cpu.system)
            if n == RSS_SIZE:
                extra["rss_peak"] = rss_bytes("VmHWM")
        else:
            dist.all_reduce(work)
        out.put((rank, "timing", (step, time.perf_counter() - start, extra)))
        del work
    dist.destroy_process_group()
    hw.close()
    out.put((rank, "bye", None))


# ---------------------------------------------------------------- one worker, zero-work switch
def echo_limit(window: int, seconds: float = 3.0) -> float:
    """Datagrams/s each way of the machine's zero-work echo: the project's reflector (one
    thread), one native sender with `window` in flight."""
    from bench.softswitch_bench import reflector

    return float(reflector(1, 1, window, seconds)["datagrams_in_per_s"])


def reflected_rate(window: int, calls: int) -> list[dict]:
    """One worker, `calls` all-reduces of REFLECT_ELEMENTS against the zero-work switch."""
    from hysync import _core
    from hysync.worker.config import TransportConfig
    from hysync.worker.quantize import FixedPointQuantizer
    from hysync.worker.transport import Transport

    reflector = _core.dataplane.Reflector("127.0.0.1", 0, 1, _core.dataplane.Answer.AS_RESULT)
    reflector.start()
    tr = Transport(TransportConfig(job_id=JOB, worker_id=0, switch_host="127.0.0.1",
                                   switch_port=reflector.port, bind_host="127.0.0.1",
                                   slot_count=window), FixedPointQuantizer(SCALE, 1))
    values = np.random.default_rng(0).standard_normal(REFLECT_ELEMENTS, dtype=np.float32)
    rows = []
    try:
        for _ in range(calls):
            work = values.copy()
            start = time.perf_counter()
            result = tr.allreduce("reflected", work, in_place=True)
            seconds = time.perf_counter() - start
            packets = result.stats.chunks
            rows.append({"seconds": seconds, "packets_per_s": packets / seconds,
                         "retransmits": result.stats.retransmits})
    finally:
        tr.close()
        reflector.stop()
    return rows


def reflector_section(window: int, reps: int) -> dict:
    limits, worker = [], []
    for _ in range(reps):  # interleaved: the machine's load moves under both alike
        limits.append(echo_limit(window))
        worker += reflected_rate(window, 1)
    pps = statistics.median(r["packets_per_s"] for r in worker)
    row: dict[str, Any] = {
        "case": "reflector", "elements": REFLECT_ELEMENTS, "window": window, "reps": reps,
        "worker_packets_per_s": round(pps),
        "worker_payload_gbit_s": round(pps * wire_payload_bits() / 1e9, 3),
        "worker_packets_per_s_runs": [round(r["packets_per_s"]) for r in worker],
        "retransmits": [r["retransmits"] for r in worker]}
    limit = max(limits)  # a limit is the best rate seen: loaded runs only fall short of it
    row.update(limit_packets_per_s=round(limit), limit_runs=[round(x) for x in limits],
               limit_payload_gbit_s=round(limit * wire_payload_bits() / 1e9, 3),
               share_of_limit=round(pps / limit, 3),
               limit_tool="python -m hysync.softswitch.reflect (echo) + native loadgen, 1 sender")
    return row


def wire_payload_bits() -> int:
    from hysync import wire

    return wire.LANES * 4 * 8


# ---------------------------------------------------------------- the run
def run(window: int, reps: int, sizes: tuple[int, ...] = SIZES,
        async_size: int | None = SIZES[0], late: int | None = None) -> tuple[list[dict], int]:
    """Sync all-reduces of `sizes` (the smallest `reps` times), then one of `async_size`
    elements in async (none if None); with `late`, only `reps` late-member calls of that
    many elements (module docstring)."""
    from hysync.wire import Mode

    plan: list[tuple[str, int, str]] = []
    if late is not None:
        plan += [("hysync", late, f"late-{late}"), ("gloo", late, "late")] * reps
    else:
        for n in sizes:
            for _ in range(reps if n == min(sizes) else 1):
                plan += [("hysync", n, f"sync-{n}"), ("gloo", n, "")]
    if async_size is not None:
        plan += [("mode", 0, "async"), ("hysync", async_size, "async"),
                 ("gloo", async_size, "")]
    ctx = mp.get_context("spawn")
    cmd, sw_out = ctx.Queue(), ctx.Queue()
    switch = ctx.Process(target=switch_main, args=(cmd, sw_out), daemon=True)
    switch.start()
    address, switch_threads = sw_out.get(timeout=60)
    out, go, mode_set = ctx.Queue(), ctx.Event(), ctx.Event()
    # gloo's rendezvous through a file: no TCP port chosen here for rank 0 to bind later.
    rendezvous = f"file://{tempfile.mkdtemp(prefix='worker-bench-')}/store"
    procs = [ctx.Process(target=worker_main, daemon=True,
                         args=(r, address, window, rendezvous, plan, out, go, mode_set))
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
    done = 0
    mode_acks = 0
    while done < WORKERS:
        rank, kind, payload = out.get(timeout=TIMEOUT)
        if kind == "timing":
            step, seconds, extra = payload
            timings.setdefault(step, []).append((seconds, extra | {"rank": rank}))
        elif kind == "mode-ack":
            mode_acks += 1
            if mode_acks == WORKERS:
                cmd.put(("mode", (int(Mode.ASYNC), window)))
                sw_out.get(timeout=60)
                mode_set.set()
        elif kind == "bye":
            done += 1
    cmd.put(("stop", None))
    packets, user, system = sw_out.get(timeout=60)
    for p in [*procs, switch]:
        p.join(timeout=30)
    rows = [dict(r, switch=f"native, {switch_threads} threads")
            for r in summarize(plan, timings, window)]
    rows.append({"case": "switch", "datagrams_in": packets, "cpu_user_s": round(user, 2),
                 "cpu_sys_s": round(system, 2),
                 "cpu_us_per_datagram_in": round((user + system) / max(1, packets) * 1e6, 2)})
    return rows, packets


def summarize(plan: list, timings: dict, window: int) -> list[dict]:
    by_case: dict[tuple[str, int], dict[str, list[float]]] = {}
    mode = "sync"
    extras: dict[tuple[str, int], dict] = {}
    for step, (kind, n, key) in enumerate(plan):
        if kind == "mode":
            mode = key
            continue
        late = key.startswith("late")
        # A common start: the slowest worker's time. A late member: its own call's time.
        last_s, last = next((s, e) for s, e in timings[step] if e["rank"] == WORKERS - 1)
        timed = last_s if late else max(s for s, _ in timings[step])
        case_mode = "late" if late else mode
        case = by_case.setdefault((case_mode, n), {"hysync": [], "gloo": []})
        case[kind].append(timed)
        if kind == "hysync":
            per_call = extras.setdefault((case_mode, n), {"retransmits_per_call": []})
            if late:
                for part, value in (("engine", last["engine_s"]), ("waited", last["waited_s"]),
                                    ("python", timed - last["engine_s"])):
                    per_call.setdefault(f"late_{part}_s", []).append(value)
            per_call["retransmits_per_call"].append(sum(e.get("retransmits", 0)
                                                        for _, e in timings[step]))
            per_call["retransmits"] = round(statistics.median(per_call["retransmits_per_call"]))
            # CPU of the 4 worker processes (user: engine + Python; sys: the kernel's UDP)
            for part in ("user", "sys"):
                per_call.setdefault(f"workers_cpu_{part}_s_per_call", []).append(round(
                    sum(e[f"cpu_{part}_s"] for _, e in timings[step]), 3))
            rank0 = next(e for _, e in timings[step] if e["rank"] == 0)
            if "rss_peak" in rank0:
                extras[(case_mode, n)].update(
                    worker0_rss_peak_mb=round(rank0["rss_peak"] / 2**20),
                    worker0_rss_before_mb=round(rank0["rss_before"] / 2**20),
                    rss_peak_over_tensor=round(rank0["rss_peak"] / (4 * n), 2))
    rows = []
    for (mode, n), case in by_case.items():
        extra = extras[(mode, n)]
        for part in ("engine", "waited", "python"):  # late member: medians, in seconds
            if f"late_{part}_s" in extra:
                extra[f"late_{part}_s"] = round(statistics.median(extra[f"late_{part}_s"]), 5)
        digits = 5 if mode == "late" else 3  # a late member's call is a few milliseconds
        rows.append({"case": "allreduce", "elements": n,
                     "hysync_s": round(statistics.median(case["hysync"]), digits),
                     "gloo_s": round(statistics.median(case["gloo"]), digits + 1),
                     "mode": mode, "workers": WORKERS, "window": window,
                     "reps": len(case["hysync"]),
                     "hysync_elements_per_s": round(n / statistics.median(case["hysync"])),
                     **extra})
    return rows


def python_engine_rows(path: Path | None) -> list[dict]:
    """The pure-Python engine's all-reduce rows (its bench/results/worker.json)."""
    if path is None or not path.exists():
        return []
    rows = json.loads(path.read_text())
    if any("engine" in r for r in rows):  # written by this bench: keep its recorded baseline
        return [r for r in rows if r.get("engine") == "python"]
    return [dict(r, engine="python") for r in rows if r.get("hysync_s") is not None]


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    native = [r for r in rows if r.get("case") == "allreduce" and r.get("engine") == "native"
              and r["mode"] == "sync"]
    python = {r["elements"]: r["hysync_s"] for r in rows if r.get("engine") == "python"
              and r["mode"] == "sync"}
    labels = [f"{r['elements'] // 1_000_000}M" for r in native]
    x = np.arange(len(native))
    left.bar(x - 0.27, [python.get(r["elements"], np.nan) for r in native], 0.27,
             label="HySync, Python worker and softswitch (recorded before, other load)")
    left.bar(x, [r["hysync_s"] for r in native], 0.27, label="HySync, native worker and softswitch")
    left.bar(x + 0.27, [r["gloo_s"] for r in native], 0.27, label="gloo")
    left.set_xticks(x, labels)
    left.set_yscale("log")
    left.set_ylabel("seconds (slowest of 4 workers)")
    left.set_title("sync all-reduce of float32, 4 workers, softswitch on loopback")
    left.legend(fontsize=8, loc="upper left")
    refl = next((r for r in rows if r.get("case") == "reflector"), None)
    if refl is not None:
        bars = {"worker vs\nzero-work switch": refl["worker_packets_per_s"],
                "UDP echo limit\n(1 sender)": refl["limit_packets_per_s"]}
        right.bar(list(bars), [v / 1e3 for v in bars.values()], color=["C1", "C7"])
        right.set_title(f"one worker, window {refl['window']}: "
                        f"{refl['share_of_limit']:.0%} of the limit")
        right.set_ylabel("thousand packets/s each way")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _print_table(rows: list[dict], python: dict[tuple[str, int], float], packets: int) -> None:
    print(f"{'mode':>6} {'elements':>11} {'hysync s':>9} {'python s':>9} {'gloo s':>8} "
          f"{'ratio':>7} {'retx':>6} {'peak RSS / tensor':>18}")
    for r in rows:
        if r["case"] == "switch":
            print(f"switch: {r['cpu_us_per_datagram_in']} CPU us per datagram in "
                  f"(user {r['cpu_user_s']} s, sys {r['cpu_sys_s']} s)")
            continue
        if r["mode"] == "late":
            print(f"worker {WORKERS - 1} calling {LATE_S * 1e3:.0f} ms after the others, "
                  f"{r['elements']:,} elements, medians of {r['reps']}: HySync "
                  f"{r['hysync_s'] * 1e3:.2f} ms (engine {r['late_engine_s'] * 1e3:.2f}, of it "
                  f"waiting for the switch {r['late_waited_s'] * 1e3:.2f}; Python around it "
                  f"{r['late_python_s'] * 1e3:.2f}), gloo {r['gloo_s'] * 1e3:.2f} ms")
            continue
        before = python.get((r["mode"], r["elements"]))
        print(f"{r['mode']:>6} {r['elements']:>11,} {r['hysync_s']:>9.3f} "
              f"{before if before is not None else float('nan'):>9.2f} {r['gloo_s']:>8.4f} "
              f"{r['hysync_s'] / r['gloo_s']:>7.0f} {r['retransmits']:>6} "
              f"{r.get('rss_peak_over_tensor', ''):>18}  workers' CPU user/sys s per call "
              f"{r['workers_cpu_user_s_per_call']}/{r['workers_cpu_sys_s_per_call']}")
    print(f"softswitch handled {packets:,} datagrams")


def _machine(load_before: tuple[float, float, float]) -> dict:
    return {"case": "machine", "cores": os.cpu_count(),
            "load_1_5_15_before": [round(x, 2) for x in load_before],
            "load_1_5_15_after": [round(x, 2) for x in os.getloadavg()]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=256, help="slots in flight per worker")
    parser.add_argument("--reps", type=int, default=3,
                        help="repetitions of the 1M case and of the reflector runs")
    parser.add_argument("--python-baseline", type=Path, default=RESULTS / "worker.json",
                        help="the pure-Python engine's worker.json (read before it is rewritten)")
    parser.add_argument("--sizes", type=int, nargs="+", metavar="ELEMENTS",
                        help="only sync all-reduces of these sizes (no reflector section, no "
                        "async run; the smallest --reps times); prints the table and writes "
                        "only --out")
    parser.add_argument("--late", type=int, metavar="ELEMENTS",
                        help="only the late-member case (module docstring): --reps calls of "
                        "this many elements; prints the table and writes only --out")
    parser.add_argument("--out", type=Path,
                        help="with --sizes or --late: write the rows and the load average to "
                        "this JSON")
    args = parser.parse_args(argv)
    if args.sizes and args.late:
        parser.error("--sizes and --late are two separate runs: give one")
    if args.late is not None and args.late < 1:
        parser.error(f"--late needs a positive element count, got {args.late}")
    if args.out and not (args.sizes or args.late):
        parser.error("--out goes with --sizes or --late (the full bench writes "
                     "bench/results/worker.json)")
    if args.sizes or args.late:
        load_before = os.getloadavg()
        rows, packets = run(args.window, args.reps, tuple(args.sizes or ()), async_size=None,
                            late=args.late)
        _print_table(rows, {}, packets)
        machine = _machine(load_before)
        print(f"load average {machine['load_1_5_15_after'][0]:.2f}")
        if args.out:
            args.out.write_text(json.dumps([machine, *rows], indent=2) + "\n")
            print(f"wrote {args.out}")
        return
    started, load_before = time.perf_counter(), os.getloadavg()
    baseline = python_engine_rows(args.python_baseline)
    refl = reflector_section(args.window, args.reps)
    print(f"one worker vs the zero-work switch: {refl['worker_packets_per_s']:,} packets/s "
          f"({refl['worker_payload_gbit_s']} Gbit/s of payload)"
          f", {refl['share_of_limit']:.0%} of the echo limit {refl['limit_packets_per_s']:,}/s",
          flush=True)
    print(f"all-reduce, {WORKERS} worker processes, window {args.window} ...", flush=True)
    rows, packets = run(args.window, args.reps)
    rows = [dict(r, engine="native") for r in rows]
    _print_table(rows, {(r["mode"], r["elements"]): r["hysync_s"] for r in baseline}, packets)
    print(f"bench took {time.perf_counter() - started:.0f} s")
    RESULTS.mkdir(exist_ok=True)
    every = [_machine(load_before), refl, *rows, *baseline]
    (RESULTS / "worker.json").write_text(json.dumps(every, indent=2) + "\n")
    plot(every, RESULTS / "worker.png")
    print(f"wrote {RESULTS / 'worker.json'} and {RESULTS / 'worker.png'}")


if __name__ == "__main__":
    main()
