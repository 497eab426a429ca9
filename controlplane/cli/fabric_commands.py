"""`hysync job add|remove` and `mode set` with `--inventory FILE`: on every switch of a
testbed of leaves and a spine (controlplane/testbed/fabric.py). The inventory names the switches
and their roles; each command opens one primary P4Runtime session per switch, with the
command line's election id (or the inventory's, on a switch that a serve or deploy held
and nobody holds now: controlplane/testbed/election.py) and deadline. A one-switch
inventory names the switch the command acts on, as --grpc-addr would.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path

from hysync.controlplane.cli.output import Handler, Output, UsageError, emit_latch
from hysync.controlplane.cli.switch_commands import (
    clock,
    cmd_job_add,
    cmd_job_list,
    cmd_job_remove,
    cmd_mode_set,
    cmd_mode_show,
    cmd_policy_run,
    decision_text,
    job_line,
    wait_for_latch,
)
from hysync.controlplane.controller import Controller
from hysync.controlplane.errors import ControlPlaneError, ValidationError
from hysync.controlplane.job import JobConfig
from hysync.controlplane.policy.levels import LevelPolicies, level_name
from hysync.controlplane.tables.installed import InstalledJob
from hysync.controlplane.tables.sync_mode import format_mode
from hysync.controlplane.testbed.election import open_session
from hysync.controlplane.testbed.fabric import LEVEL_HELP, FabricController, parse_level
from hysync.controlplane.testbed.inventory import FabricSwitch, Inventory
from hysync.wire import Mode


@contextlib.contextmanager
def fabric_controller(args: argparse.Namespace, inv: Inventory, *,
                      read_only: bool = False) -> Iterator[FabricController]:
    assert inv.fabric is not None
    with contextlib.ExitStack() as stack:
        controllers = {}
        for sw in inv.fabric.switches:
            info = sw.switch
            switch = stack.enter_context(open_session(
                info, args.election_id, timeout=args.timeout, arbitrate=not read_only))
            controllers[sw.name] = Controller(switch).attach()
        yield FabricController(inv.fabric, controllers)


def _installed_jobs(args: argparse.Namespace, inv: Inventory
                    ) -> list[tuple[FabricSwitch, list[InstalledJob], list[str]]]:
    """Every switch of the testbed with the jobs wholly installed on it and the problems its
    tables showed, read in one read-only session per switch."""
    assert inv.fabric is not None
    read = []
    with fabric_controller(args, inv, read_only=True) as fabric:
        for sw in inv.fabric.switches:
            controller = fabric.controller(sw)
            jobs = [j for j in controller.list_jobs() if j.complete]
            read.append((sw, jobs, controller.problems))
    return read


def _one_switch(args: argparse.Namespace, inv: Inventory) -> argparse.Namespace:
    """The arguments of the one-switch command, aimed at the inventory's switch."""
    if getattr(args, "level", None):
        raise UsageError(f"--level {args.level}: {args.inventory} describes one switch; "
                         "levels are the [[switches]] of a testbed of leaves and a spine")
    return argparse.Namespace(**{**vars(args), "grpc_addr": inv.switch.grpc_addr,
                                 "device_id": inv.switch.device_id})


def fabric_job_add(args: argparse.Namespace, out: Output) -> None:
    inv = Inventory.load(args.inventory)
    if inv.fabric is None:
        return cmd_job_add(_one_switch(args, inv), out)
    job = JobConfig.load(args.file)
    with fabric_controller(args, inv) as fabric:
        report = fabric.add_job(job, replace=args.replace)
    lo, hi = job.slots
    lines = [f"job {job.job_id} across {len(report.switches)} switches, slots {lo}-{hi}, mode "
             f"{format_mode(job.mode, job.quorum)} ({report.updates} updates)"]
    lines += [f"  {name}: {r.outcome} ({r.updates} updates)" for name, r in report.switches]
    out.emit({"job_id": job.job_id, "slots": [lo, hi], "updates": report.updates,
              "switches": [{"name": name, "outcome": r.outcome, "updates": r.updates}
                           for name, r in report.switches]}, "\n".join(lines))


def fabric_job_remove(args: argparse.Namespace, out: Output) -> None:
    inv = Inventory.load(args.inventory)
    if inv.fabric is None:
        return cmd_job_remove(_one_switch(args, inv), out)
    with fabric_controller(args, inv) as fabric:
        removed = fabric.remove_job(args.job)
    out.emit({"job_id": args.job, "switches": [{"name": n, "updates": u} for n, u in removed]},
             f"job {args.job} removed from " + ", ".join(f"{n} ({u} updates)"
                                                         for n, u in removed))


