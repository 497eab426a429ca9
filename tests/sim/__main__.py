"""`make simulate`: run seeds through the deterministic simulation, shrink what fails.

    python -m tests.sim --seeds 1000 [--start 0] [--targets native,python] [--kinds ...]
    python -m tests.sim --seeds 1000 --kinds straggler     # the straggler plans instead
    python -m tests.sim --seed 1234 --targets python          # replay one seed
    python -m tests.sim --plan '<json>' --targets native      # replay a shrunk plan
    python -m tests.sim --seeds 1000 --hosts drawn    # members are hosts of 1-8 ranks
    python -m tests.sim --seeds 100 --hosts 32x4      # a job of 128 ranks on 32 hosts
    python -m tests.sim --seeds 1000 --targets tna-model --fault-model full
                                        # the TNA model under every fault, not the Tofino's

Each target meets the plans of its own program's fault model (docs/protocol.md §10, "The
fault model per target"): native and python every fault, tna-model the Tofino program's
(a seed's plan there keeps no swap into or out of async and no copy of a worker's
datagram); --fault-model full gives every target every fault.

With --out FILE (`make simulate` gives bench/results/simulate.json), writes seeds, simulated
packets and swaps, violations and simulated seconds per CPU second there; without it a run
writes no file, so replaying a seed never replaces a committed sweep. Exit status 1 if any run
violated an invariant; each violation is printed with its one-line reproduction.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from .check import RULES, check
from .plan import (
    FAULT_KINDS,
    FAULT_MODELS,
    FULL,
    HOST_KINDS,
    HOSTS_DRAWN,
    TARGET_FAULT_MODEL,
    TOFINO,
    Link,
    Plan,
    draw,
    host_layout,
)
from .run import simulate

TARGETS = tuple(TARGET_FAULT_MODEL)
# --fault-model: "target" (each target's own, plan.TARGET_FAULT_MODEL) or one of
# plan.FAULT_MODELS for every target.
BY_TARGET = "target"


def fault_model(target: str, chosen: str = BY_TARGET) -> str:
    """The fault model a target's plans are drawn within."""
    return TARGET_FAULT_MODEL[target] if chosen == BY_TARGET else chosen


def plans_of(seed: int, targets: list[str], kinds: tuple[str, ...], hosts: str,
             chosen: str = BY_TARGET) -> list[tuple[Plan, str]]:
    """Seed `seed`'s run on each target: its plan drawn within the target's fault model."""
    drawn: dict[str, Plan] = {}
    runs = []
    for target in targets:
        model = fault_model(target, chosen)
        if model not in drawn:
            drawn[model] = draw(seed, kinds, hosts, model)
        runs.append((drawn[model], target))
    return runs


def violations(plan: Plan, target: str, **options: object) -> tuple[list[str], object]:
    rec, sim = simulate(plan, target, **options)
    return check(rec, sim), rec


def shrink(plan: Plan, target: str, budget: int = 60) -> Plan:
    """Greedily drop faults, calls, keys and network trouble while the run still fails."""
    tries = 0

    def fails(p: Plan) -> bool:
        nonlocal tries
        tries += 1
        try:
            return bool(violations(p, target)[0])
        except Exception:  # noqa: BLE001 - a crash is a failure too
            return True

    changed = True
    while changed and tries < budget:
        changed = False
        candidates: list[Plan] = [plan.without(i) for i in reversed(range(len(plan.faults)))]
        if plan.calls > 1:
            candidates.append(replace(plan, calls=max(1, plan.calls // 2)))
            candidates.append(replace(plan, calls=plan.calls - 1))
        if len(plan.sizes) > 1:
            candidates.append(replace(plan, sizes=plan.sizes[:-1]))
        if plan.up != Link(delay=plan.up.delay, fifo=plan.up.fifo):
            candidates.append(replace(plan, up=Link(delay=plan.up.delay, fifo=plan.up.fifo)))
        if plan.down != Link(delay=plan.down.delay, fifo=plan.down.fifo):
            candidates.append(replace(plan, down=Link(delay=plan.down.delay,
                                                      fifo=plan.down.fifo)))
        for cand in candidates:
            if tries >= budget:
                break
            if fails(cand):
                plan, changed = cand, True
                break
    return plan


@dataclass
class Sweep:
    """What a batch of runs added up to."""
    totals: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("runs", "packets", "swaps", "sim_seconds", "state_resets", "nonfinite_given",
         "nonfinite_rounds", "runs_of_32_hosts"), 0))
    # per rule of check.RULES: what it allowed (docs/protocol.md §10, "Allowed, by rule")
    excused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RULES, 0))
    by_kind: dict[str, int] = field(default_factory=dict)
    by_ranks: dict[int, int] = field(default_factory=dict)  # runs per ranks per host
    failures: list[dict[str, object]] = field(default_factory=list)
    cpu_seconds: float = 0.0
    seeds: int = 0

    def add(self, other: Sweep) -> None:
        self.seeds += other.seeds
        for k, v in other.totals.items():
            self.totals[k] += v
        for k, v in other.by_kind.items():
            self.by_kind[k] = self.by_kind.get(k, 0) + v
        for r, v in other.by_ranks.items():
            self.by_ranks[r] = self.by_ranks.get(r, 0) + v
        for k, v in other.excused.items():
            self.excused[k] = self.excused.get(k, 0) + v
        self.failures += other.failures
        self.cpu_seconds += other.cpu_seconds


