"""The testbed commands of `hysync`: deploy, teardown and serve, and the CLI's writes
routed through a running serve (`hysync --serve ADDR mode set ...`).

While `hysync serve` holds the switch it is the only primary: a CLI process that
arbitrated itself would be refused (election ids only go up). With `--serve ADDR` (or
HYSYNC_SERVE in the environment) `job add/remove`, `mode set`, `member
exclude/readmit` and `policy resume` are requests to the serve instead; reads need no
routing (they open no arbitration stream), but `stats JOB` through a serve also names
each member's host and the job's ranks it speaks for, which serve learned at admission.
`policy run` is serve's own work: through a serve it runs only as a dry run, and
otherwise says what to run instead.
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hysync import logs
from hysync.controlplane.cli.limits import seconds
from hysync.controlplane.cli.output import Handler, Output, UsageError, emit_latch
from hysync.controlplane.cli.switch_commands import cmd_policy_run, cmd_stats, wait_for_latch
from hysync.controlplane.controller import Controller
from hysync.controlplane.errors import ControlPlaneError, JobConfigError
from hysync.controlplane.job import JobConfig
from hysync.controlplane.p4rt.switch import DEFAULT_GRPC_ADDR, Switch
from hysync.controlplane.policy.member_hosts import MemberHost, describe
from hysync.controlplane.serve.auth import client_context, read_token
from hysync.controlplane.serve.client import ServeClient, ServeError
from hysync.controlplane.serve.fabric_server import FabricServer
from hysync.controlplane.serve.server import Server
from hysync.controlplane.tables.sync_mode import format_mode
from hysync.controlplane.testbed import deploy, fabric_deploy, probe
from hysync.controlplane.testbed.inventory import Inventory
from hysync.controlplane.toml_fields import read_toml
from hysync.wire import Mode


def _inventory(args: argparse.Namespace) -> Inventory:
    """The INVENTORY; a --grpc-addr other than its switch's is refused, not ignored."""
    inv = Inventory.load(args.inventory)
    given = getattr(args, "grpc_addr", DEFAULT_GRPC_ADDR)
    if given not in (DEFAULT_GRPC_ADDR, inv.switch.grpc_addr):
        raise UsageError(f"--grpc-addr {given} is not the switch of {args.inventory} "
                         f"(switch.grpc_addr = {inv.switch.grpc_addr!r}): drop --grpc-addr, "
                         "the inventory names the switch, or edit switch.grpc_addr in it")
    return inv


def cmd_deploy(args: argparse.Namespace, out: Output) -> None:
    """Prepare a testbed's switch for jobs. The pipeline, and l2 forwarding and
    flooding for every host of the INVENTORY.

    Idempotent: what the switch has already is not written again (a second run says
    "nothing to do"). --dry-run prints every P4Runtime write it would make and makes
    none. --check makes no write either: it reports reachability, arbitration, the
    pipeline's identity and the port map, one line per check, and exits non-zero if one
    fails. Run on a host of the inventory (--from HOST, or found by its data interface and
    address), as root, the port map check also pings every other host through the switch
    and waits up to --probe-wait (default: --timeout) for answers. A switch running another
    pipeline is refused unless --replace-pipeline. An INVENTORY of leaves and a spine is
    deployed on every switch, the spine first (--check takes one switch).
    """
    inv = _inventory(args)
    _refuse_exposed(inv, args)
    if args.probe_from is not None and not args.check:
        raise UsageError("--from HOST goes with --check (the host the probe starts on)")
    if inv.fabric is not None:
        return _deploy_fabric(args, out, inv)
    if args.check:
        source, no_source = probe.source_host(inv, args.probe_from)
        checks = deploy.check(inv, timeout=args.timeout, source=source, no_source=no_source,
                              probe_wait=args.probe_wait)
        out.emit({"checks": [{"name": c.name, "ok": None if c.skipped else c.ok,
                              "skipped": c.skipped, "detail": c.detail} for c in checks]},
                 "\n".join(c.line() for c in checks))
        failed = [c.name for c in checks if not c.ok and not c.skipped]
        if failed:
            raise ControlPlaneError(f"{len(failed)} check(s) failed: {', '.join(failed)}")
        return
    report = deploy.deploy(inv, dry_run=args.dry_run, replace_pipeline=args.replace_pipeline,
                           timeout=args.timeout)
    prefix = "would " if args.dry_run else ""
    lines = []
    if report.push:
        lines.append(f"{prefix}push pipeline {inv.switch.p4info}"
                     + (f" + {inv.switch.device_config}" if inv.switch.device_config else "")
                     + f" ({report.pipeline.detail if report.pipeline else ''})")
    lines += [f"{prefix}write {u}" for u in report.updates]
    if not lines:
        lines.append(f"nothing to do: {inv.switch.grpc_addr} already has the pipeline and the "
                     f"forwarding of {len(inv.hosts)} hosts")
    elif not args.dry_run:
        lines.append(f"deployed {inv.name or inv.path} on {inv.switch.grpc_addr}: "
                     f"{len(report.updates)} writes")
    out.emit({"push": report.push, "writes": [str(u) for u in report.updates],
              "dry_run": args.dry_run}, "\n".join(lines))


