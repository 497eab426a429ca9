"""`hysync rack up N` / `hysync rack down`: an emulated rack on one machine (root); with
`--racks R`, R racks of N hosts behind leaves and a spine (rack_fabric.py).

`up` builds N host namespaces, each on a veth to a switch namespace (offloads off on
every veth end: a user-space switch fills in no checksums), starts the softswitch on its
raw data plane in the switch namespace, writes the rack's inventory and prints the
commands that deploy it, serve it and train on it (docs/testbed.md, the worked example).
Every name carries the rack's tag (default `hyr`): namespaces `hyr-h1..hN` and `hyr-sw`,
host interfaces `hyrh1..`. The switch serves P4Runtime over mutual TLS and takes writes
from serve's certificate only (`--writer`): `up` makes the rack's CA and certificates in
/run/hysync/<tag>-pki, and the inventory names serve's. What `up` made is recorded in
/run/hysync/rack-<tag>.json, and `down` removes exactly that: the softswitch it started,
the namespaces and veths, the certificates. Nothing else on the machine is touched.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from hysync import resources
from hysync.controlplane.cli import rack_fabric
from hysync.controlplane.cli.output import Output, UsageError
from hysync.controlplane.errors import ControlPlaneError
from hysync.controlplane.p4rt.switch import wait_for_server
from hysync.controlplane.testbed.addresses import (
    RACK_MANAGEMENT_NET,
    SWITCH_IP,
    SWITCH_MAC,
    host_ip,
    host_mac,
)
from hysync.controlplane.testbed.certificates import SERVE_NAME, rack_certificates
from hysync.controlplane.testbed.netns import NetnsStar, missing_netns_tools, remove
from hysync.tls import ClientTls

STATE_DIR = Path("/run/hysync")
DEFAULT_TAG = "hyr"
MAX_HOSTS = 16  # host management /30s: 169.254.X.(4p+1), p <= 62; 16 is plenty for one box
MAX_RANKS_PER_HOST = 8  # the servers HySync is for carry 4-8 GPUs
MGMT_NET = RACK_MANAGEMENT_NET
MASTER_PORT = 29500


class RackError(ControlPlaneError):
    """The rack cannot be built or removed as asked; the message says what to do."""


def state_file(tag: str) -> Path:
    return STATE_DIR / f"rack-{tag}.json"


def pki_dir(tag: str) -> Path:
    """The rack's CA and certificates (only root reads the keys)."""
    return STATE_DIR / f"{tag}-pki"


def _tag(text: str) -> str:
    # interface names: tag + "h16" / "a16" within Linux's 15 characters
    if not re.fullmatch(r"[a-z][a-z0-9]{0,7}", text):
        raise argparse.ArgumentTypeError(f"tag {text!r} must be 1-8 lowercase letters or "
                                         "digits, starting with a letter (e.g. hyr)")
    return text