def sweep(runs: list[tuple[Plan, str]], *, shrinking: bool, replaying: bool,
          some_kinds: str = "", options: dict[str, object] | None = None) -> Sweep:
    """Run each plan on its target; print each violation with its reproduction."""
    out = Sweep()
    options = options or {}
    cpu0 = time.process_time()
    for plan, target in runs:
        if "trace" in options:
            options["trace"](f"# seed {plan.seed} on {target}")  # type: ignore[operator]
        try:
            found, rec = violations(plan, target, **options)
        except Exception as err:  # noqa: BLE001 - a crash is reported as a violation
            found, rec = [f"crash: {type(err).__name__}: {err}"], None
        out.totals["runs"] += 1
        for k in plan.kinds():
            out.by_kind[k] = out.by_kind.get(k, 0) + 1
        out.by_ranks[plan.ranks_per_host] = out.by_ranks.get(plan.ranks_per_host, 0) + 1
        out.totals["runs_of_32_hosts"] += plan.workers == 32
        if rec is not None:
            for k in ("packets", "swaps", "sim_seconds", "state_resets",
                      "nonfinite_rounds"):
                out.totals[k] += getattr(rec, k)
            for k, v in rec.excused.items():
                out.excused[k] = out.excused.get(k, 0) + v
            out.totals["nonfinite_given"] += len(plan.nonfinite)
        if not found:
            continue
        repro = (f"python -m tests.sim --targets {target} --plan '{plan.to_json()}'"
                 if replaying else f"make simulate SEED={plan.seed} TARGETS={target}"
                 f"{some_kinds}")
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        print(f"VIOLATION seed {plan.seed} on {target}: {found[0]}{more}\n"
              f"  reproduce: {repro}", flush=True)
        entry: dict[str, object] = {"seed": plan.seed, "target": target,
                                    "violations": found[:20],
                                    "violations_found": len(found)}
        if shrinking:
            small = shrink(plan, target)
            entry["shrunk"] = small.to_json()
            print(f"  shrunk ({len(small.faults)} of {len(plan.faults)} faults, "
                  f"{small.calls} calls): python -m tests.sim --targets {target} "
                  f"--plan '{small.to_json()}'", flush=True)
        out.failures.append(entry)
    out.cpu_seconds = time.process_time() - cpu0
    out.seeds = len({plan.seed for plan, _target in runs})
    return out