def _deploy_fabric(args: argparse.Namespace, out: Output, inv: Inventory) -> None:
    """deploy on every switch of leaves and a spine, spine first."""
    if args.check:
        raise UsageError(f"--check takes a one-switch inventory; {args.inventory} has leaves "
                         "and a spine: `hysync deploy --dry-run` reads every switch of it, "
                         "`hysync --inventory FILE job list` shows what each holds")
    done = fabric_deploy.deploy_fabric(inv, dry_run=args.dry_run,
                                       replace_pipeline=args.replace_pipeline,
                                       timeout=args.timeout)
    prefix = "would " if args.dry_run else ""
    lines, data = [], []
    for name, view, report in done:
        lines += ([f"{name}: {prefix}push pipeline {view.switch.p4info}"] if report.push
                  else [])
        lines += [f"{name}: {prefix}write {u}" for u in report.updates]
        data.append({"switch": name, "push": report.push,
                     "writes": [str(u) for u in report.updates]})
    writes = sum(len(r.updates) for _, _, r in done)
    if not lines:
        lines.append(f"nothing to do: the {len(done)} switches of {inv.name or inv.path} "
                     "already have the pipeline and their hosts' forwarding")
    elif not args.dry_run:
        lines.append(f"deployed {inv.name or inv.path} on {len(done)} switches: {writes} "
                     "writes")
    out.emit({"switches": data, "dry_run": args.dry_run}, "\n".join(lines))


def _refuse_exposed(inv: Inventory, args: argparse.Namespace) -> None:
    switches = [sw.switch for sw in inv.fabric.switches] if inv.fabric else [inv.switch]
    for info in switches:
        if not args.insecure and (why := info.exposed()):
            raise ControlPlaneError(why)


def cmd_teardown(args: argparse.Namespace, out: Output) -> None:
    """Remove what deploy and the INVENTORY's jobs wrote. Nothing else goes: the jobs
    whose members are its hosts, the hosts' l2 entries and flood ports.

    Stop `hysync serve` first (it holds the switch). --dry-run says what would go. With
    leaves and a spine: the jobs across them from every switch, then each leaf's.
    """
    inv = _inventory(args)
    lines: list[str] = []
    tear = deploy.teardown if inv.fabric is None else fabric_deploy.teardown_fabric
    n = tear(inv, dry_run=args.dry_run, timeout=args.timeout, say=lines.append)
    lines.append(f"{'would remove' if args.dry_run else 'removed'} {n} entries of "
                 f"{inv.name or inv.path}")
    out.emit({"updates": n, "dry_run": args.dry_run}, "\n".join(lines))


def cmd_serve(args: argparse.Namespace, out: Output) -> None:
    """Own the INVENTORY's switch until Ctrl-C or SIGTERM. Hold the P4Runtime primary role,
    admit jobs from training scripts (hysync.torch.attach), run each job's straggler
    policy, and carry out the CLI's writes (`hysync --serve ADDR ...`).

    A second serve against the same switch is refused; a restarted one reads the jobs
    back from the switch and keeps them for --claim-grace seconds for their scripts. With
    leaves and a spine it holds every switch and admits each job across the leaves of its
    hosts (no straggler policy there).
    """
    inv = _inventory(args)
    _refuse_exposed(inv, args)
    with logs.configured(args.log_format or ("json" if args.json else "text")):
        _serve(args, out, inv)