def _hosts(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 2 <= n <= MAX_HOSTS:
        raise argparse.ArgumentTypeError(f"N = {text!r}: a rack has 2..{MAX_HOSTS} hosts")
    return n


def inventory_text(hosts: int, tag: str = DEFAULT_TAG, *, net: str = MGMT_NET) -> str:
    """The inventory of the rack `up` builds (examples/rack.toml is the one of 3 hosts)."""
    lines = [
        f"# The emulated rack of `hysync rack up {hosts}` (docs/testbed.md): {hosts} host "
        f"namespaces {tag}-h1..{tag}-h{hosts},",
        f"# each on a veth to the switch namespace {tag}-sw, where the softswitch runs on its "
        "raw data plane.",
        f'name = "{tag}-rack"',
        "",
        "[switch]",
        f'grpc_addr = "{net}.2:9559"         # over the management veth {tag}m <-> {tag}n',
        "# Mutual TLS: the switch takes writes from this certificate (serve's) only.",
        f'cacert = "{pki_dir(tag)}/rack-ca.pem"',
        f'cert = "{pki_dir(tag)}/{SERVE_NAME}.pem"',
        f'private_key = "{pki_dir(tag)}/{SERVE_NAME}.key"',
        'target = "softswitch"',
        'p4info = "hysync:p4src/v1model/hysync.p4info.txtpb"   # the P4Info HySync ships',
        "election_id = 10",
        f'data_ipv4 = "{SWITCH_IP}"',
        f'data_mac = "{SWITCH_MAC}"',
        "data_udp_port = 48620",
        "",
        "[pool]",
        "job_slots = 32",
        "averaging_slots = 8",
        "",
        "[serve]                              # the namespaces share the filesystem",
        f'listen = "unix:{STATE_DIR}/{tag}-serve.sock"',
    ]
    for w in range(hosts):
        lines += ["", "[[hosts]]", f'name = "h{w + 1}"', f'interface = "{tag}h{w + 1}"',
                  f'ipv4 = "{host_ip(w)}"', f'mac = "{host_mac(w)}"', f"switch_port = {w + 1}"]
    return "\n".join(lines) + "\n"


def _racks(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= rack_fabric.MAX_RACKS:
        raise argparse.ArgumentTypeError(
            f"--racks {text!r}: give 1 (one switch) or 2..{rack_fabric.MAX_RACKS} (a leaf per "
            "rack and a spine)")
    return n


def _ranks_per_host(text: str) -> int:
    try:
        ranks = int(text)
    except ValueError:
        ranks = 0
    if not 1 <= ranks <= MAX_RANKS_PER_HOST:
        raise argparse.ArgumentTypeError(f"--ranks-per-host {text!r}: a host runs "
                                         f"1..{MAX_RANKS_PER_HOST} ranks (one per GPU)")
    return ranks


def next_steps(hosts: int, tag: str, inventory: Path, *, steps: int = 300,
               ranks_per_host: int = 1) -> list[str]:
    """The commands that deploy, serve and train on the rack, then take it down. With
    several ranks per host, the host's ranks reduce on the host first and its local rank
    0 is the switch member (HYSYNC_RANKS_PER_HOST=local); background averaging runs with
    one rank per host only, so those commands leave it out."""
    bin_dir = Path(sys.executable).parent
    hysync = str(bin_dir / "hysync") if (bin_dir / "hysync").exists() else "hysync"
    torchrun = str(bin_dir / "torchrun") if (bin_dir / "torchrun").exists() else "torchrun"
    script = resources.path("examples/train_ddp.py")
    lines = [f"{hysync} deploy {inventory}",
             f"ip netns exec {tag}-h1 {hysync} deploy --check {inventory}",
             f"{hysync} serve {inventory}    # in a terminal of its own; Ctrl-C after training"]
    grouped = "HYSYNC_RANKS_PER_HOST=local " if ranks_per_host > 1 else ""
    averaging = " --average-every 1" if ranks_per_host == 1 else ""
    for w in range(hosts):
        lines.append(
            f"ip netns exec {tag}-h{w + 1} env GLOO_SOCKET_IFNAME={tag}h{w + 1} {grouped}"
            f"OMP_NUM_THREADS=1 {torchrun} --nnodes {hosts} --nproc-per-node {ranks_per_host} "
            f"--node-rank {w} --master-addr {host_ip(0)} --master-port {MASTER_PORT} "
            f"{script} --inventory {inventory} --steps {steps}{averaging} &")
    lines += ["wait    # every rank prints its held-out accuracy",
              f"{hysync} teardown {inventory}    # once the serve is stopped",
              f"{hysync} rack down" + ("" if tag == DEFAULT_TAG else f" --tag {tag}")]
    return lines


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat): tells our softswitch apart
    from a later process that reused its pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]


