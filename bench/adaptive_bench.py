"""Adaptive synchronization against the fixed configurations, scenario by scenario.

Every scenario (homogeneous; 1 of 4 workers 2x and 4x slower; intermittent; recovering;
a worker that dies) with every configuration (DDP over gloo, HySync sync, fixed
partial(3), adaptive), on the embedded default (softswitch on UDP loopback, workers
as local processes - the harness of `make demo`), `--repeat` runs per cell:

    .venv/bin/python -m bench.adaptive_bench [--scenarios homogeneous constant-2x ...]
                                             [--configs gloo adaptive ...] [--repeat 2]

`--scenarios cnn` runs the 118k-parameter CNN (topologies/scenarios/cnn.toml; not in
the default set: minutes per HySync run on 2 cores). `--configs async` adds HySync in
async from the first step (not in the default set either).

Each run records the machine's load average (1 minute) at its start and end and the
number of the policy's decisions: the bench run on a quiet machine and again beside two
CPU hogs (`yes > /dev/null &` twice) shows whether the policy holds on a busy one, e.g.

    .venv/bin/python -m bench.adaptive_bench --scenarios constant-2x --configs adaptive \
        --repeat 3 --results adaptive-load-quiet.json

Writes bench/results/adaptive.json (one row per cell: time to the scenario's target
accuracy, final accuracy, throughput, the time per step split into compute, waiting for
the switch and communication, the speed-ups of adaptive over sync and gloo, the
policy's decisions; the rows of the scenarios not run are kept) with the goals checked,
bench/results/adaptive.png (time to target per cell), and per scenario
bench/results/adaptive-<scenario>.png (accuracy over time, iteration times, mode
timeline with the policy's exclusions and readmissions); with `--results NAME.json`,
NAME.json, NAME.png and NAME-<scenario>.png instead. The workers' logs and the policy's
decision log (policy.jsonl) are under runs/adaptive-bench/.
A configuration that fails (gloo cannot go on when a worker dies) is a row with its
error, not a missing one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import asdict
from pathlib import Path

from hysync.controlplane.controller import Controller
from hysync.topologies import report
from hysync.topologies.runner import REPO, LocalHarness, RunConfig, RunFailed, connect, run_config
from hysync.topologies.scenario import load_scenario

RESULTS = Path(__file__).resolve().parent / "results"
SCENARIOS = ("homogeneous", "constant-2x", "constant-4x", "intermittent", "recovering", "dies")
# Not in the default set (minutes per HySync run on 2 cores): the 118k-parameter CNN.
MORE_SCENARIOS = ("cnn",)
CONFIGS = {
    "gloo": RunConfig("gloo", "gloo"),
    "sync": RunConfig("hysync-sync", "hysync", "sync"),
    "partial(3)": RunConfig("hysync-partial(3)", "hysync", "partial", 3),
    "adaptive": RunConfig("hysync-adaptive", "hysync", "adaptive"),
    # Not in the default set: async from the first step, beside partial(3), shows what
    # stale gradients cost a run (docs/performance.md, "A model whose communication matters").
    "async": RunConfig("hysync-async", "hysync", "async"),
}
DEFAULT_CONFIGS = ("gloo", "sync", "partial(3)", "adaptive")
# The goals: adaptive >= 1.4x faster to the target than sync and gloo with one
# persistent straggler of 2x or more; within 5% of sync when homogeneous; final accuracy
# within 1 point of sync everywhere.
PERSISTENT = ("constant-2x", "constant-4x")
MIN_SPEEDUP = 1.4
HOMOGENEOUS_SLACK = 0.05
ACCURACY_POINTS = 0.01


def run_scenario(name: str, configs: list[str], out: Path, repeat: int,
                 stem: str = "adaptive") -> list[dict]:
    """Every configuration `repeat` times, interleaved (A B C D A B C D ...) so that a
    change of the machine's load over time is shared out; one row per configuration
    with the medians (time to target, throughput) and means (final accuracy).

    Run k trains from seed k - 1 (the model's initialization, the data split, the
    batches), the same for every configuration of the run: a trajectory is chaotic, so
    runs of one seed would time one trajectory again and again (docs/performance.md,
    "Why several seeds")."""
    scenario = load_scenario(REPO / "topologies" / "scenarios" / f"{name}.toml")
    stragglers = {s.worker for s in scenario.stragglers}
    harness = LocalHarness(out / name)
    results: dict[str, list[dict]] = {key: [] for key in configs}
    errors: dict[str, str] = {}
    plotted, actions = {}, {}
    try:
        with connect(harness) as switch:
            controller = Controller(switch).attach()
            for r in range(repeat):
                for key in configs:
                    if key in errors:  # a failure is the configuration's, not the run's
                        continue
                    config = CONFIGS[key]
                    started = time.monotonic()
                    load_before = os.getloadavg()[0]
                    print(f"adaptive bench: {name} / {key} (run {r + 1} of {repeat}, seed {r}) ...",
                          flush=True)
                    try:
                        logs, swaps = run_config(harness, controller, scenario, config,
                                                 out / name / f"run{r + 1}", seed=r)
                    except RunFailed as err:
                        errors[key] = str(err)
                        print(f"  failed after {time.monotonic() - started:.0f} s: {err}")
                        continue
                    s = report.summarize(key, logs, scenario.target_accuracy, stragglers)
                    results[key].append({
                        "seed": r, "time_to_target_s": _round(s.time_to_target_s, 3),
                        "final_accuracy": round(s.final_accuracy, 4),
                        "throughput": round(s.throughput, 2), "duration_s": round(s.duration_s, 2),
                        "compute_ms": round(s.compute_ms, 1), "wait_ms": _round(s.wait_ms, 1),
                        "comm_ms": round(s.comm_ms, 1),
                        "load_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                        "decision_count": len(swaps),
                        "decisions": [asdict(x) for x in swaps]})
                    if r == 0:
                        plotted[config.name] = logs
                        actions[config.name] = [asdict(x) for x in swaps]
                    print(f"  time to {scenario.target_accuracy:.0%}: "
                          f"{_text(s.time_to_target_s)} s, final accuracy "
                          f"{s.final_accuracy:.3f}, {s.throughput:.1f} it/s, {len(swaps)} "
                          f"controller actions ({time.monotonic() - started:.0f} s)", flush=True)
    finally:
        harness.close()
    if plotted:
        report.plot_runs(plotted, RESULTS / f"{stem}-{name}.png",
                         f"adaptive bench: {name} (run 1)", scenario.target_accuracy,
                         stragglers, actions)
    rows = []
    for key in configs:
        runs = results[key]
        times = [x["time_to_target_s"] for x in runs]
        reached = [t for t in times if t is not None]
        rows.append({
            "scenario": name, "config": key, "runs": len(runs),
            # the median over the runs that reached the target; None if any did not
            "time_to_target_s": (_round(statistics.median(reached), 3)
                                 if runs and len(reached) == len(runs) else None),
            "final_accuracy": (round(statistics.mean(x["final_accuracy"] for x in runs), 4)
                               if runs else None),
            "throughput": (round(statistics.median(x["throughput"] for x in runs), 2)
                           if runs else None),
            **{part: _median([x[part] for x in runs])
               for part in ("compute_ms", "wait_ms", "comm_ms")},
            "per_run": runs, **({"error": errors[key]} if key in errors else {})})
    return rows


def speedups(rows: list[dict]) -> None:
    """Adds to each adaptive row its speed-up to the target over sync and over gloo."""
    by = {(r["scenario"], r["config"]): r for r in rows}
    for r in rows:
        if r["config"] != "adaptive":
            continue
        for base in ("sync", "gloo"):
            other = by.get((r["scenario"], base), {}).get("time_to_target_s")
            mine = r["time_to_target_s"]
            r[f"speedup_vs_{base}"] = round(other / mine, 2) if other and mine else None


def kept_rows(path: Path, rerun: list[str]) -> list[dict]:
    """The rows of `path` for the scenarios not run again. A scenario's rows all come
    from one run: its ratios compare configurations measured side by side."""
    if not path.exists():
        return []
    try:
        rows = json.loads(path.read_text())["rows"]
    except (ValueError, KeyError, TypeError) as err:
        raise SystemExit(f"{path} is not a results file of this bench ({err}): move it "
                         "away to start a new one") from None
    return [r for r in rows if r.get("scenario") not in rerun]


def goals(rows: list[dict]) -> list[dict]:
    by = {(r["scenario"], r["config"]): r for r in rows}
    checks = []

    def check(goal: str, scenario: str, value: float | None, ok: bool | None) -> None:
        checks.append({"goal": goal, "scenario": scenario, "value": value,
                       "met": ok if value is not None else None})

    for scenario in {r["scenario"] for r in rows}:
        adaptive = by.get((scenario, "adaptive"))
        sync = by.get((scenario, "sync"))
        if adaptive is None:
            continue
        if scenario in PERSISTENT:
            for base in ("sync", "gloo"):
                v = adaptive.get(f"speedup_vs_{base}")
                check(f"adaptive >= {MIN_SPEEDUP}x faster to target than {base}", scenario, v,
                      v is not None and v >= MIN_SPEEDUP)
        if scenario == "homogeneous":
            v = adaptive.get("speedup_vs_sync")
            check(f"adaptive within {HOMOGENEOUS_SLACK:.0%} of sync", scenario, v,
                  v is not None and v >= 1 - HOMOGENEOUS_SLACK)
        if sync and sync["final_accuracy"] is not None and adaptive["final_accuracy"] is not None:
            d = round(adaptive["final_accuracy"] - sync["final_accuracy"], 4)
            check("final accuracy within 1 point of sync", scenario, d, d >= -ACCURACY_POINTS)
    return sorted(checks, key=lambda c: (c["scenario"], c["goal"]))


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    configs = list(dict.fromkeys(r["config"] for r in rows))
    by = {(r["scenario"], r["config"]): r for r in rows}
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(configs)
    for i, config in enumerate(configs):
        xs, ys, notes = [], [], []
        for j, scenario in enumerate(scenarios):
            row = by.get((scenario, config), {})
            t = row.get("time_to_target_s")
            xs.append(j + i * width)
            ys.append(t if t is not None else 0.0)
            notes.append("failed" if row.get("error") else "n/a")
        bars = ax.bar(xs, ys, width, label=config)
        for bar, y, note in zip(bars, ys, notes, strict=True):
            if y == 0.0:
                ax.annotate(note, (bar.get_x() + bar.get_width() / 2, 0.2), ha="center",
                            fontsize=7, rotation=90)
    ax.set_xticks([j + width * (len(configs) - 1) / 2 for j in range(len(scenarios))],
                  scenarios)
    ax.set(ylabel="time to target accuracy (s)",
           title="adaptive bench: time to target, lower is better (n/a: not reached; "
                 "failed: the configuration cannot run it)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS + MORE_SCENARIOS,
                        default=list(SCENARIOS))
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS),
                        default=list(DEFAULT_CONFIGS))
    parser.add_argument("--repeat", type=int, default=2,
                        help="runs per cell (interleaved); the table has their medians")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "adaptive-bench")
    parser.add_argument("--results", default="adaptive.json",
                        help="the results file's name, in bench/results (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat must be >= 1, got {args.repeat}")
    if Path(args.results).name != args.results or not args.results.endswith(".json"):
        parser.error(f"--results must be a file name ending in .json (it is written to "
                     f"{RESULTS}), got {args.results!r}")
    results = RESULTS / args.results
    rows: list[dict] = []
    for name in args.scenarios:
        rows += run_scenario(name, args.configs, args.out, args.repeat, results.stem)
    speedups(rows)
    RESULTS.mkdir(exist_ok=True)
    rows = kept_rows(results, args.scenarios) + rows
    checks = goals(rows)
    results.write_text(json.dumps({"rows": rows, "goals": checks}, indent=2) + "\n")
    plot(rows, results.with_suffix(".png"))
    print(report.table(
        [[r["scenario"], r["config"], _text(r["time_to_target_s"]),
          _text(r["final_accuracy"], "{:.3f}"), _text(r["throughput"], "{:.1f}"),
          _text(r.get("speedup_vs_sync"), "{:.2f}"), _text(r.get("speedup_vs_gloo"), "{:.2f}"),
          " / ".join(_text(r.get(part)) for part in ("compute_ms", "wait_ms", "comm_ms"))]
         for r in rows],
        ["scenario", "config", "time to target (s)", "final accuracy", "iterations/s",
         "adaptive/sync", "adaptive/gloo", "ms/step: compute / waiting / communication"]))
    print()
    print(report.table([[c["scenario"], c["goal"], str(c["value"]),
                         {True: "met", False: "MISSED", None: "n/a"}[c["met"]]] for c in checks],
                       ["scenario", "goal", "value", "result"]))
    print(f"wrote {results}, {results.stem}.png and {results.stem}-<scenario>.png; "
          f"logs in {args.out}")


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


def _median(values: list[float | None]) -> float | None:
    """The median of the runs' values, None if any run has none (gloo's waiting)."""
    if not values or any(v is None for v in values):
        return None
    return round(statistics.median(values), 1)


def _text(x: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


if __name__ == "__main__":
    main()