def _serve(args: argparse.Namespace, out: Output, inv: Inventory) -> None:
    kind = Server if inv.fabric is None else FabricServer
    server = kind(inv, policy=None if args.policy == "none" else args.policy,
                    policy_interval=args.policy_interval, policy_scale=args.policy_scale,
                    policy_log=Path(args.policy_log) if args.policy_log else None,
                    claim_grace=args.claim_grace, timeout=args.timeout,
                    state_file=Path(args.state_file) if args.state_file else None).start()
    endpoint = None
    try:
        if args.metrics_addr:
            from hysync.controlplane.serve.prometheus_collector import serve_metrics

            endpoint = serve_metrics(server, args.metrics_addr)
    except (OSError, ValueError) as err:  # a bad or taken --metrics-addr
        server.close()
        raise ServeError(str(err)) from None
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    metrics = f", metrics on http://{endpoint.address}/metrics" if endpoint else ""
    switches = ({sw.name: sw.switch.grpc_addr for sw in inv.fabric.switches} if inv.fabric
                else {"switch": inv.switch.grpc_addr})
    where = ", ".join(f"{name} {addr}" for name, addr in switches.items())
    out.emit({"listen": server.address, "grpc_addr": inv.switch.grpc_addr,
              "switches": switches, "metrics": endpoint.address if endpoint else None},
             f"serving {inv.name or inv.path}: {where}, requests on "
             f"{server.address}{metrics}")
    try:
        stop.wait()
    finally:
        if endpoint is not None:
            endpoint.close()
        server.close()


# ------------------------------------------------------------ routed through serve
def _request(args: argparse.Namespace, message: dict[str, Any]) -> dict[str, Any]:
    """One request to the serve, as the operator (the CLI acts on every job)."""
    token = read_token(args.token_file, "--token-file") if args.token_file else None
    tls = None
    if args.serve_tls:
        files = args.serve_tls.split(",")
        if len(files) != 3 or not all(files):
            raise UsageError(f"--serve-tls {args.serve_tls!r}: give CACERT,CERT,KEY (serve's "
                             "CA, this client's certificate and key)")
        tls = client_context(*files)
    with ServeClient(args.serve, timeout=max(args.timeout, 30.0), token=token,
                     operator=True, tls=tls) as client:
        return client.request(message)


def routed_job_add(args: argparse.Namespace, out: Output) -> None:
    job = JobConfig.load(args.file)  # a bad file fails here, in one line, as without serve
    data = read_toml(Path(args.file), JobConfigError, "the job file",
                     "controlplane/examples/job-loopback.toml")
    r = _request(args, {"op": "job_add", "job": data, "replace": args.replace})
    out.emit(r, f"job {job.job_id} {r['outcome']} ({r['updates']} updates) via {args.serve}")


def routed_job_remove(args: argparse.Namespace, out: Output) -> None:
    r = _request(args, {"op": "job_remove", "job": args.job})
    out.emit(r, f"job {args.job} removed ({r['updates']} updates) via {args.serve}")


def routed_mode_set(args: argparse.Namespace, out: Output) -> None:
    mode = Mode[args.mode.upper()]
    r = _request(args, {"op": "mode_set", "job": args.job, "slots": list(args.slots),
                        "mode": args.mode, "quorum": args.quorum, "level": args.level})
    latched, pending = None, None
    if args.wait is not None:
        # Serve holds the write session; the latch shows in the counters, which any
        # session reads without arbitrating (the switch serve names).
        grpc_addr = _request(args, {"op": "status"})["grpc_addr"]
        with Switch(grpc_addr, device_id=args.device_id, timeout=args.timeout,
                    arbitrate=False) as switch:
            latched, pending = wait_for_latch(Controller(switch), args, mode)
    lo, hi = r["slots"]
    note = (f"; an override: the job's policy holds until `hysync --serve {args.serve} policy "
            f"resume {args.job}`" if r["override"] else "")
    emit_latch(out, r, f"job {args.job} slots {lo}-{hi}: {format_mode(mode, r['quorum'])} "
                       f"({r['strategy']}) via {args.serve}{note}", args, latched, pending)


def routed_policy_resume(args: argparse.Namespace, out: Output) -> None:
    _request(args, {"op": "policy_resume", "job": args.job})
    out.emit({"job_id": args.job, "resumed": True},
             f"job {args.job}: handed back to its policy (via {args.serve})")


def routed_policy_run(args: argparse.Namespace, out: Output) -> None:
    """serve runs the policy of the jobs it admits: a second policy writing the same job
    would fight it. A dry run only reads, from the switch serve names."""
    if not args.dry_run:
        raise UsageError(f"`hysync serve` at {args.serve} runs the policy of every job it "
                         "admitted; to hand a job back to it after a mode set: hysync --serve "
                         f"{args.serve} policy resume JOB (policy run --dry-run only reads)")
    args.grpc_addr = _request(args, {"op": "status"})["grpc_addr"]
    cmd_policy_run(args, out)


