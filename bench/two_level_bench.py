"""Two levels: 2 racks x 3 hosts training through two leaves and a spine, with one slow
rack and with none, adaptive per level against sync at every level and against gloo.

Everything on one machine, on loopback: three softswitch processes (a spine and two
leaves, `python -m hysync.softswitch` on 127.x addresses, as
tests/testbed/test_fabric_training.py starts them), the job installed across them by
`hysync --inventory FILE job add`, six ranks under one real `torchrun` (bench/
two_level_worker.py: the adaptive bench's MLP on the 8x8 digits, `--compute-ms` of emulated
compute a step), rank r the job file's r-th member: ranks 0-2 behind leaf-0, 3-5 behind
leaf-1. The configurations, over the same 6 ranks:

- `gloo`: plain DDP over gloo between the 6 ranks, no switch;
- `sync`: HySync, sync at every level (the job file's mode);
- `adaptive`: HySync from sync, with `hysync --inventory FILE policy run JOB` beside the
  run: one adaptive policy per switch on that switch's counters (a slow rack is a slow
  member of the spine; a slow host, of its leaf).

Scenarios: `none` (every host at the same pace) and `slow-rack` (every host of rack 1 -
leaf-1's three ranks - computes `--slowdown` times longer, as the one-switch benches make a
straggler). Each cell runs `--repeat` times, interleaved; run k trains from seed k, the same
for every cell. A run's time to target is the time its *slowest* rank first measured its
replica at `--target` held-out accuracy (each rank evaluates every 5 of its steps); rank 0's
own time is kept beside it. A rank whose training is done leaves the job at every level
through the switches' sessions, which a policy run holds: the bench ends the policy when the
first rank has applied the job's last update. A run ends when torchrun does; should a rank
still wait for a leaf-mate that stopped, the bench ends the run `--grace` seconds after the
first rank finished and says so in the row (`ended_by_bench`): its time to target stands.

Then `--rate`: the packet rate through a leaf and the spine against one switch for the same
stream: the native load generator (hysync._core.bench.LoadGenerator, as bench/
softswitch_bench.py loads one switch) with 4 workers, one contribution in flight per slot of
a `--window`, against (a) the UDP reflector (`python -m hysync.softswitch.reflect`, every
datagram straight back: the machine's limit), (b) one softswitch process holding a
one-switch job of 4 members, (c) the 4 workers behind one leaf whose sums go up to the
spine, (d) 2 workers behind each of two leaves. Contributions answered per second at the
workers, the datagrams per second each leaf sends up its uplink, and the serving processes'
CPU time per contribution answered (read from /proc over the same interval).

    .venv/bin/python -m bench.two_level_bench [--repeat 1] [--steps 300] [--rate-only]
        [--out two-level.json]

Prints a line per run; writes bench/results/two-level.json (`--out`) after every run (the
rows so far, the exact command), bench/results/two-level-rate.json after the rate runs, and
at the end bench/results/two-level.png (the `--out` file's name with .png). Every switch,
rank and the load generator share this machine's cores: the switches are processes, not
hardware.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bench.cells import add_speedups, cell_runs, spread, time_bars
from bench.launcher_logs import records
from hysync import _core, wire
from hysync.controlplane.cli.main import main as hysync_main
from hysync.controlplane.p4rt.switch import Switch
from hysync.topologies.rendezvous import torchrun_rendezvous
from tests.softswitch.switch_process import (
    SoftswitchFabric,
    softswitch_fabric,
    softswitch_process,
)
from tests.testbed.conftest import P4INFO, kill_tree, toml_text, tree

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
RUNS = ROOT / "runs" / "two-level-bench"
WORKER = ROOT / "bench" / "two_level_worker.py"
RACKS, HOSTS = 2, 3
SLOW_RACK = 1
JOB, SLOTS = 1, 32
CONFIGS = ("gloo", "sync", "adaptive")
SCENARIOS = ("none", "slow-rack")
RUN_TIMEOUT = 600  # seconds: a run that takes longer is recorded as failed
POLICY_INTERVAL = 0.25  # seconds between counter reads, as the emulated-rack benches run it

# The packet-rate part: 4 workers, as bench/softswitch_bench.py's loopback row.
RATE_WORKERS = 4
RATE_BASE_PORT = 47300
RATE_RTO_MS = 500.0
WARMUP_S = 1.0


def hysync(*argv: str) -> str:
    """`hysync ARGV` in this process; its output, or SystemExit with its error."""
    out, err = io.StringIO(), io.StringIO()
    if hysync_main(list(argv), stdout=out, stderr=err) != 0:
        raise SystemExit(f"hysync {shlex.join(argv)} failed: {err.getvalue().strip()}")
    return out.getvalue()


def free_udp_port(ipv4: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((ipv4, 0))
        return sock.getsockname()[1]


def write_job_file(path: Path, members: list[dict], window: int = SLOTS) -> Path:
    """Job JOB in sync over `members`, slots 0..window-1."""
    path.write_text(toml_text({"job_id": JOB, "mode": "sync",
                               "slots": {"base": 0, "count": window}, "members": members}))
    return path


def fabric(workdir: Path, leaves: int = RACKS) -> contextlib.AbstractContextManager:
    """A spine and `leaves` leaves, each its own native softswitch process, their pipelines
    pushed and the inventory written; stopped on the way out."""
    return softswitch_fabric(workdir, leaves=leaves, hosts=HOSTS, engine="native")


def training_members(fab: SoftswitchFabric) -> list[dict]:
    """The job file's members: host h of rack i on NET.10, a port free now (the address is
    this fabric's own, so nothing else takes it before the rank binds it)."""
    return [{"leaf": f"leaf-{i}", "worker": h, "ipv4": f"{fab.net}.10",
             "mac": f"02:00:00:00:1{i}:{h + 1:02x}", "udp_port": free_udp_port(f"{fab.net}.10"),
             "switch_port": h + 1} for i in range(RACKS) for h in range(HOSTS)]


