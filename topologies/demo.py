"""`make demo`: HySync end to end on this machine, no root, no Mininet.

The softswitch on UDP loopback, the controller over real P4Runtime gRPC, and 4
workers training an MLP on scikit-learn's digits, worker 3 three times slower.
Two configurations of the same training run one after the other:

  gloo               DDP with gloo all-reduce: the standard baseline
  hysync-sync→partial DDP with the HySync hook; the controller starts the job in
                     sync and hot-swaps it to partial(3) when worker 0 reaches the
                     scenario's swap step

It ends with a table (iterations/s per phase, time to target accuracy, final
accuracy) and the path of a PNG plot.
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
from topologies.runner import (
    P4INFO,
    REPO,
    LocalHarness,
    RunConfig,
    RunFailed,
    connect,
    run_config,
)
from topologies.scenario import ScenarioError, load_scenario

DEFAULT_SCENARIO = REPO / "topologies" / "scenarios" / "demo.toml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m topologies.demo",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", type=Path, default=DEFAULT_SCENARIO)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "demo")
    parser.add_argument("--skip-baseline", action="store_true",
                        help="run only the HySync configuration")
    parser.add_argument("--policy", choices=("manual-schedule", "adaptive"),
                        default="manual-schedule",
                        help="HySync's mode policy: the scenario's schedule (default), or "
                             "the adaptive straggler policy")
    args = parser.parse_args(argv)
    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as err:
        print(f"demo: error: {err}", file=sys.stderr)
        return 2
    stragglers = {s.worker for s in scenario.stragglers}
    swap = scenario.schedule[0] if scenario.schedule else None
    configs = [] if args.skip_baseline else [RunConfig("gloo", "gloo")]
    if args.policy == "adaptive":
        configs.append(RunConfig("hysync-adaptive", "hysync", "adaptive"))
    else:
        configs.append(RunConfig("hysync-sync-then-partial" if swap else "hysync-sync",
                                 "hysync", "manual-schedule" if swap else "sync"))
    print(f"HySync demo: scenario {scenario.name!r}: {scenario.workers} workers, "
          f"{scenario.steps} steps, straggler(s) {sorted(stragglers) or 'none'}; "
          f"logs in {args.out}")
    harness = LocalHarness(args.out)
    started = time.monotonic()
    try:
        print(f"starting the softswitch: P4Runtime {harness.grpc_addr}, "
              f"data plane UDP {harness.switch_data_addr()}")
        with connect(harness) as switch:
            print(f"pushed the pipeline ({P4INFO.relative_to(REPO)})")
            controller = Controller(switch).attach()
            runs, swaps = {}, {}
            for config in configs:
                print(f"running {config.name} ...", flush=True)
                runs[config.name], swaps[config.name] = run_config(
                    harness, controller, scenario, config, args.out,
                    say=lambda text: print(text, flush=True))
    except RunFailed as err:
        print(f"demo: error: {err} (worker output above; switch log {harness.log})",
              file=sys.stderr)
        return 1
    finally:
        harness.close()
    print(summarize(runs, swaps, scenario, stragglers, args.out, time.monotonic() - started))
    return 0


def summarize(runs, swaps, scenario, stragglers, out: Path, elapsed: float) -> str:
    rows, phase_rows, summaries = [], [], []
    for name, logs in runs.items():
        s = report.summarize(name, logs, scenario.target_accuracy, stragglers)
        summaries.append(s)
        ttt = f"{s.time_to_target_s:.1f} s" if s.time_to_target_s is not None else "not reached"
        rows.append([name, ttt, f"{s.final_accuracy:.3f}", f"{s.throughput:.1f}"])
        ref = report.reference(logs, stragglers)
        mode_swaps = [w.at_step for w in swaps[name] if w.action == "set_mode"]
        for label, _, _, rate, mode in report.phase_rates(ref, mode_swaps):
            phase_rows.append([name, label, mode, f"{rate:.1f}"])
    plot = report.plot_runs(runs, out / "demo.png", f"demo ({scenario.name})",
                            scenario.target_accuracy, stragglers,
                            {k: [asdict(x) for x in v] for k, v in swaps.items()})
    (out / "summary.json").write_text(json.dumps(
        {"scenario": scenario.name, "configs": [asdict(s) for s in summaries],
         "swaps": {k: [asdict(x) for x in v] for k, v in swaps.items()}}, indent=2) + "\n")
    target = f"time to {scenario.target_accuracy:.0%}"
    return "\n".join([
        "", f"Results ({elapsed:.0f} s in all; reference replica = worker 0):", "",
        report.table(rows, ["config", target, "final accuracy", "iterations/s"]), "",
        report.table(phase_rows, ["config", "phase", "mode", "iterations/s"]), "",
        f"plot: {plot}", f"logs: {out}/<config>/worker-<w>.json, summary: {out}/summary.json",
    ])


if __name__ == "__main__":
    sys.exit(main())