def cmd_rack_up(args: argparse.Namespace, out: Output) -> None:
    """Build an emulated rack of N hosts on this machine (root). Network namespaces with
    veths to a switch namespace running the softswitch; writes the inventory (--inventory,
    default rack.toml) and prints the commands that deploy, serve and train on it.

    With --racks R (2 or more): R racks of N hosts, a leaf switch namespace per rack and a
    spine namespace, the `[[switches]]` inventory and a job file of every host written,
    and the commands that install the job and train on it printed (rack_fabric.py).

    `hysync rack down` removes what it built, and nothing else.
    """
    tag, inventory = args.tag, Path(args.inventory).resolve()
    state = state_file(tag)
    if args.racks > 1 and args.ranks_per_host > 1:
        raise UsageError(f"--ranks-per-host {args.ranks_per_host} with --racks {args.racks}: "
                         "a job across leaves and a spine has one rank per host; leave "
                         "--ranks-per-host out")
    if args.job is not None and args.racks == 1:
        raise UsageError("--job FILE names the job file of a cluster of racks: give --racks "
                         "2 or more, or leave --job out (one rack's jobs are serve's)")
    if args.job is not None and not Path(args.job).resolve().parent.is_dir():
        raise UsageError(f"--job {args.job}: {Path(args.job).resolve().parent} is not a "
                         "directory")
    if state.exists():
        raise RackError(f"rack {tag!r} is up already ({state}): `hysync rack down"
                        + ("" if tag == DEFAULT_TAG else f" --tag {tag}") + "` first")
    reason = missing_netns_tools("hysync rack up builds network namespaces and veths")
    if reason:
        raise RackError(reason)
    taken = [ns for ns in _namespaces() if ns.startswith(f"{tag}-")]
    if taken:
        raise RackError(f"namespaces {', '.join(taken)} exist but no rack {tag!r} was "
                        f"recorded: remove them (ip netns del NAME) or use another --tag")
    if not inventory.parent.is_dir():
        raise UsageError(f"--inventory {args.inventory}: {inventory.parent} is not a directory")
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    pki = pki_dir(tag)
    if args.racks > 1:
        rack_fabric.build(args, out, state=state, pki=pki, logs=STATE_DIR,
                          start_time=_start_time, stop=_stop, default_tag=DEFAULT_TAG,
                          master_port=MASTER_PORT)
        return
    try:
        certs = rack_certificates(pki, f"{MGMT_NET}.2")
    except BaseException:
        shutil.rmtree(pki, ignore_errors=True)
        raise
    star = NetnsStar(args.hosts, host_management=True, tag=tag, net=MGMT_NET)
    log = STATE_DIR / f"{tag}-softswitch.log"
    switch: subprocess.Popen | None = None
    try:
        ports = [a for p, ifname in star.switch_ifs.items() for a in ("-i", f"{p}@{ifname}")]
        tls = ["--server-cert-file", str(certs["switch_cert"]), "--server-key-file",
               str(certs["switch_key"]), "--ca-cert-file", str(certs["ca"]),
               "--writer", SERVE_NAME]
        with open(log, "w") as sink:  # `ip netns exec` execs: the pid is the softswitch's
            switch = subprocess.Popen(
                [*star.exec_in(star.switch_ns), sys.executable, "-m", "hysync.softswitch",
                 "--grpc-addr", star.grpc_addr, *ports, *tls, "--log-level", "warning"],
                stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)  # outlives this command, and its Ctrl-C
        wait_for_server(star.grpc_addr, 30, lambda: None if switch.poll() is None else
                        f"the softswitch exited; see {log}",
                        tls=ClientTls(certs["ca"], certs["serve_cert"], certs["serve_key"]))
        inventory.write_text(inventory_text(args.hosts, tag))
        state.write_text(json.dumps({
            **star.created(), "softswitch": {"pid": switch.pid,
                                             "start": _start_time(switch.pid)},
            "inventory": str(inventory), "log": str(log), "pki": str(pki)}, indent=1) + "\n")
    except BaseException:
        if switch is not None:
            _stop(switch.pid)
        star.close()
        shutil.rmtree(pki, ignore_errors=True)
        raise
    steps = next_steps(args.hosts, tag, inventory, ranks_per_host=args.ranks_per_host)
    out.emit({"tag": tag, "hosts": star.hosts, "ranks_per_host": args.ranks_per_host,
              "switch_namespace": star.switch_ns,
              "grpc_addr": star.grpc_addr, "inventory": str(inventory), "commands": steps},
             f"rack {tag!r} is up: hosts {', '.join(star.hosts)}; the softswitch in "
             f"{star.switch_ns} (P4Runtime {star.grpc_addr}, log {log})\n"
             f"inventory: {inventory}\nnext, as root:\n"
             + "\n".join(f"  {line}" for line in steps))


