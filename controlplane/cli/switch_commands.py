"""The `hysync` commands that act on one switch themselves: pipeline push, job, mode,
member, policy, stats, and sniff. Each opens its own P4Runtime session (`connect`),
rebuilds the job registry from the switch's tables (`Controller.attach`), does one
thing and reports it; those that only read open no arbitration stream."""

from __future__ import annotations

import argparse
import datetime
import time
from collections.abc import Sequence
from pathlib import Path

from hysync.controlplane.cli.output import Output, UsageError, emit_latch
from hysync.controlplane.controller import Controller, LatchTimeoutError
from hysync.controlplane.errors import ControlPlaneError, NotPrimaryError
from hysync.controlplane.job import JobConfig
from hysync.controlplane.p4rt.switch import Switch
from hysync.controlplane.policy.member_hosts import Hosts, ranks_text
from hysync.controlplane.policy.policies import Decision, make_policy, mode_text
from hysync.controlplane.policy.runner import (
    PolicyRunner,
    describe_decision,
    latest_decision,
    recorded_hosts,
)
from hysync.controlplane.tables.counters import JobRates, JobStats, rates_between
from hysync.controlplane.tables.installed import InstalledJob
from hysync.controlplane.tables.sync_mode import format_mode
from hysync.p4schema import Schema
from hysync.tls import ClientTls
from hysync.wire import Mode


def job_line(job: InstalledJob) -> str:
    lo, hi = job.slots
    modes = ", ".join(f"{s.low}-{s.high} {format_mode(s.mode, s.quorum)}"
                      for s in job.segments())
    excluded = sorted(m.worker for m in job.members if m.worker not in job.active)
    excl = f", excluded {', '.join(map(str, excluded))}" if excluded else ""
    role = f"; {job.role.describe()}" if job.role is not None else ""
    return (f"job {job.job_id}: slots {lo}-{hi}, {len(job.active)}/{len(job.members)} "
            f"members active{excl}; modes: {modes or 'none'}{role}")



def cmd_pipeline_push(args: argparse.Namespace, out: Output) -> None:
    """Install the HySync pipeline on the switch (clears every entry and register).

    --p4info is the text P4Info (hysync:p4src/v1model/hysync.p4info.txtpb, the one HySync
    ships, or hysync:p4src/tna/hysync.<chip>.p4info.txtpb for Tofino); --device-config is
    the compiled program (not needed by the softswitch): the BMv2 JSON, or with --target
    tofino the .conf file make p4-tofino writes (build/tna/tofino2/hysync.conf), packed into
    Stratum's BfPipelineConfig.
    """
    p4info, device_config = args.p4info, args.device_config
    if args.config:
        p4info, _, rest = args.config.partition(",")
        device_config = rest or device_config
    if not p4info:
        raise UsageError("pipeline push needs --p4info FILE (or --config P4INFO[,DEVICE_CONFIG])")
    schema = Schema.from_file(p4info)  # a bad file is refused before anything is sent
    with connect(args) as switch:
        switch.push_pipeline(schema, device_config, target=args.target)
    out.emit({"grpc_addr": args.grpc_addr, "p4info": str(p4info),
              "tables": len(schema.tables), "counters": len(schema.counters)},
             f"pipeline pushed to {args.grpc_addr}: {p4info} ({len(schema.tables)} tables, "
             f"{len(schema.counters)} counters)")


def cmd_job_add(args: argparse.Namespace, out: Output) -> None:
    """Install the job described by a TOML job file (see controlplane/examples/).

    Adding a job that is already installed the same way changes nothing; installed
    differently it is refused unless --replace.
    """
    job = JobConfig.load(args.file)
    with connect(args) as switch:
        report = Controller(switch).attach().add_job(job, replace=args.replace)
    lo, hi = job.slots
    out.emit({"job_id": job.job_id, "outcome": report.outcome, "updates": report.updates,
              "slots": [lo, hi], "members": len(job.members)},
             f"job {job.job_id} {report.outcome} ({report.updates} updates): "
             f"{len(job.members)} members, slots {lo}-{hi}, mode "
             f"{format_mode(job.mode, job.quorum)}")


def cmd_job_remove(args: argparse.Namespace, out: Output) -> None:
    """Delete every entry of a job, and the l2 entries and flood ports no other job uses."""
    with connect(args) as switch:
        written = Controller(switch).attach().remove_job(args.job)
    out.emit({"job_id": args.job, "updates": written},
             f"job {args.job} removed ({written} updates)")


