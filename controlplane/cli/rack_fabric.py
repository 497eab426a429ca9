"""`hysync rack up N --racks R` (R >= 2): R racks of N hosts, a leaf switch per rack and a
spine, all on this machine (root); `hysync rack down` removes it as it removes one rack.

The network is controlplane/testbed/netns_fabric.py's. Up starts a softswitch on its raw
data plane in each switch namespace (the spine first), its pipeline loaded at start and
P4Runtime over mutual TLS that takes writes from serve's certificate only, writes the
`[[switches]]` inventory and a job file of every host (one member per host, worker ids per
leaf), and prints the commands that install the job across the switches and train on it
with torchrun, one rank per host. A job across switches is installed from its job file
(`hysync --inventory FILE job add`), not admitted by a serve, so there is no deploy and no
serve to run. The record in /run/hysync/rack-<tag>.json lists every softswitch it started
and every namespace and root-namespace link it made.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from hysync import resources
from hysync.controlplane.cli.output import Output
from hysync.controlplane.p4rt.switch import wait_for_server
from hysync.controlplane.testbed.addresses import FABRIC_MANAGEMENT_NET
from hysync.controlplane.testbed.certificates import SERVE_NAME, fabric_certificates
from hysync.controlplane.testbed.netns_fabric import (
    NetnsFabric,
    front_end_ip,
    grpc_addr,
    host_ip,
    host_mac,
    management_net,
    switch_data,
)
from hysync.tls import ClientTls

JOB_ID = 1
JOB_SLOTS = 32
HOST_UDP_PORT = 47000  # each host binds it in its own namespace
MAX_RACKS = 8  # leaves of one machine's cluster; leaf names stay in the job's order


def leaf_name(rack: int) -> str:
    return f"leaf-{rack + 1}"


def switch_names(racks: int) -> list[str]:
    """The spine, then each rack's leaf: switch i answers at netns_fabric.grpc_addr(i)."""
    return ["spine", *(leaf_name(r) for r in range(racks))]


def inventory_text(racks: int, hosts: int, tag: str, pki: Path,
                   net: str = FABRIC_MANAGEMENT_NET) -> str:
    """The `[[switches]]` inventory of the cluster `rack up N --racks R` builds."""
    lines = [
        f"# The emulated cluster of `hysync rack up {hosts} --racks {racks}` (docs/testbed.md): "
        f"{racks} racks of {hosts} host",
        f"# namespaces {tag}-r1h1..{tag}-r{racks}h{hosts}, each rack's hosts on a veth to its "
        f"leaf's namespace {tag}-l1..{tag}-l{racks},",
        f"# the leaves on veths to the spine's namespace {tag}-sp; softswitches on raw data "
        "planes, P4Runtime over mutual TLS.",
        f'name = "{tag}-cluster"',
    ]
    tls = [f'cacert = "{pki}/rack-ca.pem"', f'cert = "{pki}/{SERVE_NAME}.pem"',
           f'private_key = "{pki}/{SERVE_NAME}.key"', 'target = "softswitch"',
           'p4info = "hysync:p4src/v1model/hysync.p4info.txtpb"']
    ipv4, mac = switch_data(0)
    lines += ["", "[[switches]]", 'name = "spine"', 'role = "spine"',
              f'grpc_addr = "{grpc_addr(0, net)}"', *tls, f'data_ipv4 = "{ipv4}"',
              f'data_mac = "{mac}"']
    for r in range(racks):
        ipv4, mac = switch_data(r + 1)
        lines += ["", "[[switches]]", f'name = "{leaf_name(r)}"', 'role = "leaf"',
                  f"uplink_port = {hosts + 1}              # the leaf's port toward the spine",
                  f"spine_port = {r + 1}                # the spine's port toward this leaf",
                  f'grpc_addr = "{grpc_addr(r + 1, net)}"', *tls, f'data_ipv4 = "{ipv4}"',
                  f'data_mac = "{mac}"']
    lines += ["", "[pool]", f"job_slots = {JOB_SLOTS}", "averaging_slots = 8"]
    for r in range(racks):
        for h in range(hosts):
            lines += ["", "[[hosts]]", f'name = "r{r + 1}h{h + 1}"', f'leaf = "{leaf_name(r)}"',
                      f'interface = "{tag}r{r + 1}h{h + 1}"', f'ipv4 = "{host_ip(r, h)}"',
                      f'mac = "{host_mac(r, h)}"', f"switch_port = {h + 1}"]
    return "\n".join(lines) + "\n"


def job_text(racks: int, hosts: int) -> str:
    """The job of every host of the cluster, sync at every level: rank k of the printed
    torchrun lines is its k-th member (by leaf, then worker id)."""
    lines = [f"# Job {JOB_ID} across the {racks} leaves and the spine of the emulated cluster: "
             "one member per host,",
             "# worker ids per leaf (`hysync --inventory INVENTORY job add` installs it).",
             f"job_id = {JOB_ID}", 'mode = "sync"', "", "[slots]", "base = 0",
             f"count = {JOB_SLOTS}"]
    for r in range(racks):
        for h in range(hosts):
            lines += ["", "[[members]]", f'leaf = "{leaf_name(r)}"', f"worker = {h}",
                      f'ipv4 = "{host_ip(r, h)}"', f'mac = "{host_mac(r, h)}"',
                      f"udp_port = {HOST_UDP_PORT}", f"switch_port = {h + 1}"]
    return "\n".join(lines) + "\n"


