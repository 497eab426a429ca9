"""Aggregation rate on a frame data plane: BMv2 vs the softswitch, same topology, same load.

4 sender hosts (network namespaces, 10.0.0.1-4/24) each on a veth to one port of a
switch in its own namespace (`hysync.controlplane.testbed.netns.NetnsStar`); the switch is

* `bmv2`: simple_switch_grpc running build/p4/hysync.json (`make p4`);
* `softswitch-raw`: `python -m hysync.softswitch -i PORT@IFACE ...` (its raw data plane);

each configured over P4Runtime, through the link-local management /30, by the real
controller (`Controller.add_job`: members 10.0.0.x, switch ports 1-4, slots
0..window-1). Each sender (`bench.senders.sender_main` under `ip netns exec`) keeps
`window` slots in flight and retransmits a slot after 100 ms without a result. A fresh
switch process per (switch, mode). The rate is the switch's own `contributions`
counter (contributions aggregated into a sum) over the senders' run time, K = 64
lanes per contribution. The loopback softswitch bench (`bench.softswitch_bench.run`,
UDP data plane, `softswitch-udp`) runs in the same invocation for reference.

BMv2's default build (with logging) runs this program at about a thousand pipeline
passes/s (a sync round is 4 contributions in and 4 result replicas out). The frame
window is therefore small: at 16 slots per sender the queue in BMv2 outgrows the
100 ms retransmission timeout and the run collapses into retransmissions (measured:
~200 contributions/s, 1,100 retransmissions in 3 s); at 8 there are none. Both frame
switches get the same window; the loopback run keeps softswitch_bench's default.

    .venv/bin/python -m bench.bmv2_bench [--seconds 5] [--window 8] [--udp-window 128]

Needs root (namespaces); without BMv2 it says so and measures the softswitch only.
Writes bench/results/bmv2.json ({"rows": [...], "ratios": {...}}) and bench/results/bmv2.png.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench import softswitch_bench
from bench.senders import BASE_PORT
from hysync import wire
from hysync.controlplane.controller import Controller
from hysync.controlplane.job import JobConfig, Member
from hysync.controlplane.p4rt.switch import Switch, wait_for_server
from hysync.controlplane.testbed.netns import NetnsStar
from hysync.wire import Mode

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
P4INFO = REPO / "p4src" / "v1model" / "hysync.p4info.txtpb"
BMV2_JSON = REPO / "build" / "p4" / "hysync.json"
LOGS = REPO / "build" / "bench"
JOB = 1
SENDERS = 4
MODES = ((Mode.SYNC, 0), (Mode.PARTIAL, 3))
SWITCHES = ("bmv2", "softswitch-raw", "softswitch-udp")
UDP_WINDOW = 128  # bench.softswitch_bench's default window


def mode_name(mode: Mode, quorum: int) -> str:
    return mode.name.lower() + (f"({quorum})" if mode == Mode.PARTIAL else "")


def bmv2_unavailable() -> str | None:
    """Why BMv2 cannot be measured here, or None. Compiles the program if p4c is present."""
    if shutil.which("simple_switch_grpc") is None:
        return "simple_switch_grpc is not on PATH (BMv2 is not installed)"
    if shutil.which("p4c") is not None:
        done = subprocess.run(["make", "-s", "-C", str(REPO), "p4"], capture_output=True,
                              text=True)
        if done.returncode != 0:
            return f"`make p4` failed: {done.stderr.strip().splitlines()[-1:]}"
    if not BMV2_JSON.exists():
        return f"{BMV2_JSON} is missing and p4c is not on PATH to build it"
    return None


# ------------------------------------------------------------------ switch processes
def _start_switch(star: NetnsStar, kind: str, log: Path) -> subprocess.Popen:
    ports = [arg for p, ifname in star.switch_ifs.items() for arg in ("-i", f"{p}@{ifname}")]
    if kind == "bmv2":
        cmd = ["simple_switch_grpc", "--device-id", "1", *ports, "--no-p4", "--",
               "--grpc-server-addr", star.grpc_addr]
    else:
        cmd = [sys.executable, "-m", "hysync.softswitch", "--grpc-addr", star.grpc_addr, *ports,
               "--log-level", "warning"]
    with open(log, "w") as out:  # `ip netns exec` execs the command: the pid is the switch's
        return subprocess.Popen([*star.exec_in(star.switch_ns), *cmd], stdout=out,
                                stderr=subprocess.STDOUT, cwd=REPO)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _connect(addr: str, proc: subprocess.Popen, log: Path, timeout: float = 30) -> Switch:
    """Wait for the gRPC port, then open one primary session."""
    wait_for_server(addr, timeout, lambda: None if proc.poll() is None else
                    f"the switch exited with status {proc.returncode}; see {log}")
    return Switch(addr, election_id=(0, 1), connect_timeout=5.0, timeout=10.0)


# ------------------------------------------------------------------ senders
def _reader(proc: subprocess.Popen, w: int, lines: queue.Queue) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put((w, line.strip()))
    lines.put((w, None))


def _start_senders(star: NetnsStar, window: int, seconds: float):
    lines: queue.Queue = queue.Queue()
    procs = []
    for w, host in enumerate(star.hosts):
        cmd = [*star.exec_in(host), sys.executable, "-m", "bench.netns_hosts", "--worker",
               str(w), "--job", str(JOB), "--bind", f"10.0.0.{w + 1}", "--port",
               str(wire.HYSYNC_UDP_PORT), "--slots", "0", str(window), "--seconds", str(seconds)]
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                cwd=REPO)
        procs.append(proc)
        threading.Thread(target=_reader, args=(proc, w, lines), daemon=True).start()
    return procs, lines


def _expect(lines: queue.Queue, n: int, timeout: float, what: str) -> dict[int, str]:
    got: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    while len(got) < n:
        try:
            w, line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            raise RuntimeError(f"senders {sorted(set(range(n)) - set(got))}: no {what} after "
                               f"{timeout:.0f} s") from None
        if line is None:
            raise RuntimeError(f"sender {w} exited before {what}")
        got[w] = line
    return got


def run_frames(star: NetnsStar, kind: str, mode: Mode, quorum: int, seconds: float,
               window: int) -> dict:
    """One (switch, mode) on the namespace topology: a fresh switch process, the job
    installed by the controller, 4 senders for `seconds`."""
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"bmv2_bench-{kind}.log"
    proc = _start_switch(star, kind, log)
    senders: list[subprocess.Popen] = []
    switch = None
    try:
        switch = _connect(star.grpc_addr, proc, log)
        switch.push_pipeline(P4INFO, BMV2_JSON if kind == "bmv2" else None)
        controller = Controller(switch).attach()
        members = tuple(Member(w, f"10.0.0.{w + 1}", f"02:00:00:00:01:{w + 1:02x}",
                               BASE_PORT + w, w + 1) for w in range(SENDERS))
        controller.add_job(JobConfig(JOB, members, 0, window, mode=mode, quorum=quorum))
        senders, lines = _start_senders(star, window, seconds)
        _expect(lines, SENDERS, 30, "ready")
        before = controller.stats(JOB)
        t0 = time.perf_counter()
        for s in senders:
            assert s.stdin is not None
            s.stdin.write("go\n")
            s.stdin.flush()
        done = _expect(lines, SENDERS, seconds + 30, "result")
        elapsed = time.perf_counter() - t0
        after = controller.stats(JOB)
    finally:
        for s in senders:
            _stop(s)
        if switch is not None:
            switch.close()
        _stop(proc)
    tallies = [json.loads(done[w]) for w in range(SENDERS)]
    aggregated = after.contributions - before.contributions
    per_worker = {k: sum(getattr(after.workers[w], k) - getattr(before.workers[w], k)
                         for w in after.workers) for k in ("late", "duplicates", "stale")}
    drops = {k: v - before.drops.get(k, 0) for k, v in after.drops.items()
             if v - before.drops.get(k, 0)}
    rate = aggregated / elapsed
    return {"switch": kind, "mode": mode_name(mode, quorum), "senders": SENDERS,
            "window": window, "seconds": round(elapsed, 2),
            "contributions_per_s": round(rate), "elements_per_s": round(rate * wire.LANES),
            "contributions_sent": sum(t["sent"] for t in tallies),
            "contributions_aggregated": aggregated,
            "retransmits": sum(t["retransmits"] for t in tallies),
            "resyncs_received": sum(t["resyncs"] for t in tallies),
            **per_worker, "drops": drops}


def run_udp(mode: Mode, quorum: int, seconds: float, window: int) -> dict:
    row = softswitch_bench.udp(mode, quorum, seconds, window)
    return {"switch": "softswitch-udp", **row}


# ------------------------------------------------------------------ output
def ratios(rows: list[dict]) -> dict[str, dict[str, float | None]]:
    rate = {(r["switch"], r["mode"]): r["contributions_per_s"] for r in rows}
    out: dict[str, dict[str, float | None]] = {}
    for sw in ("softswitch-raw", "softswitch-udp"):
        key = f"{sw}/bmv2"
        out[key] = {}
        for mode, quorum in MODES:
            m = mode_name(mode, quorum)
            b, s = rate.get(("bmv2", m)), rate.get((sw, m))
            out[key][m] = round(s / b, 2) if b and s is not None else None
    return out


def table(rows: list[dict]) -> str:
    head = (f"{'switch':<15} {'mode':<11} {'window':>6} {'seconds':>7} {'contrib/s':>10} "
            f"{'elements/s':>12} {'retx':>6}")
    lines = [head, "-" * len(head)]
    for r in rows:
        retx = r.get("retransmits")
        lines.append(f"{r['switch']:<15} {r['mode']:<11} {r['window']:>6} {r['seconds']:>7.2f} "
                     f"{r['contributions_per_s']:>10,} {r['elements_per_s']:>12,} "
                     f"{'-' if retx is None else retx:>6}")
    return "\n".join(lines)


def chart(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [mode_name(m, q) for m, q in MODES]
    switches = [s for s in SWITCHES if any(r["switch"] == s for r in rows)]
    rate = {(r["switch"], r["mode"]): r for r in rows}
    fig, ax = plt.subplots(figsize=(7, 4.2))
    width = 0.8 / max(len(switches), 1)
    for i, sw in enumerate(switches):
        xs = [j + (i - (len(switches) - 1) / 2) * width for j in range(len(modes))]
        ys = [rate[(sw, m)]["contributions_per_s"] if (sw, m) in rate else 0 for m in modes]
        win = next(r["window"] for r in rows if r["switch"] == sw)
        bars = ax.bar(xs, ys, width, label=f"{sw} (window {win})")
        for bar, y in zip(bars, ys, strict=True):
            ax.annotate(f"{y:,}", (bar.get_x() + bar.get_width() / 2, y), ha="center",
                        va="bottom", fontsize=8)
    ax.set_yscale("log")
    top = max((r["contributions_per_s"] for r in rows), default=1)
    ax.set_ylim(bottom=100, top=max(top, 100) * 12)
    ax.set_xticks(range(len(modes)), modes)
    ax.set_ylabel(f"contributions aggregated / s (x{wire.LANES} elements)")
    ax.set_title(f"HySync aggregation rate, {SENDERS} senders, K = {wire.LANES}")
    ax.legend(fontsize=8, loc="upper center", ncol=len(switches))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per (switch, mode)")
    parser.add_argument("--window", type=int, default=8,
                        help="slots in flight per sender on the frame data planes")
    parser.add_argument("--udp-window", type=int, default=UDP_WINDOW,
                        help="slots in flight per sender on loopback (softswitch_bench's)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    host = {"cpus": os.cpu_count(), "loadavg_1min_at_start": round(os.getloadavg()[0], 2)}
    rows: list[dict] = []
    notes: list[str] = []
    kinds: list[str] = []
    if os.geteuid() != 0 or shutil.which("ethtool") is None:
        notes.append("frame data planes skipped: they need root and ethtool (network namespaces)")
    else:
        reason = bmv2_unavailable()
        if reason:
            notes.append(f"BMv2 not measured: {reason}")
        kinds = ([] if reason else ["bmv2"]) + ["softswitch-raw"]
    for note in notes:
        print(f"bmv2 bench: {note}", flush=True)
    if kinds:
        star = NetnsStar(SENDERS)
        try:
            for kind in kinds:
                for mode, quorum in MODES:
                    print(f"bmv2 bench: {kind} {mode_name(mode, quorum)} window {args.window} "
                          f"for {args.seconds:g} s ...", flush=True)
                    rows.append(run_frames(star, kind, mode, quorum, args.seconds, args.window))
                    _print_row(rows[-1])
        finally:
            star.close()
    for mode, quorum in MODES:
        print(f"bmv2 bench: softswitch-udp {mode_name(mode, quorum)} window {args.udp_window} "
              f"for {args.seconds:g} s ...", flush=True)
        rows.append(run_udp(mode, quorum, args.seconds, args.udp_window))
        _print_row(rows[-1])
    host["loadavg_1min_at_end"] = round(os.getloadavg()[0], 2)
    result = {"rows": rows, "ratios": ratios(rows), "notes": notes, "host": host}
    print()
    print(table(rows))
    for key, per_mode in result["ratios"].items():
        print(f"{key}: " + ", ".join(f"{m} {'-' if v is None else f'{v:g}x'}"
                                     for m, v in per_mode.items()))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bmv2.json").write_text(json.dumps(result, indent=2) + "\n")
    chart(rows, RESULTS / "bmv2.png")
    print(f"wrote {RESULTS / 'bmv2.json'} and {RESULTS / 'bmv2.png'} "
          f"({time.monotonic() - started:.0f} s)")


def _print_row(r: dict) -> None:
    extra = ""
    if "retransmits" in r:
        extra = (f"  retransmits {r['retransmits']}, late {r['late']}, duplicates "
                 f"{r['duplicates']}, stale {r['stale']}, drops {r['drops'] or 0}")
    print(f"  {r['contributions_per_s']:>9,} contributions/s {r['elements_per_s']:>12,} "
          f"elements/s{extra}", flush=True)


if __name__ == "__main__":
    main()