class Launcher:
    """One `torchrun --nproc-per-node 6` of the worker; its output gathered as it comes."""

    def __init__(self, argv: list[str], log: Path, stack: contextlib.ExitStack) -> None:
        rendezvous = stack.enter_context(torchrun_rendezvous(1, timeout_s=RUN_TIMEOUT))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", *rendezvous,
             "--nproc-per-node", str(RACKS * HOSTS), str(WORKER), *argv],
            cwd=ROOT, env=dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1"),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        stack.callback(self.stop)
        self.log = log.open("w")
        stack.callback(self.log.close)
        self.text: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.text.append(line)
            self.log.write(line)
            self.log.flush()

    def records(self) -> list[dict]:
        return records(["".join(self.text)], "rank")

    def stop(self) -> None:
        kill_tree(self.proc)
        self.proc.wait()
        self.reader.join(10)


def wait_run(launcher: Launcher, grace: float,
             on_trained: Callable[[], None] = lambda: None) -> dict:
    """Until torchrun ends, or `grace` seconds after the first rank finished (a rank that
    waits for a stopped leaf-mate), or RUN_TIMEOUT; `on_trained` runs once, when the first
    rank has applied the job's last update."""
    began = time.monotonic()
    first_done: float | None = None
    trained = False
    outcome = None
    while launcher.proc.poll() is None:
        now = time.monotonic()
        if not trained and any("trained" in r for r in launcher.records()):
            trained = True
            on_trained()
        if now - began > RUN_TIMEOUT:
            outcome = f"did not finish within {RUN_TIMEOUT} s"
            break
        if first_done is None and any("accuracy" in r for r in launcher.records()):
            first_done = now
        if first_done is not None and now - first_done > grace:
            outcome = "ended_by_bench"
            break
        time.sleep(0.2)
    launcher.stop()
    row = {"outcome": outcome or "completed", "wall_s": round(time.monotonic() - began, 2)}
    if outcome is None and launcher.proc.returncode != 0:
        row["outcome"] = f"torchrun exited {launcher.proc.returncode}"
        errors = [line.strip() for line in launcher.text
                  if line.startswith("[rank") and "Error:" in line]
        row["error"] = errors[0][:400] if errors else "".join(launcher.text)[-400:]
    return row


def summarize(recs: list[dict], outcome: dict) -> dict:
    """The run's row: time to target (slowest rank, rank 0), accuracies, steps, modes."""
    reached = {r["rank"]: r["reached"] for r in recs if "reached" in r}
    final = {r["rank"]: r for r in recs if "accuracy" in r}
    ranks = RACKS * HOSTS
    row: dict = {**outcome,
                 "time_to_target_s": max(reached.values()) if len(reached) == ranks else None,
                 "rank0_time_to_target_s": reached.get(0),
                 "reached_ranks": len(reached), "finished_ranks": len(final)}
    if final:
        row["accuracy"] = [final[r]["accuracy"] for r in sorted(final)]
        row["steps"] = [final[r]["steps"] for r in sorted(final)]
        row["updates"] = [final[r]["updates"] for r in sorted(final)]
        row["train_s"] = max(r["seconds"] for r in final.values())
        modes: dict[str, int] = {}
        for r in final.values():
            for mode, n in r.get("modes", {}).items():
                modes[mode] = modes.get(mode, 0) + n
        if modes:
            row["results_by_mode"] = modes
    return row