def next_steps(racks: int, hosts: int, tag: str, inventory: Path, job: Path, *,
               default_tag: str, master_port: int, steps: int = 300) -> list[str]:
    """The commands that install the job across the switches, train on every host (one
    rank each, torchrun over the front-end network), and take it all down."""
    bin_dir = Path(sys.executable).parent
    hysync = str(bin_dir / "hysync") if (bin_dir / "hysync").exists() else "hysync"
    torchrun = str(bin_dir / "torchrun") if (bin_dir / "torchrun").exists() else "torchrun"
    script = resources.path("examples/train_ddp.py")
    lines = [f"{hysync} --inventory {inventory} job add {job}"]
    for r in range(racks):
        for h in range(hosts):
            k = r * hosts + h
            lines.append(
                f"ip netns exec {tag}-r{r + 1}h{h + 1} env GLOO_SOCKET_IFNAME={tag}r{r + 1}f"
                f"{h + 1} OMP_NUM_THREADS=1 {torchrun} --nnodes {racks * hosts} "
                f"--nproc-per-node 1 --node-rank {k} --master-addr {front_end_ip(0)} "
                f"--master-port {master_port} {script} --inventory {inventory} --job {job} "
                f"--steps {steps} &")
    lines += ["wait    # every rank prints its held-out accuracy",
              f"{hysync} --inventory {inventory} job remove {JOB_ID}",
              f"{hysync} rack down" + ("" if tag == default_tag else f" --tag {tag}")]
    return lines


def job_path(args: argparse.Namespace, inventory: Path) -> Path:
    """--job, or beside the inventory its job file: cluster.toml -> cluster-job.toml."""
    return (Path(args.job).resolve() if args.job
            else inventory.with_name(f"{inventory.stem}-job.toml"))


def build(args: argparse.Namespace, out: Output, *, state: Path, pki: Path, logs: Path,
          start_time: Callable[[int], str | None], stop: Callable[[int], bool],
          default_tag: str, master_port: int) -> None:
    """`rack up N --racks R`: build the cluster, start its softswitches, write its
    inventory, job file and record (`state`); on any failure remove what was made."""
    tag, racks, hosts = args.tag, args.racks, args.hosts
    inventory = Path(args.inventory).resolve()
    job = job_path(args, inventory)
    names = switch_names(racks)
    net = management_net()
    addrs = [grpc_addr(i, net) for i in range(len(names))]
    try:
        certs = fabric_certificates(pki, {n: a.rpartition(":")[0]
                                          for n, a in zip(names, addrs, strict=True)})
    except BaseException:
        shutil.rmtree(pki, ignore_errors=True)
        raise
    fabric = NetnsFabric(racks, hosts, tag=tag, net=net)
    switches: list[subprocess.Popen] = []
    p4info = resources.path(resources.V1MODEL_P4INFO)
    serve_tls = ClientTls(certs["ca"], certs["serve_cert"], certs["serve_key"])
    log_files = [logs / f"{tag}-{name}-softswitch.log" for name in names]
    try:
        for name, ns, addr, log in zip(names, fabric.switch_namespaces, addrs, log_files,
                                       strict=True):
            tls = ["--server-cert-file", str(certs[f"{name}_cert"]), "--server-key-file",
                   str(certs[f"{name}_key"]), "--ca-cert-file", str(certs["ca"]),
                   "--writer", SERVE_NAME]
            with open(log, "w") as sink:  # `ip netns exec` execs: the pid is the softswitch's
                switches.append(subprocess.Popen(
                    [*fabric.exec_in(ns), sys.executable, "-m", "hysync.softswitch",
                     "--grpc-addr", addr, *fabric.softswitch_ports(ns), "--p4info",
                     str(p4info), *tls, "--log-level", "warning"],
                    stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True))  # outlives this command, and its Ctrl-C
        for proc, addr, log in zip(switches, addrs, log_files, strict=True):
            wait_for_server(addr, 30, lambda p=proc, lg=log: None if p.poll() is None else
                            f"the softswitch exited; see {lg}", tls=serve_tls)
        inventory.write_text(inventory_text(racks, hosts, tag, pki, net))
        job.write_text(job_text(racks, hosts))
        state.write_text(json.dumps({
            **fabric.created(),
            "softswitches": [{"pid": p.pid, "start": start_time(p.pid)} for p in switches],
            "inventory": str(inventory), "job": str(job), "logs": [str(lg) for lg in log_files],
            "pki": str(pki)}, indent=1) + "\n")
    except BaseException:
        for proc in switches:
            stop(proc.pid)
        for log in log_files:
            log.unlink(missing_ok=True)
        fabric.close()
        shutil.rmtree(pki, ignore_errors=True)
        raise
    steps = next_steps(racks, hosts, tag, inventory, job, default_tag=default_tag,
                       master_port=master_port)
    out.emit({"tag": tag, "racks": racks, "hosts_per_rack": hosts,
              "hosts": [ns for rack in fabric.host_ns for ns in rack],
              "switch_namespaces": dict(zip(names, fabric.switch_namespaces, strict=True)),
              "grpc_addrs": dict(zip(names, addrs, strict=True)),
              "inventory": str(inventory), "job": str(job), "commands": steps},
             f"cluster {tag!r} is up: {racks} racks of {hosts} hosts "
             f"({', '.join(ns for rack in fabric.host_ns for ns in rack)}); softswitches: "
             + ", ".join(f"{n} in {ns} (P4Runtime {a})" for n, ns, a in
                         zip(names, fabric.switch_namespaces, addrs, strict=True))
             + f"; logs in {logs}\ninventory: {inventory}\njob file: {job}\nnext, as root:\n"
             + "\n".join(f"  {line}" for line in steps))
