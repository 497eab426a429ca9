"""`make demo`: HySync end to end on this machine, no root, no Mininet.

The softswitch on UDP loopback, the controller over real P4Runtime gRPC, and 4
workers training on scikit-learn's digits, one of them a straggler. The same training,
one configuration after the other:

  gloo             DDP with gloo all-reduce: the standard baseline
  hysync-sync      DDP with the HySync hook, every round waits for every member
  hysync-adaptive  the same, with the adaptive straggler policy choosing the mode and
                   the membership (the default, POLICY=adaptive)

or, with `--policy manual-schedule`, gloo and `hysync-sync-then-partial`: the controller
starts in sync and hot-swaps to partial when worker 0 reaches the scenario's swap step.
In every HySync configuration the replicas average their parameters in the background
through the switch. It ends with the outcome in one sentence, the tables (time to the
target, time per step split into compute, waiting and communication, phases), the plot
and where the logs are.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from hysync.errors import HySyncError
from hysync.topologies import report
from hysync.topologies.children import signals_end_the_run
from hysync.topologies.progress import make_display
from hysync.topologies.runner import LocalHarness, RunConfig, RunFailed, run_configs
from hysync.topologies.scenario import Scenario, ScenarioError, load_scenario

SCENARIOS = Path(__file__).resolve().parent / "scenarios"  # shipped with the package
DEFAULT_SCENARIO = {"adaptive": SCENARIOS / "demo.toml",
                    "manual-schedule": SCENARIOS / "demo-manual.toml"}


def configs_for(policy: str, scenario: Scenario, baseline: bool) -> list[RunConfig]:
    """The configurations to compare, the policy's last (the outcome is about it)."""
    configs = [RunConfig("gloo", "gloo")] if baseline else []
    if policy == "adaptive":
        if baseline:
            configs.append(RunConfig("hysync-sync", "hysync", "sync"))
        return [*configs, RunConfig("hysync-adaptive", "hysync", "adaptive")]
    if scenario.schedule:
        return [*configs, RunConfig("hysync-sync-then-partial", "hysync", "manual-schedule")]
    return [*configs, RunConfig("hysync-sync", "hysync", "sync")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hysync.topologies.demo",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", type=Path,
                        help="a scenario file (default: topologies/scenarios/demo.toml, "
                             "demo-manual.toml with --policy manual-schedule)")
    parser.add_argument("--out", type=Path, default=Path("runs") / "demo")
    parser.add_argument("--skip-baseline", action="store_true",
                        help="run only the HySync configuration of the policy")
    parser.add_argument("--policy", choices=("adaptive", "manual-schedule"), default="adaptive",
                        help="HySync's mode policy: the adaptive straggler policy (default), "
                             "or the scenario's schedule")
    args = parser.parse_args(argv)
    try:  # everything the run needs is checked before anything starts
        scenario = load_scenario(args.scenario or DEFAULT_SCENARIO[args.policy])
        refuse_unrunnable(scenario)
        args.out = writable_dir(args.out)
    except ScenarioError as err:
        print(f"demo: error: {err}", file=sys.stderr)
        return 2
    with signals_end_the_run():
        return run(args, scenario)


def refuse_unrunnable(scenario: Scenario) -> None:
    """ScenarioError if this machine's demo cannot run `scenario` as it is written."""
    if scenario.bandwidth_mbit is not None or scenario.delay_ms:
        raise ScenarioError(
            f"{scenario.path}: [link] needs Mininet's links (the demo runs on loopback, "
            f"with no link emulation): run it with `make emulate SCENARIO={scenario.path}` "
            "(root), or remove [link] for the demo")


def writable_dir(out: Path) -> Path:
    """--out, absolute (the workers run in the repository), created; ScenarioError if it
    cannot hold the logs."""
    out = out.resolve()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ScenarioError(f"--out {out}: cannot create it: {err.strerror or err}; pass "
                            "a directory you can write to") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ScenarioError(f"--out {out}: not writable; pass a directory you can write to")
    return out


def run(args: argparse.Namespace, scenario: Scenario) -> int:
    """The demo's runs, one configuration after the other; the exit status."""
    configs = configs_for(args.policy, scenario, not args.skip_baseline)
    stragglers = sorted(s.worker for s in scenario.stragglers)
    about = f" ({scenario.description})" if scenario.description else ""
    print(f"HySync demo: scenario {scenario.name!r}{about}: {scenario.workers} workers, "
          f"model {scenario.model}, {scenario.steps} steps of the job clock, straggler(s) "
          f"{stragglers or 'none'}; logs in {args.out}")
    print("The job clock counts the updates the job applied, in sync rounds of every member; "
          "in partial or async mode a fast worker runs more local steps than that.")
    harness = LocalHarness(args.out)
    started = time.monotonic()
    print(f"softswitch: P4Runtime {harness.grpc_addr}, data plane UDP "
          f"{harness.switch_data_addr()}", flush=True)
    display = make_display()
    try:
        runs, swaps = run_configs(harness, scenario, configs, args.out, display)
    except (RunFailed, HySyncError) as err:
        print(f"demo: error: {err} (worker output above; switch log {harness.log})",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("demo: interrupted; stopping the switch and the workers", file=sys.stderr)
        return 130
    finally:
        display.close()
        harness.close()
    print(report.write_summary(runs, swaps, scenario=scenario, out=args.out,
                               title=f"demo ({scenario.name})",
                               elapsed_s=time.monotonic() - started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
