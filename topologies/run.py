"""`python -m topologies.run SCENARIO`: an emulation run in Mininet (needs root).

    python -m topologies.run topologies/scenarios/constant-3x.toml \\
        [--switch softswitch|bmv2] [--policy sync|partial|async|manual-schedule|adaptive] \\
        [--quorum Q] [--baseline] [--out runs/NAME]

Starts the switch, pushes the pipeline, adds the training job and the model-averaging
job, starts one worker per Mininet host, applies the scenario (compute slowdowns in the
workers; link bandwidth with tc htb; link delay in the softswitch, since this kernel has
no netem), swaps modes on the schedule (manual-schedule) or lets the straggler policy
decide (adaptive; its decisions in <out>/<config>/policy.jsonl), shows progress, and
writes the JSON logs, a
summary table (summary.json) and a PNG plot. `--baseline` also runs DDP over gloo
in the same topology with the same stragglers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from controlplane.controller import Controller
from topologies import report
from topologies.runner import POLICIES, REPO, RunConfig, RunFailed, connect, run_config
from topologies.scenario import ScenarioError, load_scenario
from topologies.switches import SWITCH_CLASSES


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m topologies.run",
                                description=__doc__.splitlines()[0])
    p.add_argument("scenario", type=Path, help="a scenario file (topologies/scenarios/*.toml)")
    p.add_argument("--switch", default="softswitch", choices=sorted(SWITCH_CLASSES))
    p.add_argument("--policy", default="manual-schedule", choices=POLICIES)
    p.add_argument("--quorum", type=int, help="partial: the quorum (default: workers - 1)")
    p.add_argument("--baseline", action="store_true", help="also run DDP over gloo")
    p.add_argument("--out", type=Path, help="output directory (default runs/<scenario>)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from topologies.mininet_harness import HarnessError, MininetHarness

    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as err:
        print(f"run: error: {err}", file=sys.stderr)
        return 2
    quorum = args.quorum if args.quorum is not None else scenario.workers - 1
    if args.policy == "partial" and not 1 <= quorum <= scenario.workers:
        print(f"run: error: --quorum {quorum} must be 1..{scenario.workers}", file=sys.stderr)
        return 2
    out = args.out or REPO / "runs" / scenario.name
    configs = [RunConfig("gloo", "gloo")] if args.baseline else []
    label = args.policy + (f"({quorum})" if args.policy == "partial" else "")
    configs.append(RunConfig(f"hysync-{label}", "hysync", args.policy,
                             quorum if args.policy == "partial" else 0))
    try:
        harness = MininetHarness(scenario, args.switch, out)
    except HarnessError as err:
        print(f"run: error: {err}", file=sys.stderr)
        return 2
    stragglers = {s.worker for s in scenario.stragglers}
    started = time.monotonic()
    try:
        print(f"Mininet: {scenario.workers} hosts behind {args.switch} "
              f"(P4Runtime {harness.grpc_addr}); logs in {out}", flush=True)
        with connect(harness) as switch:
            controller = Controller(switch).attach()
            runs, swaps = {}, {}
            for config in configs:
                print(f"running {config.name} ...", flush=True)
                runs[config.name], swaps[config.name] = run_config(
                    harness, controller, scenario, config, out,
                    say=lambda text: print(text, flush=True))
    except RunFailed as err:
        print(f"run: error: {err} (worker output above)", file=sys.stderr)
        return 1
    finally:
        harness.close()
    rows, summaries = [], []
    for name, logs in runs.items():
        s = report.summarize(name, logs, scenario.target_accuracy, stragglers)
        summaries.append(s)
        ttt = f"{s.time_to_target_s:.1f}" if s.time_to_target_s is not None else "-"
        rows.append([name, ttt, f"{s.final_accuracy:.3f}", f"{s.throughput:.1f}"])
    plot = report.plot_runs(runs, out / "plot.png", f"{scenario.name} on {args.switch}",
                            scenario.target_accuracy, stragglers,
                            {k: [asdict(x) for x in v] for k, v in swaps.items()})
    (out / "summary.json").write_text(json.dumps(
        {"scenario": scenario.name, "switch": args.switch,
         "configs": [asdict(s) for s in summaries],
         "swaps": {k: [asdict(x) for x in v] for k, v in swaps.items()}}, indent=2) + "\n")
    print(f"\n{scenario.name} on {args.switch} ({time.monotonic() - started:.0f} s):\n")
    print(report.table(rows, ["config", f"time to {scenario.target_accuracy:.0%} (s)",
                              "final accuracy", "iterations/s"]))
    print(f"\nplot: {plot}\nsummary: {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