def fabric_mode_set(args: argparse.Namespace, out: Output) -> None:
    inv = Inventory.load(args.inventory)
    if inv.fabric is None:
        return cmd_mode_set(_one_switch(args, inv), out)
    mode = Mode[args.mode.upper()]
    _levels(args, inv)
    with fabric_controller(args, inv) as fabric:
        reports = fabric.set_mode(args.job, level=args.level, slots=args.slots, mode=mode,
                                  quorum=args.quorum)
        waits = [(name, *wait_for_latch(fabric.controllers[name], args, mode))
                 for name, _ in reports]
    lines, data = [], []
    for (name, report), (_, latched, pending) in zip(reports, waits, strict=True):
        lo, hi = report.slots
        lines.append(f"job {args.job} {name} slots {lo}-{hi}: {report.setting} "
                     f"({report.strategy})")
        data.append({"switch": name, "slots": [lo, hi], "mode": args.mode,
                     "quorum": report.quorum, "strategy": report.strategy,
                     "latched_s": latched, "not_latched": str(pending) if pending else None})
    pending = next((p for _, _, p in waits if p is not None), None)
    latched = max((s for _, s, _ in waits if s is not None), default=None)
    emit_latch(out, {"job_id": args.job, "level": args.level or "every", "switches": data},
               "\n".join(lines), args, latched if pending is None else None, pending)


__all__ = ["LEVEL_HELP", "routes"]


def fabric_policy_run(args: argparse.Namespace, out: Output) -> None:
    inv = Inventory.load(args.inventory)
    if inv.fabric is None:
        return cmd_policy_run(_one_switch(args, inv), out)
    switches = _levels(args, inv)

    def echo(record: dict[str, object]) -> None:
        error = f" (FAILED: {record['error']})" if record.get("error") else ""
        out.emit(record, f"{clock(record)} job {args.job} {record['level']}: "
                         f"{decision_text(record)}{error}")

    with fabric_controller(args, inv, read_only=args.dry_run) as fabric:
        levels = [(level_name(sw.role, sw.name), fabric.controller(sw)) for sw in switches]
        try:
            with LevelPolicies(levels, args.job, policy=args.policy, interval=args.interval,
                               dry_run=args.dry_run, echo=echo,
                               log_path=Path(args.log) if args.log else None) as policies:
                made = policies.run(duration=args.duration)
        except OSError as err:
            raise ControlPlaneError(f"cannot write the policy log {args.log}: "
                                    f"{err.strerror}") from None
        except KeyboardInterrupt:
            made = []
    dry = " (dry run)" if args.dry_run else ""
    out.emit({"job_id": args.job, "policy": args.policy, "decisions": len(made),
              "dry_run": args.dry_run, "levels": [r.level for r in policies.runners]},
             f"policy {args.policy} on job {args.job}{dry} at "
             f"{', '.join(str(r.level) for r in policies.runners)}: {len(made)} decisions")


def fabric_job_list(args: argparse.Namespace, out: Output) -> None:
    inv = Inventory.load(args.inventory)
    if inv.fabric is None:
        return cmd_job_list(_one_switch(args, inv), out)
    lines, data = [], []
    for sw, jobs, problems in _installed_jobs(args, inv):
        lines.append(f"{sw.role} {sw.name} ({sw.switch.grpc_addr}):")
        lines += [f"  {job_line(j)}" for j in jobs] or ["  no jobs installed"]
        lines += [f"  warning: {p}" for p in problems]
        data.append({"switch": sw.name, "role": sw.role,
                     "jobs": [j.to_dict() for j in jobs], "problems": problems})
    out.emit({"switches": data}, "\n".join(lines))


def fabric_mode_show(args: argparse.Namespace, out: Output) -> None:
    inv = Inventory.load(args.inventory)
    if inv.fabric is None:
        return cmd_mode_show(_one_switch(args, inv), out)
    lines, data = [], []
    for sw, jobs, _ in _installed_jobs(args, inv):
        job = next((j for j in jobs if j.job_id == args.job), None)
        if job is None:
            continue
        level = level_name(sw.role, sw.name)
        lines.append(f"job {args.job} at {level}, {len(job.active)} active members "
                     f"({'leaves' if sw.role == 'spine' else 'hosts'})")
        lines += [f"  slots {s.low}-{s.high}: {format_mode(s.mode, s.quorum)}"
                  for s in job.segments()]
        data.append({"level": level, "modes": job.to_dict()["modes"]})
    if not data:
        raise ValidationError(f"no switch of {args.inventory} holds job {args.job}: "
                              f"`hysync --inventory {args.inventory} job list` shows theirs")
    out.emit({"job_id": args.job, "levels": data}, "\n".join(lines))


def _levels(args: argparse.Namespace, inv: Inventory) -> tuple[FabricSwitch, ...]:
    """The switches --level names (every switch without it); a bad one is a usage error,
    refused before any switch is contacted."""
    assert inv.fabric is not None
    if not args.level:
        return inv.fabric.switches
    try:
        return parse_level(args.level, inv.fabric)
    except ValidationError as err:
        raise UsageError(str(err)) from None


def routes() -> dict[str, Handler]:
    """The one-switch commands that `--inventory` takes across switches."""
    return {"cmd_job_add": fabric_job_add, "cmd_job_remove": fabric_job_remove,
            "cmd_mode_set": fabric_mode_set, "cmd_policy_run": fabric_policy_run,
            "cmd_job_list": fabric_job_list, "cmd_mode_show": fabric_mode_show}
