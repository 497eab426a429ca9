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

This module builds the command line: the global options, every command's arguments,
and the exit status of each outcome. The commands themselves live beside it:
switch_commands.py (one switch, directly), testbed_commands.py (deploy, serve, and the
writes routed through a serve), rack.py, top.py, completion.py.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
from collections.abc import Sequence
from typing import NoReturn, TextIO

import hysync
from hysync import wire
from hysync.controlplane.cli import (
    completion,
    fabric_commands,
    limits,
    rack,
    testbed_commands,
    top,
)
from hysync.controlplane.cli.output import Handler, NotLatchedError, Output, UsageError
from hysync.controlplane.cli.switch_commands import (
    cmd_job_add,
    cmd_job_list,
    cmd_job_remove,
    cmd_member_exclude,
    cmd_member_readmit,
    cmd_mode_set,
    cmd_mode_show,
    cmd_pipeline_push,
    cmd_policy_resume,
    cmd_policy_run,
    cmd_sniff,
    cmd_stats,
)
from hysync.controlplane.p4rt.device_config import TARGETS
from hysync.controlplane.p4rt.switch import DEFAULT_GRPC_ADDR, parse_election_id
from hysync.controlplane.policy.policies import POLICIES
from hysync.controlplane.serve.auth import TOKEN_ENV
from hysync.errors import BadFileError, HySyncError
from hysync.wire import Mode

PROG = "hysync"


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
    parser.add_argument("--timeout", type=limits.seconds, default=default(5.0), metavar="SECONDS",
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

    def inventory(p: argparse.ArgumentParser, default: object = argparse.SUPPRESS) -> None:
        p.add_argument("--inventory", metavar="FILE", default=default,
                       help="job add|remove|list, mode set|show, policy run: act on the "
                       "switches of this TOML "
                       "inventory; with leaves and a spine, on every switch the job spans")

    inventory(parser, None)

    jobs = group("job", "install, remove and list jobs")
    p = command(jobs, "add", cmd_job_add)
    p.add_argument("file", metavar="FILE", help="TOML job file")
    p.add_argument("--replace", action="store_true",
                   help="replace a job installed with the same id but a different definition")
    inventory(p)
    p = command(jobs, "remove", cmd_job_remove)
    p.add_argument("job", type=_job_id, metavar="JOB", help=JOB_HELP)
    inventory(p)
    inventory(command(jobs, "list", cmd_job_list))

    modes = group("mode", "hot-swap and show the sync mode of slot ranges")
    p = command(modes, "set", cmd_mode_set)
    p.add_argument("job", type=_job_id, metavar="JOB", help=JOB_HELP)
    p.add_argument("--slots", type=_slots, required=True, metavar="A-B",
                   help="slot range, inclusive (inside the job's slots)")
    p.add_argument("mode", choices=[m.name.lower() for m in Mode], metavar="{sync,partial,async}")
    p.add_argument("--quorum", type=limits.quorum, metavar="Q",
                   help="partial: close a round at the first Q contributions")
    p.add_argument("--wait", type=limits.seconds, metavar="SECONDS",
                   help="wait up to SECONDS until every slot has latched the mode")
    p.add_argument("--level", metavar="LEVEL", help="with --inventory of leaves and a spine: "
                   f"{fabric_commands.LEVEL_HELP} (default: every level)")
    inventory(p)
    p = command(modes, "show", cmd_mode_show)
    inventory(p)
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
    p.add_argument("--interval", type=limits.seconds, default=0.5, metavar="SECONDS",
                   help="counter read interval (default 0.5)")
    p.add_argument("--duration", type=limits.seconds, metavar="SECONDS",
                   help="stop after SECONDS (default: until Ctrl-C)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the decisions, change nothing on the switch")
    p.add_argument("--log", metavar="FILE", help="append every decision to FILE (JSON lines)")
    p.add_argument("--level", metavar="LEVEL", help="with --inventory of leaves and a spine: "
                   f"{fabric_commands.LEVEL_HELP} (default: a policy at every level)")
    inventory(p)
    p = command(policies, "resume", cmd_policy_resume)
    p.add_argument("job", type=_job_id, metavar="JOB", help=JOB_HELP)

    p = command(groups, "stats", cmd_stats)
    p.add_argument("job", type=_job_id, metavar="JOB", nargs="?", help=JOB_HELP)
    p.add_argument("--switch", action="store_true",
                   help="switch-wide drops by reason instead of one job's counters")
    p.add_argument("--watch", type=limits.seconds, metavar="SECONDS",
                   help="refresh every SECONDS, with rates, until Ctrl-C")
    p.add_argument("--count", type=limits.count, metavar="N",
                   help="with --watch: stop after N refreshes")
    p.add_argument("--policy-log", metavar="FILE",
                   help="show the latest decision of `hysync policy run --log FILE`")

    p = command(groups, "sniff", cmd_sniff)
    p.add_argument("iface", metavar="IFACE", help="the interface to capture on")
    p.add_argument("--count", type=limits.count, metavar="N", help="stop after N HySync packets")
    p.add_argument("--duration", type=limits.seconds, metavar="SECONDS",
                   help="stop after SECONDS (default: until Ctrl-C)")

    testbed_commands.add_commands(groups, command)
    top.add_command(groups, command)
    completion.add_command(groups, command, parser)
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
        if (getattr(args, "level", None) and not getattr(args, "inventory", None)
                and not getattr(args, "serve", None)):
            raise UsageError(f"--level {args.level} needs --inventory FILE (or --serve ADDR of "
                             "a serve across switches): the testbed's inventory says which "
                             "switch is the spine and which are leaves")
        if getattr(args, "inventory", None) and handler.__name__ in fabric_commands.routes():
            if args.serve:
                raise UsageError("--inventory and --serve together: the serve holds the "
                                 "switches; send the command to it, or give --inventory alone")
            handler = fabric_commands.routes()[handler.__name__]
        if args.serve:
            handler = testbed_commands.routes().get(handler.__name__, handler)
        handler(args, Output(args.json, stdout))
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

