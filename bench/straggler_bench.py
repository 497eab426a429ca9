"""Time to target accuracy under a straggler: DDP/gloo vs HySync sync, partial(3), async.

The constant-straggler scenario (1 of 4 workers 3x slower) by default, every
configuration in one run on the embedded default (softswitch on UDP loopback,
workers as local processes, the same harness as `make demo`).

    .venv/bin/python -m bench.straggler_bench [--scenario topologies/scenarios/constant-3x.toml]

Writes bench/results/straggler.json (one row per configuration, plus the ratios of
each configuration's time to target against gloo's) and bench/results/straggler.png.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from hysync.controlplane.controller import Controller
from hysync.topologies import report
from hysync.topologies.runner import REPO, LocalHarness, RunConfig, connect, run_config
from hysync.topologies.scenario import load_scenario

RESULTS = Path(__file__).resolve().parent / "results"
CONFIGS = (
    RunConfig("gloo", "gloo"),
    RunConfig("hysync-sync", "hysync", "sync"),
    RunConfig("hysync-partial(3)", "hysync", "partial", 3),
    RunConfig("hysync-async", "hysync", "async"),
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", type=Path,
                        default=REPO / "topologies" / "scenarios" / "constant-3x.toml")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "straggler-bench")
    args = parser.parse_args(argv)
    scenario = load_scenario(args.scenario)
    stragglers = {s.worker for s in scenario.stragglers}
    harness = LocalHarness(args.out)
    runs = {}
    try:
        with connect(harness) as switch:
            controller = Controller(switch).attach()
            for config in CONFIGS:
                print(f"straggler bench ({scenario.name}): {config.name} ...", flush=True)
                runs[config.name], _ = run_config(harness, controller, scenario, config,
                                                  args.out)
    finally:
        harness.close()
    rows = [asdict(report.summarize(name, logs, scenario.target_accuracy, stragglers))
            for name, logs in runs.items()]
    base = rows[0]["time_to_target_s"]
    for row in rows:
        t = row["time_to_target_s"]
        row["speedup_vs_gloo"] = round(base / t, 2) if base and t else None
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "straggler.json").write_text(json.dumps(
        {"scenario": scenario.name, "target_accuracy": scenario.target_accuracy,
         "rows": [{"config": r["config"], "time_to_target_s": r["time_to_target_s"],
                   "final_accuracy": round(r["final_accuracy"], 4),
                   "throughput": round(r["throughput"], 2),
                   "speedup_vs_gloo": r["speedup_vs_gloo"]} for r in rows]}, indent=2) + "\n")
    report.plot_runs(runs, RESULTS / "straggler.png", f"straggler bench ({scenario.name})",
                     scenario.target_accuracy, stragglers)
    print(report.table([[r["config"], f"{r['time_to_target_s'] or float('nan'):.1f}",
                         f"{r['final_accuracy']:.3f}", f"{r['throughput']:.1f}",
                         str(r["speedup_vs_gloo"])] for r in rows],
                       ["config", "time to target (s)", "final accuracy", "iterations/s",
                        "speed-up vs gloo"]))
    print(f"wrote {RESULTS / 'straggler.json'} and straggler.png")


if __name__ == "__main__":
    main()