def policy_summary(log: Path) -> dict:
    """What the policies did: decisions per level, and each decision's line."""
    decisions = []
    if log.exists():
        for line in log.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("action") in (None, "start") or "level" not in rec:
                continue
            decisions.append({k: rec[k] for k in ("time", "level", "action", "mode", "quorum",
                                                  "worker", "reason", "applied", "error")
                              if k in rec})
    per_level: dict[str, int] = {}
    for d in decisions:
        per_level[d["level"]] = per_level.get(d["level"], 0) + 1
    return {"decisions_per_level": per_level, "decisions": decisions[:20]}


def train_run(config: str, scenario: str, seed: int, args: argparse.Namespace) -> dict:
    """One training run of `config` in `scenario`; its row."""
    workdir = RUNS / f"{config}-{scenario}-{seed}"
    workdir.mkdir(parents=True, exist_ok=True)
    worker_argv = ["--steps", str(args.steps), "--compute-ms", str(args.compute_ms),
                   "--target", str(args.target), "--seed", str(seed), "--lr", str(args.lr),
                   "--hosts-per-rack", str(HOSTS), "--dead-after", str(args.dead_after)]
    if scenario == "slow-rack":
        worker_argv += ["--slow-rack", str(SLOW_RACK), "--slowdown", str(args.slowdown)]
    extra: dict = {}
    with contextlib.ExitStack() as stack:
        if config == "gloo":
            launcher = Launcher(["--backend", "gloo", *worker_argv], workdir / "ranks.log",
                                stack)
            outcome = wait_run(launcher, args.grace)
        else:
            fab = stack.enter_context(fabric(workdir))
            job = write_job_file(workdir / "job.toml", training_members(fab))
            hysync("--inventory", str(fab.inventory), "job", "add", str(job))
            policy: subprocess.Popen | None = None

            def stop_policy() -> None:
                # A policy run holds its switches' sessions; a rank that is done leaves the
                # job through them, so the policy ends when training does.
                # The ranks' leaves retry for --dead-after seconds: a policy that does not
                # end on Ctrl-C within a few is terminated, then killed.
                if policy is None:
                    return
                for end in (lambda: policy.send_signal(signal.SIGINT), policy.terminate,
                            policy.kill):
                    if policy.poll() is not None:
                        return
                    end()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        policy.wait(timeout=4)

            if config == "adaptive":
                policy_log = workdir / "policy.jsonl"
                policy_log.unlink(missing_ok=True)
                policy_out = stack.enter_context((workdir / "policy.out").open("w"))
                policy = subprocess.Popen(
                    [sys.executable, "-m", "hysync.controlplane.cli", "--inventory",
                     str(fab.inventory), "policy", "run", str(JOB), "--interval",
                     str(POLICY_INTERVAL), "--log", str(policy_log)],
                    cwd=ROOT, stdout=policy_out, stderr=subprocess.STDOUT)
            launcher = Launcher(["--backend", "hysync", "--inventory", str(fab.inventory),
                                 "--job", str(job), *worker_argv], workdir / "ranks.log", stack)
            outcome = wait_run(launcher, args.grace, on_trained=stop_policy)
            stop_policy()
            if policy is not None:
                extra["policy"] = policy_summary(workdir / "policy.jsonl")
    return {**summarize(launcher.records(), outcome), **extra}


def cells(runs: list[dict]) -> list[dict]:
    rows = []
    for scenario, config, mine in cell_runs(runs, SCENARIOS, CONFIGS):
        reached = [r["time_to_target_s"] for r in mine if r["time_to_target_s"]]
        rows.append({
            "scenario": scenario, "config": config, "runs": len(mine),
            "reached_target": f"{len(reached)} of {len(mine)}",
            "ended_by_bench": sum(r["outcome"] == "ended_by_bench" for r in mine),
            "failed": sum(r["outcome"] not in ("completed", "ended_by_bench") for r in mine),
            "time_to_target_s": spread(reached),
            "rank0_time_to_target_s": spread([r["rank0_time_to_target_s"] for r in mine
                                              if r["rank0_time_to_target_s"]]),
            "final_accuracy_min": min((min(r["accuracy"]) for r in mine if r.get("accuracy")),
                                      default=None)})
    add_speedups(rows, ("gloo", "sync"))
    return rows


