"""Hosts of two ranks on the emulated rack: HySync's host level against gloo over every
rank and against HySync with one member per rank, with one slow host and with none.

`hysync rack up 3 --ranks-per-host 2` builds the rack (network namespaces, the softswitch
on its raw data plane), `hysync deploy` and `hysync serve` (the adaptive policy, at the
pace of tests/testbed/test_emulated.py: --policy-interval 0.25 --policy-scale 0.5) run as
docs/testbed.md says, and every run is one torchrun per host namespace, two ranks each,
of bench/rack_hosts_worker.py (the adaptive bench's MLP on the digits, `--compute-ms`
of emulated compute a step). The configurations, over the same 6 ranks:

- `gloo`: plain DDP over gloo between all 6 ranks, through the rack's veths;
- `hysync-hosts`: HYSYNC_RANKS_PER_HOST=local: each host's 2 ranks reduce there first
  (gloo), the host's leader is the switch member: 3 members, the adaptive policy;
- `hysync-ranks`: every rank its own switch member: 6 members, the adaptive policy.

Scenarios: `none` (every host at the same pace) and `slow` (host 2's two ranks compute
`--slowdown` times longer: a slow GPU server). Every (scenario, configuration) runs
`--repeat` times, interleaved (all cells once, then again), so that the machine's load,
which changes over minutes, is shared out; each run trains from its own seed, the same
for every cell of that repeat. Rank 0 (on a fast host) notes the time its replica first
reaches `--target` held-out accuracy; per cell the JSON has the median and the spread
(min, max) of that time and of the training loop's seconds, every rank's final accuracy,
and for `hysync-hosts` the host level's share of the leaders' steps (the host reduce and
broadcast seconds over the training loop's, hysync/host_group.py HostTimings).

    .venv/bin/python -m bench.rack_hosts_bench [--repeat 3] [--steps 150]

needs root (network namespaces). Prints a line per run; writes
bench/results/rack-hosts.json after every run (the rows so far, the exact command) and
at the end bench/results/rack-hosts.png. Takes about a minute a run on a quiet 2-core
machine, more on a loaded one.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.cells import add_speedups, cell_runs, spread, time_bars
from bench.launcher_logs import read_back, records
from hysync.controlplane.testbed.addresses import host_ip
from hysync.controlplane.testbed.netns import missing_netns_tools
from tests.testbed.conftest import kill_tree

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
RUNS = ROOT / "runs" / "rack-hosts-bench"
WORKER = ROOT / "bench" / "rack_hosts_worker.py"
HOSTS, RANKS_PER_HOST = 3, 2
SLOW_HOST = 2  # torchrun's node rank (GROUP_RANK) of the slow host: the rack's h3
CONFIGS = {
    "gloo": {"backend": "gloo", "ranks_per_host": None},
    "hysync-hosts": {"backend": "hysync", "ranks_per_host": "local"},
    "hysync-ranks": {"backend": "hysync", "ranks_per_host": "1"},
}
SCENARIOS = ("none", "slow")
RUN_TIMEOUT = 300  # seconds: a run that takes longer is recorded as failed
BASE_PORT = 29600  # torchrun's master port: one per run (no TIME_WAIT left by the last)


def hysync(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hysync.controlplane.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def must(done: subprocess.CompletedProcess, what: str) -> None:
    if done.returncode != 0:
        raise SystemExit(f"{what} failed: {done.stderr.strip() or done.stdout.strip()}")


class Rack:
    """The rack, deployed and served, for the bench's lifetime."""

    def __init__(self, tag: str, interval: float, scale: float) -> None:
        RUNS.mkdir(parents=True, exist_ok=True)
        self.tag, self.inventory = tag, RUNS / "rack.toml"
        self.policy_log = RUNS / "policy.jsonl"
        self.policy_log.unlink(missing_ok=True)
        must(hysync("rack", "up", str(HOSTS), "--tag", tag, "--inventory", str(self.inventory),
                    "--ranks-per-host", str(RANKS_PER_HOST)), "hysync rack up")
        self.serve: subprocess.Popen | None = None
        try:
            must(hysync("deploy", str(self.inventory)), "hysync deploy")
            self.serve_log = (RUNS / "serve.log").open("w")
            self.serve = subprocess.Popen(
                [sys.executable, "-m", "hysync.controlplane.cli", "serve", str(self.inventory),
                 "--policy", "adaptive", "--policy-interval", str(interval), "--policy-scale",
                 str(scale), "--policy-log", str(self.policy_log)],
                cwd=ROOT, stdout=self.serve_log, stderr=subprocess.STDOUT)
            time.sleep(3)
            if self.serve.poll() is not None:
                raise SystemExit(f"hysync serve ended: {(RUNS / 'serve.log').read_text()}")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.serve is not None:
            self.serve.terminate()
            self.serve.wait(timeout=20)
            self.serve_log.close()
            hysync("teardown", str(self.inventory))
        hysync("rack", "down", "--tag", self.tag)

    def run(self, config: str, scenario: str, seed: int, port: int,
            args: argparse.Namespace) -> dict:
        """One training run of `config` in `scenario`: the ranks' result lines."""
        c = CONFIGS[config]
        procs, logs = [], []
        slow = ["--slow-host", str(SLOW_HOST), "--slowdown", str(args.slowdown)] \
            if scenario == "slow" else []
        for node in range(HOSTS):
            env = ["env", f"GLOO_SOCKET_IFNAME={self.tag}h{node + 1}", "OMP_NUM_THREADS=1",
                   f"HYSYNC_HOST=h{node + 1}"]
            if c["ranks_per_host"] is not None:
                env.append(f"HYSYNC_RANKS_PER_HOST={c['ranks_per_host']}")
            command = [
                "ip", "netns", "exec", f"{self.tag}-h{node + 1}", *env,
                sys.executable, "-m", "torch.distributed.run", "--nnodes", str(HOSTS),
                "--nproc-per-node", str(RANKS_PER_HOST), "--node-rank", str(node),
                "--master-addr", host_ip(0), "--master-port", str(port), str(WORKER),
                "--backend", c["backend"], "--inventory", str(self.inventory),
                "--steps", str(args.steps), "--compute-ms", str(args.compute_ms),
                "--target", str(args.target), "--seed", str(seed), *slow]
            log = (RUNS / f"{config}-{scenario}-{seed}-h{node + 1}.log").open("w+")
            logs.append(log)
            procs.append(subprocess.Popen(command, cwd=ROOT, stdout=log,
                                          stderr=subprocess.STDOUT))
        began = time.monotonic()
        error = None
        try:
            while any(p.poll() is None for p in procs):
                if time.monotonic() - began > RUN_TIMEOUT:
                    error = f"did not finish within {RUN_TIMEOUT} s"
                    break
                time.sleep(0.5)
        finally:
            for p in procs:
                kill_tree(p)  # `ip netns exec` became torchrun; its ranks are children
                p.wait()
        outputs = read_back(logs)
        if error is None and any(p.returncode for p in procs):
            error = "a launcher failed: " + " | ".join(
                out[-600:] for p, out in zip(procs, outputs, strict=True) if p.returncode)
        ranks = {r["rank"]: r for r in records(outputs, "rank")}
        if error is None and sorted(ranks) != list(range(HOSTS * RANKS_PER_HOST)):
            error = f"ranks {sorted(ranks)} reported, not all 6"
        return {"error": error, "wall_s": round(time.monotonic() - began, 2),
                "ranks": [ranks[r] for r in sorted(ranks)]}


