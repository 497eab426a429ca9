"""`python -m hysync.topologies.run SCENARIO`: an emulation run in Mininet (needs root).

    python -m hysync.topologies.run topologies/scenarios/constant-3x.toml \\
        [--switch softswitch|bmv2] [--policy sync|partial|async|manual-schedule|adaptive] \\
        [--quorum Q] [--baseline] [--out runs/NAME]

Starts the switch, pushes the pipeline, adds the training job and the model-averaging
job, starts one worker per Mininet host, applies the scenario (compute slowdowns in the
workers; link bandwidth with tc htb; link delay in the softswitch, since this kernel has
no netem), swaps modes on the schedule (manual-schedule) or lets the straggler policy
decide (adaptive; its decisions in <out>/<config>/policy.jsonl), shows progress, and
writes the JSON logs, the summary (summary.json; printed: the outcome in one sentence,
tables) and a PNG plot (plot.png), as the demo does. `--baseline` also runs DDP over gloo
in the same topology with the same stragglers.

A scenario with `racks` >= 2 runs on racks of network namespaces behind a leaf softswitch
each and a spine (topologies/fabric_harness.py, the cluster of `hysync rack up`): the jobs
are installed across the switches, a [[schedule]] entry swaps the `level` it names, the
adaptive policy runs at every level (a slow rack is a slow member of the spine), and the
gloo baseline's all-reduce runs over the front-end network between the same hosts. SCENARIO
may also be a scenario's name (`slow-rack` for topologies/scenarios/slow-rack.toml).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hysync.topologies import report
from hysync.topologies.progress import make_display
from hysync.topologies.runner import POLICIES, RunConfig, RunFailed, run_configs
from hysync.topologies.scenario import ScenarioError, load_scenario
from hysync.topologies.switches import SWITCH_CLASSES

SCENARIOS = Path(__file__).with_name("scenarios")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m hysync.topologies.run",
                                description=__doc__.splitlines()[0])
    p.add_argument("scenario", type=Path,
                   help="a scenario file (topologies/scenarios/*.toml) or a scenario's name")
    p.add_argument("--switch", default="softswitch", choices=sorted(SWITCH_CLASSES))
    p.add_argument("--policy", default="manual-schedule", choices=POLICIES)
    p.add_argument("--quorum", type=int, help="partial: the quorum (default: workers - 1)")
    p.add_argument("--baseline", action="store_true", help="also run DDP over gloo")
    p.add_argument("--out", type=Path, help="output directory (default runs/<scenario>)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from hysync.topologies.mininet_harness import HarnessError, MininetHarness

    try:
        scenario = load_scenario(scenario_path(args.scenario))
    except ScenarioError as err:
        print(f"run: error: {err}", file=sys.stderr)
        return 2
    # Across switches a quorum counts each switch's own members: at most a rack's hosts.
    most = scenario.per_rack
    quorum = args.quorum if args.quorum is not None else most - 1
    if args.policy == "partial" and not 1 <= quorum <= most:
        print(f"run: error: --quorum {quorum} must be 1..{most}", file=sys.stderr)
        return 2
    if scenario.racks > 1 and (args.policy == "async" or args.switch != "softswitch"):
        print(f"run: error: {scenario.name} spans {scenario.racks} racks: across switches "
              "only --switch softswitch and the policies sync, partial, manual-schedule and "
              "adaptive run (async is not offered there)", file=sys.stderr)
        return 2
    out = args.out or Path("runs") / scenario.name
    configs = [RunConfig("gloo", "gloo")] if args.baseline else []
    label = args.policy + (f"({quorum})" if args.policy == "partial" else "")
    configs.append(RunConfig(f"hysync-{label}", "hysync", args.policy,
                             quorum if args.policy == "partial" else 0))
    try:
        if scenario.racks > 1:
            from hysync.topologies.fabric_harness import FabricHarness

            harness = FabricHarness(scenario, out)
            where = (f"{scenario.racks} racks of {scenario.per_rack} hosts behind a leaf "
                     f"softswitch each and a spine (namespaces {harness.tag}-*, P4Runtime "
                     f"{', '.join(harness.grpc_addrs)})")
            extra = {"switch": args.switch, "racks": scenario.racks, "tag": harness.tag}
            on = f"{scenario.racks} leaves and a spine ({args.switch})"
        else:
            harness = MininetHarness(scenario, args.switch, out)
            where = (f"Mininet: {scenario.workers} hosts behind {args.switch} "
                     f"(P4Runtime {harness.grpc_addr})")
            extra = {"switch": args.switch}
            on = args.switch
    except HarnessError as err:
        print(f"run: error: {err}", file=sys.stderr)
        return 2
    started = time.monotonic()
    print(f"{where}; logs in {out}", flush=True)
    display = make_display()
    try:
        runs, swaps = run_configs(harness, scenario, configs, out, display)
    except RunFailed as err:
        print(f"run: error: {err} (worker output above)", file=sys.stderr)
        return 1
    finally:
        display.close()
        harness.close()
    print(report.write_summary(runs, swaps, scenario=scenario, out=out,
                               title=f"{scenario.name} on {on}",
                               elapsed_s=time.monotonic() - started, extra=extra))
    return 0


def scenario_path(given: Path) -> Path:
    """A scenario file as given, or a name of topologies/scenarios/NAME.toml."""
    named = SCENARIOS / f"{given}.toml"
    if not given.exists() and given.parent == Path() and given.suffix == "" and named.exists():
        return named
    return given


if __name__ == "__main__":
    sys.exit(main())
