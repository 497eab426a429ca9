"""`hysync`: the HySync control plane from the command line.

Each call is a new process that connects to the switch, rebuilds the job registry
from the switch's own tables (`Controller.attach`), does one thing and exits.
Global options follow p4runtime-shell: --grpc-addr, --device-id, --election-id.
Commands that only read (job list, mode show, stats) open no arbitration stream,
so they never disturb a running primary controller.

Exit status 0 on success; on failure one line `hysync: error: ...` on stderr
(1: the operation failed, 2: bad command line or input file, refused before anything
is sent, 3: `mode set --wait` wrote the mode but the range did not latch it in time,
e.g. no traffic). `hysync sniff IFACE` talks to no switch: it prints the HySync headers
seen on an interface (hysync.scapy).

(Over 500 lines for a reason: every subcommand's handler and its argparse lines sit
next to each other, and each handler is a few lines over the controller's API.)
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn, TextIO

import hysync
from hysync import wire
from hysync.controlplane.cli import limits
from hysync.controlplane.controller import Controller, LatchTimeoutError
from hysync.controlplane.errors import ControlPlaneError, NotPrimaryError
from hysync.controlplane.job import JobConfig
from hysync.controlplane.p4rt.device_config import TARGETS
from hysync.controlplane.p4rt.switch import DEFAULT_GRPC_ADDR, Switch, parse_election_id
from hysync.controlplane.policy.policies import POLICIES, Decision, make_policy, mode_text
from hysync.controlplane.policy.runner import PolicyRunner, latest_decision
from hysync.controlplane.serve.auth import TOKEN_ENV
from hysync.controlplane.tables.counters import JobRates, JobStats, rates_between
from hysync.controlplane.tables.installed import InstalledJob
from hysync.controlplane.tables.sync_mode import format_mode
from hysync.errors import BadFileError, HySyncError
from hysync.p4schema import Schema
from hysync.tls import ClientTls
from hysync.wire import Mode

PROG = "hysync"


class UsageError(Exception):
    """A command line that cannot be carried out as written (exit 2)."""


class NotLatchedError(HySyncError):
    """`mode set --wait`: the write landed, the range did not latch in time (exit 3)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


# ------------------------------------------------------------ argument types
JOB_HELP = "the job id (1..255), as `hysync job list` shows it"


def _job_id(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) < wire.MAX_JOBS:
        raise argparse.ArgumentTypeError(f"job id {text!r} must be a number 1..255")
    return int(text)


def _worker(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) < wire.MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"worker id {text!r} must be a number 0..31")
    return int(text)


def _slots(text: str) -> tuple[int, int]:
    low, sep, high = text.partition("-")
    if not sep:
        high = low
    if not (low.strip().isdigit() and high.strip().isdigit()):
        raise argparse.ArgumentTypeError(
            f"bad slot range {text!r}: write it as A-B (inclusive), e.g. --slots 0-127")
    a, b = int(low), int(high)
    if b >= wire.NUM_SLOTS:
        raise argparse.ArgumentTypeError(
            f"bad slot range {text!r}: the switch's slots are 0-{wire.NUM_SLOTS - 1}")
    if a > b:
        raise argparse.ArgumentTypeError(
            f"bad slot range {text!r}: the first slot is above the last; write {b}-{a}")
    return a, b