def routed_stats(args: argparse.Namespace, out: Output) -> None:
    """stats read from the switch serve names, each member with its host and ranks."""
    status = _request(args, {"op": "status"})
    hosts: dict[int, MemberHost] = {}
    if args.job is not None:
        job = next((j for j in status["jobs"] if j["job_id"] == args.job), None)
        for h in (job or {}).get("hosts", []):
            hosts[h["member"]] = MemberHost.of_record(h)
    args.grpc_addr = status["grpc_addr"]
    cmd_stats(args, out, None if args.job is None else hosts)


def _routed_member(op: str, what: str) -> Handler:
    def run(args: argparse.Namespace, out: Output) -> None:
        r = _request(args, {"op": op, "job": args.job, "worker": args.worker})
        place = {args.worker: MemberHost.of_record(r)}
        named = describe(args.worker, place).replace("member", "worker", 1)
        out.emit(r, f"job {args.job}: {named} {what}; {r['members']} active "
                    f"members (via {args.serve})")
    return run


def routes() -> dict[str, Handler]:
    """Handler name in hysync.controlplane.cli.main -> its version through a serve."""
    return {"cmd_job_add": routed_job_add, "cmd_job_remove": routed_job_remove,
            "cmd_mode_set": routed_mode_set, "cmd_policy_resume": routed_policy_resume,
            "cmd_policy_run": routed_policy_run, "cmd_stats": routed_stats,
            "cmd_member_exclude": _routed_member("exclude", "excluded"),
            "cmd_member_readmit": _routed_member("readmit", "readmitted")}


def _host_port(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:9650)")
    return text


def add_commands(groups: argparse._SubParsersAction,  # type: ignore[type-arg]
                 command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command(groups, "deploy", cmd_deploy)
    p.add_argument("inventory", metavar="INVENTORY", help="TOML inventory of the testbed")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--dry-run", action="store_true", help="print the writes, make none")
    how.add_argument("--check", action="store_true", help="check the testbed, write nothing")
    p.add_argument("--insecure", action="store_true",
                   help="run against a switch that speaks P4Runtime in the clear off loopback")
    p.add_argument("--from", dest="probe_from", metavar="HOST",
                   help="--check runs on this host of the inventory: probe the others from it")
    p.add_argument("--probe-wait", type=seconds, metavar="SECONDS",
                   help="--check: how long the probe waits for the hosts' answers (default: "
                        "--timeout, which bounds each request to the switch)")
    p.add_argument("--replace-pipeline", action="store_true",
                   help="push the inventory's pipeline over another one (clears the switch)")
    p = command(groups, "teardown", cmd_teardown)
    p.add_argument("inventory", metavar="INVENTORY", help="TOML inventory of the testbed")
    p.add_argument("--dry-run", action="store_true", help="say what would be removed")
    p = command(groups, "serve", cmd_serve)
    p.add_argument("inventory", metavar="INVENTORY", help="TOML inventory of the testbed")
    p.add_argument("--policy", choices=["adaptive", "none"], default="adaptive",
                   help="the straggler policy of every admitted job, one per level across "
                   "switches (default adaptive)")
    p.add_argument("--policy-interval", type=seconds, default=0.5, metavar="SECONDS",
                   help="counter read interval of the policies (default 0.5)")
    p.add_argument("--policy-scale", type=seconds, default=1.0, metavar="FACTOR",
                   help="scale the policy's time constants (short test runs: 0.5)")
    p.add_argument("--policy-log", metavar="FILE", help="append every decision to FILE")
    p.add_argument("--claim-grace", type=seconds, default=30.0, metavar="SECONDS",
                   help="after a restart, how long jobs found on the switch wait for a claim")
    p.add_argument("--insecure", action="store_true",
                   help="own a switch that speaks P4Runtime in the clear off loopback")
    p.add_argument("--state-file", metavar="FILE",
                   help="where serve keeps its jobs' key digests across its restart (default "
                   "$XDG_STATE_HOME/hysync/serve-SWITCH.json, ~/.local/state without it)")
    p.add_argument("--metrics-addr", type=_host_port, metavar="HOST:PORT",
                   help="serve Prometheus metrics on http://HOST:PORT/metrics (default: off; "
                   "127.0.0.1:PORT keeps them on this host)")
    p.add_argument("--log-format", choices=logs.FORMATS,
                   help="log lines on stderr: text (default) or json, one object per line "
                   "(--json implies json)")