def cmd_job_list(args: argparse.Namespace, out: Output) -> None:
    """List the jobs installed on the switch, read back from its tables."""
    with connect(args, read_only=True) as switch:
        controller = Controller(switch).attach()
        jobs = controller.list_jobs()
    lines = [job_line(j) for j in jobs if j.complete] or ["no jobs installed"]
    lines += [f"warning: {p}" for p in controller.problems]
    out.emit({"jobs": [j.to_dict() for j in jobs], "problems": controller.problems},
             "\n".join(lines))


def cmd_mode_set(args: argparse.Namespace, out: Output) -> None:
    """Hot-swap the desired mode of a slot range: sync, partial --quorum Q, or async.

    Each slot latches the new mode when its next round starts. With --wait SECONDS,
    wait until the job's counters show every slot of the range has latched it, and
    report how long that took.
    """
    mode = Mode[args.mode.upper()]
    with connect(args) as switch:
        controller = Controller(switch)  # set_mode reads the switch: its one read
        report = controller.set_mode(args.job, slots=args.slots, mode=mode, quorum=args.quorum)
        latched, pending = wait_for_latch(controller, args, mode)
    lo, hi = report.slots
    how = {"modify": "one MODIFY", "insert": "new range entry",
           "unchanged": "already set"}[report.strategy]
    text = f"job {args.job} slots {lo}-{hi}: {report.setting} ({how})"
    emit_latch(out, {"job_id": args.job, "slots": [lo, hi], "mode": args.mode,
                     "quorum": report.quorum, "strategy": report.strategy,
                     "deleted_entries": report.deleted}, text, args, latched, pending)


def wait_for_latch(controller: Controller, args: argparse.Namespace,
                   mode: Mode) -> tuple[float | None, LatchTimeoutError | None]:
    """--wait: (seconds until the range latched, None) or (None, the timeout)."""
    if args.wait is None:
        return None, None
    try:
        return controller.wait_latched(args.job, args.slots, mode, timeout=args.wait), None
    except LatchTimeoutError as err:
        return None, err



def cmd_mode_show(args: argparse.Namespace, out: Output) -> None:
    """Show the desired mode of every slot of a job, and the modes-table entries."""
    with connect(args, read_only=True) as switch:
        job = Controller(switch).attach().job(args.job)
    lines = [f"job {job.job_id} slots {job.slots[0]}-{job.slots[1]}, "
             f"{len(job.active)} active members"]
    lines += [f"  slots {s.low}-{s.high}: {format_mode(s.mode, s.quorum)}" for s in job.segments()]
    lines += [f"  entry {r.low}-{r.high} priority {r.priority}: {format_mode(r.mode, r.quorum)}"
              for r in sorted(job.modes, key=lambda r: r.priority)]
    data = job.to_dict()
    out.emit({"job_id": job.job_id, "modes": data["modes"], "entries": data["mode_entries"]},
             "\n".join(lines))


def cmd_member_exclude(args: argparse.Namespace, out: Output) -> None:
    """Take a worker out of a job (a persistent straggler): the job's rounds stop waiting
    for it and it no longer receives results."""
    with connect(args) as switch:
        report = Controller(switch).attach().exclude(args.job, args.worker)
    _membership(out, "excluded", report.job_id, report.worker, report.members, report.quorums)


def cmd_member_readmit(args: argparse.Namespace, out: Output) -> None:
    """Bring an excluded worker back into its job."""
    with connect(args) as switch:
        report = Controller(switch).attach().readmit(args.job, args.worker)
    _membership(out, "readmitted", report.job_id, report.worker, report.members, report.quorums)


def _membership(out: Output, what: str, job: int, worker: int, members: int,
                quorums: Sequence[tuple[int, int, int, int]]) -> None:
    text = f"job {job}: worker {worker} {what}; {members} active members"
    for lo, hi, old, new in quorums:
        text += f"; slots {lo}-{hi} quorum {old} -> {new}"
    out.emit({"job_id": job, "worker": worker, "members": members,
              "quorums": [{"slots": [lo, hi], "old": old, "new": new}
                          for lo, hi, old, new in quorums]}, text)