def write_training(path: Path, args: argparse.Namespace, command: str,
                   runs: list[dict]) -> list[dict]:
    rows = cells(runs)
    data = {
        "what": "time to held-out accuracy (the slowest rank's), 2 racks x 3 hosts on "
                "loopback: 3 softswitch processes (2 leaves, a spine), 6 torchrun ranks; "
                "gloo over the 6 ranks, HySync sync at every level, HySync with "
                "`hysync policy run` (an adaptive policy per switch)",
        "command": command, "cpus": os.cpu_count(),
        "setup": {"racks": RACKS, "hosts_per_rack": HOSTS, "steps": args.steps,
                  "compute_ms": args.compute_ms, "slow_rack": f"leaf-{SLOW_RACK}",
                  "slowdown": args.slowdown, "target": args.target, "lr": args.lr,
                  "policy_interval_s": POLICY_INTERVAL, "dead_after_s": args.dead_after,
                  "grace_s": args.grace},
        "cells": rows, "runs": runs}
    RESULTS.mkdir(exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return rows


# ---- the packet rate -------------------------------------------------------------------

@contextlib.contextmanager
def reflector_process(ipv4: str, log: Path) -> Iterator[tuple[str, int]]:
    """`python -m hysync.softswitch.reflect` on ipv4 (the HySync port); its address."""
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hysync.softswitch.reflect", "--udp",
             f"{ipv4}:{wire.HYSYNC_UDP_PORT}"], cwd=ROOT, stdout=subprocess.PIPE, stderr=err,
            text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"the reflector did not start: {log.read_text()[-1000:]}")
        yield ipv4, wire.HYSYNC_UDP_PORT
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def servers_cpu_s() -> float:
    """CPU seconds (user + system) so far of this process's descendants: the switch or
    reflector processes serving the stream."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in tree(os.getpid())[1:]:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def load(targets: list[tuple[str, int, int, int]], window: int, seconds: float) -> dict:
    """Load generators, one per (switch ipv4, port, workers, base port), together; over the
    steady interval: contributions answered per second in all and per generator, and the
    serving processes' CPU microseconds per contribution answered (what the rate costs,
    which other load on the machine moves far less than the rate)."""
    gens = [_core.bench.LoadGenerator(ip, port, JOB, workers, base, 0, window, RATE_RTO_MS)
            for ip, port, workers, base in targets]
    for g in gens:
        g.start()
    try:
        time.sleep(WARMUP_S)
        c0, t0, cpu0 = [g.completed for g in gens], time.perf_counter(), servers_cpu_s()
        time.sleep(seconds)
        c1, t1, cpu1 = [g.completed for g in gens], time.perf_counter(), servers_cpu_s()
    finally:
        for g in gens:
            g.stop()
    per = [(b - a) / (t1 - t0) for a, b in zip(c0, c1, strict=True)]
    answered = sum(c1) - sum(c0)
    return {"answered_per_s": round(sum(per)), "per_generator": [round(p) for p in per],
            "servers_cpu_us_per_answer": round((cpu1 - cpu0) / max(answered, 1) * 1e6, 3),
            "retransmits": sum(g.retransmits for g in gens), "seconds": round(t1 - t0, 2)}


def rate_members(per_leaf: list[int], leaves: bool) -> list[dict]:
    """The load generators' workers as job members: generator g's worker w binds
    127.0.0.1:RATE_BASE_PORT + 10 g + w and has worker id w (behind leaf g)."""
    members = []
    for g, n in enumerate(per_leaf):
        for w in range(n):
            m = {"worker": w if leaves else len(members), "ipv4": "127.0.0.1",
                 "mac": f"02:00:00:00:2{g}:{w + 1:02x}", "udp_port": RATE_BASE_PORT + 10 * g + w,
                 "switch_port": w + 1 if leaves else len(members) + 1}
            if leaves:
                m["leaf"] = f"leaf-{g}"
            members.append(m)
    return members


def rate_run(layout: str, window: int, seconds: float) -> dict:
    """One measurement of `layout`: reflector, one-switch, one-leaf, two-leaves."""
    workdir = RUNS / "rate"
    workdir.mkdir(parents=True, exist_ok=True)
    net = f"127.{random.randrange(100, 250)}.{random.randrange(1, 250)}"
    with contextlib.ExitStack() as stack:
        if layout == "reflector":
            ip, port = stack.enter_context(reflector_process(f"{net}.1", workdir / "r.log"))
            row = load([(ip, port, RATE_WORKERS, RATE_BASE_PORT)], window, seconds)
        elif layout == "one-switch":
            grpc = stack.enter_context(softswitch_process(
                workdir / "switch.log", udp=f"{net}.1:{wire.HYSYNC_UDP_PORT}",
                engine="native")).grpc_addr
            with Switch(grpc) as switch:
                switch.push_pipeline(P4INFO)
            job = workdir / "job-one.toml"
            job.write_text(toml_text({"job_id": JOB, "mode": "sync",
                                      "slots": {"base": 0, "count": window},
                                      "members": rate_members([RATE_WORKERS], False)}))
            hysync("--grpc-addr", grpc, "job", "add", str(job))
            row = load([(f"{net}.1", wire.HYSYNC_UDP_PORT, RATE_WORKERS, RATE_BASE_PORT)],
                       window, seconds)
        else:
            per_leaf = [RATE_WORKERS] if layout == "one-leaf" else [RATE_WORKERS // 2] * 2
            fab = stack.enter_context(fabric(workdir, leaves=len(per_leaf)))
            job = write_job_file(workdir / f"job-{layout}.toml", rate_members(per_leaf, True),
                                 window)
            hysync("--inventory", str(fab.inventory), "job", "add", str(job))
            row = load([(f"{fab.net}.{2 + g}", wire.HYSYNC_UDP_PORT, n, RATE_BASE_PORT + 10 * g)
                        for g, n in enumerate(per_leaf)], window, seconds)
            # each leaf sends one sum up per round of a slot: its hosts' answers / its hosts
            row["uplink_datagrams_per_s"] = [round(p / n) for p, n in
                                             zip(row["per_generator"], per_leaf, strict=True)]
    return {"layout": layout, "workers": RATE_WORKERS, "window": window, **row}


RATE_LAYOUTS = ("reflector", "one-switch", "one-leaf", "two-leaves")


def rate_bench(args: argparse.Namespace, command: str) -> list[dict]:
    samples: dict[str, list[dict]] = {layout: [] for layout in RATE_LAYOUTS}
    for i in range(args.rate_repeat):
        for layout in RATE_LAYOUTS:
            row = rate_run(layout, args.window, args.rate_seconds)
            samples[layout].append(row)
            print(f"rate round {i + 1}/{args.rate_repeat} {layout}: "
                  f"{row['answered_per_s']:,} answered/s, {row['servers_cpu_us_per_answer']} "
                  f"server CPU us each ({row['retransmits']} retransmits)"
                  + (f", uplinks {row['uplink_datagrams_per_s']}/s"
                     if "uplink_datagrams_per_s" in row else ""), flush=True)
    rows = []
    for got in samples.values():
        got.sort(key=lambda r: r["answered_per_s"])
        rows.append({**got[len(got) // 2], "runs_per_s": [r["answered_per_s"] for r in got],
                     "servers_cpu_us_per_answer": statistics.median(
                         r["servers_cpu_us_per_answer"] for r in got)})
    by = {r["layout"]: r["answered_per_s"] for r in rows}
    for r in rows:
        r["share_of_reflector"] = round(r["answered_per_s"] / by["reflector"], 3)
        r["share_of_one_switch"] = round(r["answered_per_s"] / by["one-switch"], 3)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "two-level-rate.json").write_text(json.dumps({
        "what": "contributions answered per second at 4 workers (native load generator, one "
                "in flight per slot of the window), UDP loopback: the reflector, one "
                "softswitch, the 4 workers behind one leaf and the spine, 2 behind each of "
                "two leaves; every switch its own process on the same cores; beside each "
                "rate, the serving processes' CPU microseconds per contribution answered",
        "command": command, "cpus": os.cpu_count(),
        "load_avg_1min": round(os.getloadavg()[0], 2), "rows": rows}, indent=2) + "\n")
    return rows


def plot(rows: list[dict], rate_rows: list[dict] | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2 if rate_rows else 1, figsize=(12 if rate_rows else 7, 4.2),
                             squeeze=False)
    ax = axes[0][0]
    width = 0.27
    for i, config in enumerate(CONFIGS):
        time_bars(ax, rows, SCENARIOS, config, i, width)
        firsts = [(j + (i - 1) * width, row["rank0_time_to_target_s"]["median"])
                  for j, scenario in enumerate(SCENARIOS)
                  for row in rows if (row["scenario"], row["config"]) == (scenario, config)
                  and row["rank0_time_to_target_s"]]
        ax.plot([x for x, _ in firsts], [y for _, y in firsts], "k_", markersize=14,
                markeredgewidth=2, label="rank 0 (rack 0)" if i == 0 else None)
    ax.set_xticks(range(len(SCENARIOS)), ["every rack at pace", f"rack {SLOW_RACK} slow"])
    ax.set_ylabel("seconds to the target (slowest rank)")
    ax.set_title("2 racks x 3 hosts, 2 leaves + spine on loopback")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    if rate_rows:
        ax = axes[0][1]
        bars = ax.bar(range(len(rate_rows)), [r["answered_per_s"] / 1e3 for r in rate_rows],
                      color=["0.6", "C0", "C1", "C2"][:len(rate_rows)])
        ax.bar_label(bars, [f"{r['servers_cpu_us_per_answer']:.2f} CPU us"
                            if "servers_cpu_us_per_answer" in r else "" for r in rate_rows],
                     fontsize=8)
        ax.set_xticks(range(len(rate_rows)), [r["layout"] for r in rate_rows])
        ax.set_ylabel("thousand contributions answered / s")
        ax.set_title(f"{RATE_WORKERS} workers, UDP loopback")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{os.cpu_count()} cores shared by every switch and rank", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=1, help="runs per cell, interleaved")
    p.add_argument("--steps", type=int, default=300, help="updates each run applies")
    p.add_argument("--compute-ms", type=float, default=50.0)
    p.add_argument("--slowdown", type=float, default=2.0, help="the slow rack's factor")
    p.add_argument("--target", type=float, default=0.93, help="held-out accuracy")
    p.add_argument("--lr", type=float, default=0.03)
    p.add_argument("--dead-after", type=float, default=60.0,
                   help="seconds a HySync round waits for a member")
    p.add_argument("--grace", type=float, default=30.0,
                   help="seconds after the first rank finished before the run is ended")
    p.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    p.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    p.add_argument("--window", type=int, default=128, help="rate: slots in flight per worker")
    p.add_argument("--rate-seconds", type=float, default=3.0, help="rate: steady interval")
    p.add_argument("--rate-repeat", type=int, default=3, help="rate: runs per layout")
    part = p.add_mutually_exclusive_group()
    part.add_argument("--rate-only", action="store_true", help="only the packet rate")
    part.add_argument("--no-rate", action="store_true", help="only the training runs")
    p.add_argument("--out", default="two-level.json",
                   help="the training results' file name in bench/results/")
    args = p.parse_args(argv)
    if Path(args.out).name != args.out or not args.out.endswith(".json"):
        p.error(f"--out takes a file name ending .json (written in {RESULTS}), got {args.out!r}")
    for name in ("repeat", "steps", "window", "rate_repeat"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    command = ".venv/bin/python -m bench.two_level_bench " + shlex.join(
        sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out_path = RESULTS / args.out
    rows: list[dict] = []
    if not args.rate_only:
        runs: list[dict] = []
        total = args.repeat * len(args.scenarios) * len(args.configs)
        started = time.monotonic()
        for seed in range(args.repeat):
            for scenario in args.scenarios:
                for config in args.configs:
                    load_before = os.getloadavg()[0]
                    row = {"config": config, "scenario": scenario, "seed": seed,
                           **train_run(config, scenario, seed, args)}
                    row["load_1min"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
                    runs.append(row)
                    print(f"[{len(runs)}/{total}, {time.monotonic() - started:.0f} s] "
                          + json.dumps({k: v for k, v in row.items() if k != "policy"}),
                          flush=True)
                    rows = write_training(out_path, args, command, runs)
    elif out_path.exists():
        rows = json.loads(out_path.read_text())["cells"]
    rate_rows = None
    if not args.no_rate:
        rate_rows = rate_bench(args, command)
        for r in rate_rows:
            print(json.dumps(r), flush=True)
    elif (RESULTS / "two-level-rate.json").exists():
        rate_rows = json.loads((RESULTS / "two-level-rate.json").read_text())["rows"]
    plot(rows, rate_rows, out_path.with_suffix(".png"))
    for row in rows:
        print(json.dumps(row), flush=True)
    print(f"wrote {out_path.name}, two-level-rate.json and {out_path.with_suffix('.png').name} "
          f"in {RESULTS}", flush=True)


if __name__ == "__main__":
    main()