def cmd_rack_down(args: argparse.Namespace, out: Output) -> None:
    """Remove the emulated rack `hysync rack up` built: its softswitch, namespaces and
    veths, and nothing else. Stop `hysync serve` and the training first."""
    state = state_file(args.tag)
    try:
        made = json.loads(state.read_text())
    except FileNotFoundError:
        raise RackError(f"no rack {args.tag!r} is up (no {state}): nothing to remove") from None
    except (OSError, ValueError) as err:
        raise RackError(f"{state} is unreadable ({err}): remove the rack's namespaces "
                        "by hand (ip netns list) and the file") from None
    switches = made.get("softswitches") or [made.get("softswitch", {})]
    stopped = [bool(sw.get("pid") and sw.get("start") == _start_time(sw["pid"])
                    and _stop(sw["pid"])) for sw in switches]
    remove(made.get("namespaces", []), made.get("links", []))
    for log in made.get("logs") or ([made["log"]] if made.get("log") else []):
        with contextlib.suppress(FileNotFoundError):
            Path(log).unlink()
    if made.get("pki"):
        shutil.rmtree(made["pki"], ignore_errors=True)
    state.unlink()
    out.emit({"tag": args.tag, **made},
             f"rack {args.tag!r} removed: namespaces {', '.join(made.get('namespaces', []))}"
             + ("" if not any(stopped) else "; the softswitch stopped" if len(stopped) == 1
                else f"; {sum(stopped)} softswitches stopped")
             + (f" (the inventory {made.get('inventory')} and the job file {made['job']} stay)"
                if made.get("job") else f" (the inventory {made.get('inventory')} stays)"))


def _stop(pid: int, timeout: float = 10.0) -> bool:
    try:
        os.killpg(pid, signal.SIGTERM)  # its own session: the softswitch and nothing else
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if _start_time(pid) is None:
            return True
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    return True


def _namespaces() -> list[str]:
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def add_commands(groups: argparse._SubParsersAction,  # type: ignore[type-arg]
                 command: Callable[..., argparse.ArgumentParser]) -> None:
    g = groups.add_parser("rack", help="an emulated rack on this machine (root)",
                          description="an emulated rack on this machine (root)")
    racks = g.add_subparsers(dest="command", metavar="COMMAND", required=True,
                             parser_class=type(g))
    p = command(racks, "up", cmd_rack_up)
    p.add_argument("hosts", type=_hosts, metavar="N", help=f"hosts (2..{MAX_HOSTS})")
    p.add_argument("--inventory", default="rack.toml", metavar="FILE",
                   help="where to write the rack's inventory (default rack.toml)")
    p.add_argument("--tag", type=_tag, default=DEFAULT_TAG,
                   help=f"prefix of every name the rack uses (default {DEFAULT_TAG})")
    p.add_argument("--ranks-per-host", type=_ranks_per_host, default=1, metavar="R",
                   help="ranks each host runs, as a server runs one per GPU (default 1); the "
                        "printed commands start R per host, reduced on the host first")
    p.add_argument("--racks", type=_racks, default=1, metavar="R",
                   help="racks of N hosts each (default 1: one switch); 2 or more: a leaf "
                        "switch per rack and a spine, a job file of every host (--job)")
    p.add_argument("--job", metavar="FILE",
                   help="with --racks: where to write the job file (default NAME-job.toml "
                        "beside the inventory NAME.toml)")
    p = command(racks, "down", cmd_rack_down)
    p.add_argument("--tag", type=_tag, default=DEFAULT_TAG,
                   help=f"the rack's tag (default {DEFAULT_TAG})")