def _sweep_chunk(job: tuple[int, int, tuple[str, ...], list[str], bool, str, float, str, str]
                 ) -> Sweep:
    start, count, kinds, targets, shrinking, some_kinds, deadline, hosts, chosen = job
    if time.time() > deadline:  # --time-limit: the seeds left are not run
        return Sweep()
    runs = [run for s in range(start, start + count)
            for run in plans_of(s, targets, kinds, hosts, chosen)]
    return sweep(runs, shrinking=shrinking, replaying=False, some_kinds=some_kinds)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=200, help="how many seeds (default 200)")
    ap.add_argument("--start", type=int, default=0, help="the first seed")
    ap.add_argument("--seed", type=int, help="replay this one seed")
    ap.add_argument("--plan", help="replay this plan (JSON, as a shrink prints it)")
    ap.add_argument("--targets", default="native,python",
                    help=f"comma-separated, of {', '.join(TARGETS)}")
    ap.add_argument("--kinds", default=",".join(FAULT_KINDS),
                    help="fault kinds the seeds may draw; 'straggler' alone: the straggler "
                         "plans (a slow member, the adaptive policy's swaps)")
    ap.add_argument("--hosts", default="",
                    help=f"members are hosts of several ranks, reduced on the host first: "
                         f"'{HOSTS_DRAWN}' (1-8 ranks per host, drawn per seed; 2%% of the "
                         "seeds: 128 ranks on 32 hosts) or HxR (H "
                         "hosts of R ranks, e.g. 32x4); the fault kinds then include "
                         f"{', '.join(HOST_KINDS)} (default: one rank per member)")
    ap.add_argument("--fault-model", default=BY_TARGET, choices=(BY_TARGET, *FAULT_MODELS),
                    help=f"'{BY_TARGET}' (default): each target meets the faults of the program "
                         f"it stands for (tna-model: the Tofino program's, no swap into or out "
                         f"of async and no copy of a worker's datagram); '{FULL}': every "
                         f"target meets every fault; '{TOFINO}': every target the Tofino's")
    ap.add_argument("--out", default=None, help="where to write the summary (no file without it)")
    ap.add_argument("--no-shrink", action="store_true")
    ap.add_argument("--time-limit", type=float, default=float("inf"), metavar="SECONDS",
                    help="with --jobs: start no more seeds after this long; the summary "
                         "counts the seeds that ran")
    ap.add_argument("--jobs", type=int, default=1,
                    help="processes that run seeds side by side (default 1; 0: one per CPU)")
    ap.add_argument("--trace", metavar="FILE",
                    help="write every packet, swap, pause and call of the runs to FILE "
                         "(one line each, simulated time first; '-' for stdout)")
    args = ap.parse_args(argv)
    targets = [t for t in args.targets.split(",") if t]
    for t in targets:
        if t not in TARGETS:
            ap.error(f"unknown target {t!r}: one of {', '.join(TARGETS)}")
    kinds = tuple(k for k in args.kinds.split(",") if k)
    if args.hosts:
        try:
            host_layout(args.hosts)
        except ValueError as err:
            ap.error(str(err))
        if kinds == ("straggler",):
            ap.error("--hosts: the straggler plans draw no host layout; leave one of them out")
        if args.kinds == ap.get_default("kinds"):  # every kind: the in-host ones too
            kinds += HOST_KINDS
    jobs = args.jobs or os.cpu_count() or 1
    # A sweep runs in worker processes (one too) so that it writes its summary after every
    # chunk of seeds: a sweep stopped from outside keeps what it ran.
    parallel = not (args.plan or args.seed is not None or args.trace)
    if args.plan:
        runs = [(Plan.from_json(args.plan), t) for t in targets]
    elif args.seed is not None:
        runs = plans_of(args.seed, targets, kinds, args.hosts, args.fault_model)
    elif parallel:
        runs = []  # each process draws its own
    else:
        runs = [run for s in range(args.start, args.start + args.seeds)
                for run in plans_of(s, targets, kinds, args.hosts, args.fault_model)]
    seeds = sorted({plan.seed for plan, _target in runs})

    some_kinds = "" if kinds in (FAULT_KINDS, FAULT_KINDS + HOST_KINDS) else \
        f" KINDS={','.join(kinds)}"
    if args.hosts:
        some_kinds += f" HOSTS={args.hosts}"
    if args.fault_model != BY_TARGET:
        some_kinds += f" FAULT_MODEL={args.fault_model}"
    wall0 = time.monotonic()
    write_out = bool(args.out) and not args.plan and args.seed is None

    def summary_of(result: Sweep, complete: bool) -> dict[str, object]:
        totals, cpu = result.totals, result.cpu_seconds
        return {
            "seeds": len(seeds) or result.seeds, "seeds_asked": len(seeds) or args.seeds,
            "first_seed": seeds[0] if seeds else args.start, "complete": complete,
            "targets": targets, "kinds": list(kinds), "hosts": args.hosts or "one rank each",
            "fault_model": {t: fault_model(t, args.fault_model) for t in targets},
            **totals, "runs_by_ranks_per_host": dict(sorted(result.by_ranks.items())),
            "excused_by_rule": result.excused, "runs_by_fault_kind": result.by_kind,
            "violations": len(result.failures),
            "failures": result.failures, "cpu_seconds": round(cpu, 3),
            "jobs": jobs if parallel else 1,
            "wall_seconds": round(time.monotonic() - wall0, 1),
            "sim_seconds_per_cpu_second": round(totals["sim_seconds"] / cpu, 2) if cpu else None,
        }

    def write(summary: dict[str, object]) -> None:
        if write_out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")

    if parallel:
        chunk = max(1, min(250, args.seeds // (jobs * 4)))
        deadline = time.time() + args.time_limit
        work = [(s, min(chunk, args.start + args.seeds - s), kinds, targets,
                 not args.no_shrink, some_kinds, deadline, args.hosts, args.fault_model)
                for s in range(args.start, args.start + args.seeds, chunk)]
        result = Sweep()
        with multiprocessing.Pool(jobs) as pool:
            for done, part in enumerate(pool.imap_unordered(_sweep_chunk, work), 1):
                result.add(part)
                # The summary so far, after every chunk: a sweep stopped from outside (a
                # machine's time limit) keeps what it ran, marked "complete": false.
                write(summary_of(result, complete=False))
                if done % max(1, len(work) // 20) == 0 or done == len(work):
                    print(f"{result.seeds} of {args.seeds} seeds, "
                          f"{len(result.failures)} violations, "
                          f"{time.monotonic() - wall0:.0f} s", file=sys.stderr, flush=True)
    else:
        options: dict[str, object] = {}
        if args.trace:
            sink = sys.stdout if args.trace == "-" else open(args.trace, "w")  # noqa: SIM115
            options["trace"] = lambda line: print(line, file=sink)
        result = sweep(runs, shrinking=not args.no_shrink and not args.plan
                       and args.seed is None, replaying=bool(args.plan), some_kinds=some_kinds,
                       options=options)
    summary = summary_of(result, complete=result.seeds == (len(seeds) or args.seeds))
    print(json.dumps({k: v for k, v in summary.items() if k != "failures"}))
    write(summary)
    return 1 if result.failures else 0


if __name__ == "__main__":
    sys.exit(main())