def _election(text: str) -> tuple[int, int]:
    try:
        return parse_election_id(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= limits.MAX_SECONDS:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(
            f"{text!r} must be a number of seconds > 0 and at most {limits.MAX_SECONDS:.0f} "
            "(30 days)")
    return value


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number >= 1")
    return int(text)


# ------------------------------------------------------------ output
class _Out:
    def __init__(self, as_json: bool, stream: TextIO) -> None:
        self.as_json = as_json
        self.stream = stream

    def emit(self, data: object, text: str) -> None:
        print(json.dumps(data, sort_keys=True) if self.as_json else text, file=self.stream,
              flush=True)


def _job_line(job: InstalledJob) -> str:
    lo, hi = job.slots
    modes = ", ".join(f"{s.low}-{s.high} {format_mode(s.mode, s.quorum)}"
                      for s in job.segments())
    excluded = sorted(m.worker for m in job.members if m.worker not in job.active)
    excl = f", excluded {', '.join(map(str, excluded))}" if excluded else ""
    return (f"job {job.job_id}: slots {lo}-{hi}, {len(job.active)}/{len(job.members)} "
            f"members active{excl}; modes: {modes or 'none'}")


# ------------------------------------------------------------ commands
Handler = Callable[[argparse.Namespace, _Out], None]


def cmd_pipeline_push(args: argparse.Namespace, out: _Out) -> None:
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
    with _connect(args) as switch:
        switch.push_pipeline(schema, device_config, target=args.target)
    out.emit({"grpc_addr": args.grpc_addr, "p4info": str(p4info),
              "tables": len(schema.tables), "counters": len(schema.counters)},
             f"pipeline pushed to {args.grpc_addr}: {p4info} ({len(schema.tables)} tables, "
             f"{len(schema.counters)} counters)")


def cmd_job_add(args: argparse.Namespace, out: _Out) -> None:
    """Install the job described by a TOML job file (see controlplane/examples/).

    Adding a job that is already installed the same way changes nothing; installed
    differently it is refused unless --replace.
    """
    job = JobConfig.load(args.file)
    with _connect(args) as switch:
        report = Controller(switch).attach().add_job(job, replace=args.replace)
    lo, hi = job.slots
    out.emit({"job_id": job.job_id, "outcome": report.outcome, "updates": report.updates,
              "slots": [lo, hi], "members": len(job.members)},
             f"job {job.job_id} {report.outcome} ({report.updates} updates): "
             f"{len(job.members)} members, slots {lo}-{hi}, mode "
             f"{format_mode(job.mode, job.quorum)}")


def cmd_job_remove(args: argparse.Namespace, out: _Out) -> None:
    """Delete every entry of a job, and the l2 entries and flood ports no other job uses."""
    with _connect(args) as switch:
        written = Controller(switch).attach().remove_job(args.job)
    out.emit({"job_id": args.job, "updates": written},
             f"job {args.job} removed ({written} updates)")


def cmd_job_list(args: argparse.Namespace, out: _Out) -> None:
    """List the jobs installed on the switch, read back from its tables."""
    with _connect(args, read_only=True) as switch:
        controller = Controller(switch).attach()
        jobs = controller.list_jobs()
    lines = [_job_line(j) for j in jobs if j.complete] or ["no jobs installed"]
    lines += [f"warning: {p}" for p in controller.problems]
    out.emit({"jobs": [j.to_dict() for j in jobs], "problems": controller.problems},
             "\n".join(lines))


def cmd_mode_set(args: argparse.Namespace, out: _Out) -> None:
    """Hot-swap the desired mode of a slot range: sync, partial --quorum Q, or async.

    Each slot latches the new mode when its next round starts. With --wait SECONDS,
    wait until the job's counters show every slot of the range has latched it, and
    report how long that took.
    """
    mode = Mode[args.mode.upper()]
    if mode == Mode.PARTIAL and args.quorum is None:
        raise UsageError("partial needs --quorum Q (1 <= Q <= the job's active members)")
    if mode != Mode.PARTIAL and args.quorum is not None:
        raise UsageError(f"--quorum is for partial only; {args.mode} takes none")
    with _connect(args) as switch:
        controller = Controller(switch).attach()
        report = controller.set_mode(args.job, slots=args.slots, mode=mode, quorum=args.quorum)
        latched, pending = wait_for_latch(controller, args, mode)
    lo, hi = report.slots
    how = {"modify": "one MODIFY", "insert": "new range entry",
           "unchanged": "already set"}[report.strategy]
    text = f"job {args.job} slots {lo}-{hi}: {format_mode(mode, report.quorum)} ({how})"
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


def emit_latch(out: _Out, data: dict[str, object], text: str, args: argparse.Namespace,
               latched: float | None, pending: LatchTimeoutError | None) -> None:
    """The write's report with what --wait saw; a write not latched in time exits 3."""
    if latched is not None:
        text += f"; latched after {latched:.3f} s"
    elif pending is not None:
        text += f"; written, not latched within {args.wait:g} s"
    out.emit(dict(data, latched_after=latched,
                  latched=None if args.wait is None else pending is None), text)
    if pending is not None:
        raise NotLatchedError(f"the mode is written on the switch; {pending}")


def cmd_mode_show(args: argparse.Namespace, out: _Out) -> None:
    """Show the desired mode of every slot of a job, and the modes-table entries."""
    with _connect(args, read_only=True) as switch:
        job = Controller(switch).attach().job(args.job)
    lines = [f"job {job.job_id} slots {job.slots[0]}-{job.slots[1]}, "
             f"{len(job.active)} active members"]
    lines += [f"  slots {s.low}-{s.high}: {format_mode(s.mode, s.quorum)}" for s in job.segments()]
    lines += [f"  entry {r.low}-{r.high} priority {r.priority}: {format_mode(r.mode, r.quorum)}"
              for r in sorted(job.modes, key=lambda r: r.priority)]
    data = job.to_dict()
    out.emit({"job_id": job.job_id, "modes": data["modes"], "entries": data["mode_entries"]},
             "\n".join(lines))


def cmd_member_exclude(args: argparse.Namespace, out: _Out) -> None:
    """Take a worker out of a job (a persistent straggler): the job's rounds stop waiting
    for it and it no longer receives results."""
    with _connect(args) as switch:
        report = Controller(switch).attach().exclude(args.job, args.worker)
    _membership(out, "excluded", report.job_id, report.worker, report.members, report.quorums)


def cmd_member_readmit(args: argparse.Namespace, out: _Out) -> None:
    """Bring an excluded worker back into its job."""
    with _connect(args) as switch:
        report = Controller(switch).attach().readmit(args.job, args.worker)
    _membership(out, "readmitted", report.job_id, report.worker, report.members, report.quorums)


def _membership(out: _Out, what: str, job: int, worker: int, members: int,
                quorums: Sequence[tuple[int, int, int, int]]) -> None:
    text = f"job {job}: worker {worker} {what}; {members} active members"
    for lo, hi, old, new in quorums:
        text += f"; slots {lo}-{hi} quorum {old} -> {new}"
    out.emit({"job_id": job, "worker": worker, "members": members,
              "quorums": [{"slots": [lo, hi], "old": old, "new": new}
                          for lo, hi, old, new in quorums]}, text)


def cmd_policy_run(args: argparse.Namespace, out: _Out) -> None:
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
        switch = _connect(args, read_only=args.dry_run)
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
            out.emit(record, f"{_clock(record)} job {args.job}: "
                             f"{_decision_text(record)}{error}")

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


def _clock(record: dict[str, object]) -> str:
    """A decision's wall-clock time, local, to the tenth of a second (its `time` is the
    monotonic clock's, which only orders decisions)."""
    wall = record.get("wall")
    if not isinstance(wall, int | float):
        wall = PolicyRunner.wall_time(float(record["time"]))  # type: ignore[arg-type]
    stamp = datetime.datetime.fromtimestamp(wall)
    return f"{stamp:%H:%M:%S}.{stamp.microsecond // 100000}"


def cmd_policy_resume(args: argparse.Namespace, out: _Out) -> None:
    """Hand a job back to the straggler policy of the `hysync serve` that holds it: an
    operator's `mode set` through serve holds the job's policy until then. Needs --serve."""
    raise UsageError("policy resume hands a job back to the policy of `hysync serve`: give "
                     "--serve ADDR (or HYSYNC_SERVE=ADDR)")


def _decision_text(record: dict[str, object]) -> str:
    """One line for a decision-log record."""
    if record.get("action") == "start":
        dry = " (dry run)" if record.get("dry_run") else ""
        return f"started{dry}, {record.get('mode')}"
    return Decision.from_dict(record).describe()


def cmd_stats(args: argparse.Namespace, out: _Out) -> None:
    """Per-worker counters of a job (contributions, late, duplicates, stale, closes,
    results) and its drops by reason. With --watch SECONDS, refresh every SECONDS with
    rates. With --policy-log FILE, also the latest decision of `hysync policy run
    --log FILE` for the job. With --switch instead of JOB: every drop of the switch by
    reason, whatever job id the dropped packet's bytes named."""
    if (args.job is None) == (not args.switch):
        raise UsageError("stats needs JOB or --switch (not both)")
    if args.switch and (args.watch is not None or args.policy_log is not None):
        raise UsageError("stats --switch takes neither --watch nor --policy-log")
    with _connect(args, read_only=True) as switch:
        controller = Controller(switch).attach()
        if args.switch:
            s = controller.switch_stats()
            drops = ", ".join(f"{k} {v}" for k, v in s.drops.items() if v)
            out.emit(s.to_dict(), f"switch drops: {drops or 'none'}")
            return
        before = controller.stats(args.job)
        if args.watch is None:
            data, text = _with_policy(args, before.to_dict(), _stats_table(before, None))
            out.emit(data, text)
            return
        refreshes = 0
        clear = "\x1b[H\x1b[2J" if out.stream.isatty() and not out.as_json else ""
        try:
            while args.count is None or refreshes < args.count:
                time.sleep(args.watch)
                now = controller.stats(args.job)
                r = rates_between(before, now)
                data, text = _with_policy(args, dict(now.to_dict(), rates=r.to_dict()),
                                          _stats_table(now, r))
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
    line = (f"policy: {_decision_text(record)} (at {_clock(record)})" if record
            else f"policy: no decision for job {args.job} in {args.policy_log}")
    return dict(data, policy=record), f"{text}\n{line}"


def _stats_table(s: JobStats, rates: JobRates | None) -> str:
    head = f"{'worker':>6} {'active':>6} {'contrib':>10} {'late':>8} {'dup':>8} {'stale':>8} " \
           f"{'results':>10}"
    if rates:
        head += f" {'contrib/s':>10} {'results/s':>10}"
    lines = [f"job {s.job_id}", head]
    for w in s.workers.values():
        line = (f"{w.worker:>6} {'yes' if w.active else 'no':>6} {w.contributions:>10} "
                f"{w.late:>8} {w.duplicates:>8} {w.stale:>8} {w.results:>10}")
        if rates and w.worker in rates.workers:
            r = rates.workers[w.worker]
            line += f" {r.contributions:>10.1f} {r.results:>10.1f}"
        lines.append(line)
    drops = ", ".join(f"{k} {v}" for k, v in s.drops.items() if v)
    lines.append(f"drops: {drops or 'none'}")
    return "\n".join(lines)


# ------------------------------------------------------------ plumbing
def cmd_sniff(args: argparse.Namespace, out: _Out) -> None:
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


def _connect(args: argparse.Namespace, *, read_only: bool = False) -> Switch:
    return Switch(args.grpc_addr, device_id=args.device_id, election_id=args.election_id,
                  timeout=args.timeout, arbitrate=not read_only, tls=tls_of(args))


def _doc(handler: Handler) -> tuple[str, str]:
    """(first sentence, whole docstring) of a command handler: its help texts."""
    doc = inspect.cleandoc(handler.__doc__ or "")
    first = " ".join(doc.split("\n\n", 1)[0].split())
    return first.split(". ", 1)[0].rstrip("."), doc


def _add_common(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """The global options. Subcommands accept them too, with SUPPRESS defaults so that
    a value given before the subcommand is not overwritten by a default after it."""
    def default(value: object) -> object:
        return value if top else argparse.SUPPRESS

    parser.add_argument("--grpc-addr", default=default(DEFAULT_GRPC_ADDR), metavar="HOST:PORT",
                        help=f"the switch's P4Runtime address (default {DEFAULT_GRPC_ADDR})")
    parser.add_argument("--device-id", type=limits.device_id, default=default(1),
                        help="P4Runtime device id (default 1)")
    parser.add_argument("--election-id", type=_election, default=default((0, 1)),
                        metavar="ID|HIGH,LOW", help="election id (default 1)")
    parser.add_argument("--timeout", type=_seconds, default=default(5.0), metavar="SECONDS",
                        help="deadline of each request (default 5)")
    parser.add_argument("--json", action="store_true", default=default(False),
                        help="print machine-readable JSON")
    parser.add_argument("--serve", type=limits.serve_address,
                        default=default(os.environ.get("HYSYNC_SERVE")),
                        metavar="ADDR", help="send writes to the `hysync serve` at ADDR "
                        "(HOST:PORT or unix:PATH; default $HYSYNC_SERVE)")
    parser.add_argument("--token-file", default=default(os.environ.get(TOKEN_ENV)),
                        metavar="FILE", help="with --serve: the file holding the serve's token "
                        f"(default ${TOKEN_ENV})")
    parser.add_argument("--serve-tls", default=default(os.environ.get("HYSYNC_SERVE_TLS")),
                        metavar="CACERT,CERT,KEY", help="with --serve: mutual TLS with the "
                        "serve (default $HYSYNC_SERVE_TLS)")
    # P4Runtime over TLS, named as p4runtime-shell names them (hysync/tls.py).
    parser.add_argument("--ssl", action="store_true", default=default(False),
                        help="P4Runtime over TLS (implied by the three options below)")
    parser.add_argument("--cacert", default=default(None), metavar="PEM",
                        help="the CA certificate that signed the switch's (TLS)")
    parser.add_argument("--cert", default=default(None), metavar="PEM",
                        help="this controller's certificate, for mutual TLS")
    parser.add_argument("--private-key", default=default(None), metavar="PEM",
                        help="this controller's private key, for mutual TLS")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    _add_common(common, top=False)
    parser = _Parser(prog=PROG, description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"{PROG} {hysync.__version__}")
    _add_common(parser, top=True)
    groups = parser.add_subparsers(dest="group", metavar="COMMAND", required=True,
                                   parser_class=_Parser)

    def command(sub: argparse._SubParsersAction, name: str,  # type: ignore[type-arg]
                handler: Handler) -> argparse.ArgumentParser:
        short, long = _doc(handler)
        p: argparse.ArgumentParser = sub.add_parser(
            name, help=short, description=long, parents=[common],
            formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(handler=handler)
        return p

    def group(name: str, help_text: str) -> argparse._SubParsersAction:  # type: ignore[type-arg]
        g = groups.add_parser(name, help=help_text, description=help_text)
        return g.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                parser_class=_Parser)

    pipeline = group("pipeline", "the switch's forwarding pipeline")
    p = command(pipeline, "push", cmd_pipeline_push)
    p.add_argument("--p4info", metavar="FILE", help="text P4Info file")
    p.add_argument("--device-config", metavar="FILE",
                   help="BMv2 JSON, or with --target tofino p4c-barefoot's .conf file")
    p.add_argument("--target", choices=TARGETS, default="bmv2",
                   help="how to pack --device-config (default bmv2: as it is)")
    p.add_argument("--config", metavar="P4INFO[,DEVICE_CONFIG]",
                   help="p4runtime-shell's form of the two options above")

    jobs = group("job", "install, remove and list jobs")
    p = command(jobs, "add", cmd_job_add)
    p.add_argument("file", metavar="FILE", help="TOML job file")
    p.add_argument("--replace", action="store_true",
                   help="replace a job installed with the same id but a different definition")
    p = command(jobs, "remove", cmd_job_remove)
    p.add_argument("job", type=_job_id, metavar="JOB", help=JOB_HELP)
    command(jobs, "list", cmd_job_list)

    modes = group("mode", "hot-swap and show the sync mode of slot ranges")
    p = command(modes, "set", cmd_mode_set)
    p.add_argument("job", type=_job_id, metavar="JOB", help=JOB_HELP)
    p.add_argument("--slots", type=_slots, required=True, metavar="A-B",
                   help="slot range, inclusive (inside the job's slots)")
    p.add_argument("mode", choices=[m.name.lower() for m in Mode], metavar="{sync,partial,async}")
    p.add_argument("--quorum", type=limits.quorum, metavar="Q",
                   help="partial: close a round at the first Q contributions")
    p.add_argument("--wait", type=_seconds, metavar="SECONDS",
                   help="wait up to SECONDS until every slot has latched the mode")
    p = command(modes, "show", cmd_mode_show)
    p.add_argument("job", type=_job_id, metavar="JOB", help=JOB_HELP)

    members = group("member", "exclude and readmit members of a job")
    for name, handler in (("exclude", cmd_member_exclude), ("readmit", cmd_member_readmit)):
        p = command(members, name, handler)
        p.add_argument("job", type=_job_id, metavar="JOB", help=JOB_HELP)
        p.add_argument("worker", type=_worker, metavar="WORKER",
                       help="the member's worker id in the job (0..31)")

    policies = group("policy", "run a straggler policy on a job, or hand one back to serve's")
    p = command(policies, "run", cmd_policy_run)
    p.add_argument("job", type=_job_id, metavar="JOB", help=JOB_HELP)
    p.add_argument("--policy", choices=POLICIES, default="adaptive",
                   help="the policy (default adaptive)")
    p.add_argument("--interval", type=_seconds, default=0.5, metavar="SECONDS",
                   help="counter read interval (default 0.5)")
    p.add_argument("--duration", type=_seconds, metavar="SECONDS",
                   help="stop after SECONDS (default: until Ctrl-C)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the decisions, change nothing on the switch")
    p.add_argument("--log", metavar="FILE", help="append every decision to FILE (JSON lines)")
    p = command(policies, "resume", cmd_policy_resume)
    p.add_argument("job", type=_job_id, metavar="JOB", help=JOB_HELP)

    p = command(groups, "stats", cmd_stats)
    p.add_argument("job", type=_job_id, metavar="JOB", nargs="?", help=JOB_HELP)
    p.add_argument("--switch", action="store_true",
                   help="switch-wide drops by reason instead of one job's counters")
    p.add_argument("--watch", type=_seconds, metavar="SECONDS",
                   help="refresh every SECONDS, with rates, until Ctrl-C")
    p.add_argument("--count", type=_count, metavar="N", help="with --watch: stop after N refreshes")
    p.add_argument("--policy-log", metavar="FILE",
                   help="show the latest decision of `hysync policy run --log FILE`")

    p = command(groups, "sniff", cmd_sniff)
    p.add_argument("iface", metavar="IFACE", help="the interface to capture on")
    p.add_argument("--count", type=_count, metavar="N", help="stop after N HySync packets")
    p.add_argument("--duration", type=_seconds, metavar="SECONDS",
                   help="stop after SECONDS (default: until Ctrl-C)")

    from hysync.controlplane.cli import (
        completion,
        top,  # import this module: last
    )
    from hysync.controlplane.cli import testbed_commands as testbed_cli

    testbed_cli.add_commands(groups, command)
    top.add_command(groups, command, _seconds, _count)
    completion.add_command(groups, command)
    from hysync.controlplane.cli import rack

    rack.add_commands(groups, command)
    return parser


def main(argv: Sequence[str] | None = None, *, stdout: TextIO | None = None,
         stderr: TextIO | None = None) -> int:
    """Run one hysync command; return the exit status."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        handler = args.handler
        if args.serve:
            from hysync.controlplane.cli.testbed_commands import routes

            handler = routes().get(handler.__name__, handler)
        handler(args, _Out(args.json, stdout))
    except (UsageError, BadFileError) as err:
        _error(stderr, str(err))
        return 2
    except NotLatchedError as err:
        _error(stderr, str(err))
        return 3
    except HySyncError as err:
        _error(stderr, str(err))
        return 1
    except SystemExit as exit_:  # --help
        return exit_.code if isinstance(exit_.code, int) else 0
    except KeyboardInterrupt:
        return 130
    return 0


def _error(stderr: TextIO, message: str) -> None:
    print(f"{PROG}: error: {' '.join(message.split())}", file=stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