def cmd_policy_run(args: argparse.Namespace, out: Output) -> None:
    """Run a straggler policy on a job until --duration SECONDS have passed or Ctrl-C.

    Every --interval SECONDS the policy reads the job's counters, classifies each member
    healthy / slow / gone, and switches the job's whole slot range between sync,
    partial(q) and async, excludes persistent stragglers and readmits them on probation
    (controlplane/policy/policies.py says how). Each decision is printed on one line with its
    reason and, with --log FILE, appended to FILE as a JSON line (`hysync stats JOB
    --policy-log FILE` shows the latest). --dry-run only prints the decisions: nothing
    is written to the switch, and no arbitration stream is opened. Each line starts with
    its wall-clock time.

    A switch that `hysync serve` holds runs the policy of each job it admitted itself:
    there, `--dry-run` only reads, and `hysync --serve ADDR policy resume JOB` hands a job
    back to serve's policy after an operator's `mode set`.
    """
    try:
        switch = connect(args, read_only=args.dry_run)
    except NotPrimaryError as err:
        if err.live is False:  # no serve holds it: the switch remembers a higher id
            raise
        raise ControlPlaneError(
            f"not the primary controller of {args.grpc_addr}: another controller holds it. "
            "If it is `hysync serve`, it runs the policy of every job it admitted (hysync serve "
            "--policy); after an operator's mode set, hand the job back to it with `hysync "
            "--serve ADDR policy resume JOB`; `policy run --dry-run` only reads") from None
    with switch:
        controller = Controller(switch).attach()
        controller.job(args.job)  # fail now, in one line, if there is no such job
        policy = make_policy(args.policy)
        log_path = Path(args.log) if args.log else None

        def echo(record: dict[str, object]) -> None:
            error = f" (FAILED: {record['error']})" if record.get("error") else ""
            out.emit(record, f"{clock(record)} job {args.job}: "
                             f"{decision_text(record)}{error}")

        try:
            with PolicyRunner(controller, args.job, policy, interval=args.interval,
                              dry_run=args.dry_run, log_path=log_path, echo=echo) as runner:
                runner.run(duration=args.duration)
        except OSError as err:
            raise ControlPlaneError(f"cannot write the policy log {args.log}: "
                                    f"{err.strerror}") from None
        except KeyboardInterrupt:
            pass
    made = len(policy.decisions)
    dry = " (dry run)" if args.dry_run else ""
    mode = mode_text(policy.mode, policy.quorum)
    out.emit({"job_id": args.job, "policy": args.policy, "decisions": made,
              "dry_run": args.dry_run, "mode": mode, "active": sorted(policy.active)},
             f"policy {args.policy} on job {args.job}{dry}: {made} decisions; mode {mode}, "
             f"active {', '.join(map(str, sorted(policy.active)))}")


def clock(record: dict[str, object]) -> str:
    """A decision's wall-clock time, local, to the tenth of a second (its `time` is the
    monotonic clock's, which only orders decisions)."""
    wall = record.get("wall")
    if not isinstance(wall, int | float):
        wall = PolicyRunner.wall_time(float(record["time"]))  # type: ignore[arg-type]
    stamp = datetime.datetime.fromtimestamp(wall)
    return f"{stamp:%H:%M:%S}.{stamp.microsecond // 100000}"


def cmd_policy_resume(args: argparse.Namespace, out: Output) -> None:
    """Hand a job back to the straggler policy of the `hysync serve` that holds it: an
    operator's `mode set` through serve holds the job's policy until then. Needs --serve."""
    raise UsageError("policy resume hands a job back to the policy of `hysync serve`: give "
                     "--serve ADDR (or HYSYNC_SERVE=ADDR)")


def decision_text(record: dict[str, object]) -> str:
    """One line for a decision-log record."""
    if record.get("action") == "start":
        dry = " (dry run)" if record.get("dry_run") else ""
        return f"started{dry}, {record.get('mode')}"
    return describe_decision(Decision.from_dict(record), recorded_hosts(record))