def summary(run: dict) -> dict:
    """What a run's rows say: rank 0's time to target, the loop's seconds, accuracies,
    and the host level's share of the leaders' loops."""
    ranks = run["ranks"]
    out: dict = {"error": run["error"], "wall_s": run["wall_s"]}
    if not ranks or ranks[0]["rank"] != 0:
        return out
    out.update(time_to_target_s=ranks[0]["time_to_target"],
               train_s=max(r["seconds"] for r in ranks),
               accuracy=[r["accuracy"] for r in ranks],
               steps=[r["steps"] for r in ranks])
    leaders = [r for r in ranks if "host_timings" in r]
    if leaders:
        out["host_level_share"] = [round((t["reduce_s"] + t["broadcast_s"]) / r["seconds"], 4)
                                   for r in leaders for t in [r["host_timings"]]]
        out["switch_share"] = [round(t["switch_s"] / r["seconds"], 4)
                               for r in leaders for t in [r["host_timings"]]]
        out["host_level_ms_per_call"] = [
            round(1e3 * (t["reduce_s"] + t["broadcast_s"]) / max(t["calls"], 1), 3)
            for r in leaders for t in [r["host_timings"]]]
    return out


def cells(runs: list[dict]) -> list[dict]:
    rows = []
    for scenario, config, mine in cell_runs(runs, SCENARIOS, CONFIGS):
        ok = [r for r in mine if r["error"] is None]
        reached = [r["time_to_target_s"] for r in ok if r.get("time_to_target_s")]
        row = {"scenario": scenario, "config": config, "runs": len(mine),
               "failed": len(mine) - len(ok),
               "reached_target": f"{len(reached)} of {len(ok)}",
               "time_to_target_s": spread(reached, 3),
               "train_s": spread([r["train_s"] for r in ok], 3),
               "final_accuracy_min": min((min(r["accuracy"]) for r in ok), default=None)}
        shares = [s for r in ok for s in r.get("host_level_share", [])]
        if shares:
            row["host_level_share"] = spread(shares, 3)
            row["switch_share"] = spread([s for r in ok for s in r["switch_share"]], 3)
            row["host_level_ms_per_call"] = spread(
                [s for r in ok for s in r["host_level_ms_per_call"]], 3)
        rows.append(row)
    add_speedups(rows, ("gloo",))
    return rows


def plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.25
    for i, config in enumerate(CONFIGS):
        time_bars(ax, rows, SCENARIOS, config, i, width)
    ax.set_xticks(range(len(SCENARIOS)), ["every host at pace", f"host h{SLOW_HOST + 1} slow"])
    ax.set_ylabel("seconds to the target accuracy (rank 0)")
    ax.set_title("3 hosts x 2 ranks on the emulated rack: median, min-max")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--steps", type=int, default=150, help="updates each run applies")
    p.add_argument("--compute-ms", type=float, default=20.0)
    p.add_argument("--slowdown", type=float, default=3.0, help="the slow host's factor")
    p.add_argument("--target", type=float, default=0.9, help="held-out accuracy")
    p.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    p.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    p.add_argument("--tag", default=f"hb{os.getpid() % 10000}", help="the rack's tag")
    p.add_argument("--results", default="rack-hosts.json")
    args = p.parse_args(argv)
    reason = missing_netns_tools("the bench builds an emulated rack")
    if reason:
        raise SystemExit(reason)
    command = ".venv/bin/python -m bench.rack_hosts_bench " + shlex.join(
        sys.argv[1:] if argv is None else argv)
    out_path = RESULTS / args.results
    runs: list[dict] = []
    total = args.repeat * len(args.scenarios) * len(args.configs)
    # SIGTERM ends the bench as Ctrl-C does: the runs stopped, the rack taken down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rack = Rack(args.tag, interval=0.25, scale=0.5)
    started = time.monotonic()
    try:
        for seed in range(args.repeat):
            for scenario in args.scenarios:
                for config in args.configs:
                    load = os.getloadavg()[0]
                    port = BASE_PORT + len(runs)
                    result = summary(rack.run(config, scenario, seed, port, args))
                    row = {"config": config, "scenario": scenario, "seed": seed,
                           "load_1min": [round(load, 2), round(os.getloadavg()[0], 2)],
                           **result}
                    runs.append(row)
                    print(f"[{len(runs)}/{total}, {time.monotonic() - started:.0f} s] "
                          + json.dumps(row), flush=True)
                    write(out_path, args, command, runs)
    finally:
        rack.close()
    rows = write(out_path, args, command, runs)
    plot(rows, out_path.with_suffix(".png"))
    for row in rows:
        print(json.dumps(row), flush=True)


def write(path: Path, args: argparse.Namespace, command: str, runs: list[dict]) -> list[dict]:
    rows = cells(runs)
    data = {
        "what": "time to held-out accuracy of rank 0 (on a fast host), 3 hosts x 2 ranks on "
                "the emulated rack: gloo over 6 ranks, HySync with hosts reduced first (3 "
                "members), HySync with 6 one-rank members; the adaptive policy in serve",
        "command": command, "cpus": os.cpu_count(),
        "setup": {"hosts": HOSTS, "ranks_per_host": RANKS_PER_HOST, "steps": args.steps,
                  "compute_ms": args.compute_ms, "slow_host": f"h{SLOW_HOST + 1}",
                  "slowdown": args.slowdown, "target": args.target,
                  "policy_interval_s": 0.25, "policy_scale": 0.5},
        "cells": rows, "runs": runs}
    RESULTS.mkdir(exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main()