def cmd_stats(args: argparse.Namespace, out: Output, hosts: Hosts | None = None) -> None:
    """Per-worker counters of a job (contributions, late, duplicates, stale, closes,
    results) and its drops by reason. With --watch SECONDS, refresh every SECONDS with
    rates. With --policy-log FILE, also the latest decision of `hysync policy run
    --log FILE` for the job. With --switch instead of JOB: every drop of the switch by
    reason, whatever job id the dropped packet's bytes named. Through a serve (--serve),
    each member's host and the job's ranks it speaks for too."""
    if (args.job is None) == (not args.switch):
        raise UsageError("stats needs JOB or --switch (not both)")
    if args.switch and (args.watch is not None or args.policy_log is not None):
        raise UsageError("stats --switch takes neither --watch nor --policy-log")
    with connect(args, read_only=True) as switch:
        controller = Controller(switch).attach()
        if args.switch:
            s = controller.switch_stats()
            drops = ", ".join(f"{k} {v}" for k, v in s.drops.items() if v)
            out.emit(s.to_dict(), f"switch drops: {drops or 'none'}")
            return
        before = controller.stats(args.job)
        if args.watch is None:
            data, text = _with_policy(args, _stats_data(before, hosts),
                                      _stats_table(before, None, hosts))
            out.emit(data, text)
            return
        refreshes = 0
        clear = "\x1b[H\x1b[2J" if out.stream.isatty() and not out.as_json else ""
        try:
            while args.count is None or refreshes < args.count:
                time.sleep(args.watch)
                now = controller.stats(args.job)
                r = rates_between(before, now)
                data, text = _with_policy(args, dict(_stats_data(now, hosts),
                                                     rates=r.to_dict()),
                                          _stats_table(now, r, hosts))
                out.emit(data, clear + text)
                before = now
                refreshes += 1
        except KeyboardInterrupt:
            pass


def _with_policy(args: argparse.Namespace, data: dict[str, object],
                 text: str) -> tuple[dict[str, object], str]:
    if args.policy_log is None:
        return data, text
    record = latest_decision(Path(args.policy_log), args.job)
    line = (f"policy: {decision_text(record)} (at {clock(record)})" if record
            else f"policy: no decision for job {args.job} in {args.policy_log}")
    return dict(data, policy=record), f"{text}\n{line}"


def _stats_data(s: JobStats, hosts: Hosts | None) -> dict[str, object]:
    data = s.to_dict()
    if hosts is not None:
        data["hosts"] = [dict(hosts[w].fields(w)) if w in hosts else
                         {"member": w, "host": None, "ranks": None} for w in s.workers]
    return data


def _stats_table(s: JobStats, rates: JobRates | None, hosts: Hosts | None = None) -> str:
    head = f"{'worker':>6} {'active':>6} {'contrib':>10} {'late':>8} {'dup':>8} {'stale':>8} " \
           f"{'results':>10}"
    if rates:
        head += f" {'contrib/s':>10} {'results/s':>10}"
    if hosts is not None:
        head += f"  {'host':<8} ranks"
    lines = [f"job {s.job_id}", head]
    for w in s.workers.values():
        line = (f"{w.worker:>6} {'yes' if w.active else 'no':>6} {w.contributions:>10} "
                f"{w.late:>8} {w.duplicates:>8} {w.stale:>8} {w.results:>10}")
        if rates and w.worker in rates.workers:
            r = rates.workers[w.worker]
            line += f" {r.contributions:>10.1f} {r.results:>10.1f}"
        elif rates:
            line += f" {'':>10} {'':>10}"
        if hosts is not None:
            place = hosts.get(w.worker)
            host = place.host if place is not None and place.host is not None else "-"
            ranks = (ranks_text(place.ranks) if place is not None and place.ranks is not None
                     else "-")
            line += f"  {host:<8} {ranks}"
        lines.append(line)
    drops = ", ".join(f"{k} {v}" for k, v in s.drops.items() if v)
    lines.append(f"drops: {drops or 'none'}")
    return "\n".join(lines)


# ------------------------------------------------------------ plumbing
def cmd_sniff(args: argparse.Namespace, out: Output) -> None:
    """Print the HySync headers of the packets on an interface, as tcpdump would (needs
    root). Stops after --count packets or --duration seconds, else at Ctrl-C. With --json,
    one JSON object per packet (its addresses and header fields), then a summary object."""
    from hysync import scapy  # scapy's import costs ~1 s: only for this command

    render = scapy.record if args.json else scapy.describe
    seen = scapy.sniff(args.iface, lambda item: out.emit(item, str(item)),
                       count=args.count or 0, timeout=args.duration, render=render)
    out.emit({"packets": seen, "iface": args.iface}, f"{seen} HySync packet(s) on {args.iface}")


def tls_of(args: argparse.Namespace) -> ClientTls | None:
    """The P4Runtime TLS options (p4runtime-shell's): None, in the clear, without them."""
    files = {k: Path(v) if v else None
             for k, v in (("cacert", args.cacert), ("cert", args.cert),
                          ("private_key", args.private_key))}
    return ClientTls(**files) if args.ssl or any(files.values()) else None


def connect(args: argparse.Namespace, *, read_only: bool = False) -> Switch:
    return Switch(args.grpc_addr, device_id=args.device_id, election_id=args.election_id,
                  timeout=args.timeout, arbitrate=not read_only, tls=tls_of(args))

