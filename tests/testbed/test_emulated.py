"""The testbed path end to end on an emulated rack (root): network namespaces as hosts
with their own addresses and MACs, behind a switch namespace running the softswitch on
its raw data plane, or BMv2 where installed (bench.netns_hosts.NetnsStar builds the
namespaces). The same commands a rack
takes: an inventory, `hysync deploy` and `--check`, `hysync serve`, `torchrun` with
examples/train_ddp.py in every host namespace, a straggler the policy handles,
`hysync teardown`; afterwards the switch holds nothing of the job."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.controller import Controller
from controlplane.switch import Switch, wait_for_server
from hysync import p4names
from topologies.switches import SWITCH_IP, SWITCH_MAC
from topologies.topo import host_ip, host_mac

from ..controlplane.conftest import read_table
from .conftest import P4INFO, ROOT, kill_tree, loopback_inventory, write_inventory

pytestmark = [pytest.mark.slow, pytest.mark.root]
HOSTS = 3
STRAGGLER = 2  # rank / host index of the slow host
TARGET_ACCURACY = 0.9


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root: it builds network namespaces and veth links (run `.ci/run`)"
    for tool in ("ip", "ethtool"):
        if shutil.which(tool) is None:
            return f"needs `{tool}` (apt-get install iproute2 ethtool)"
    return None


@pytest.fixture(params=["softswitch-raw", "bmv2"])
def rack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[object, Path]]:
    """(the namespaces, the inventory) of a rack whose switch is the softswitch on its raw
    data plane, or BMv2 where it is installed."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    from bench.bmv2_bench import BMV2_JSON, _start_switch, bmv2_unavailable
    from bench.netns_hosts import NetnsStar

    kind = request.param
    if kind == "bmv2" and (why := bmv2_unavailable()):
        pytest.skip(why)
    star = NetnsStar(HOSTS)
    log = tmp_path / "switch.log"
    switch = _start_switch(star, kind, log)
    try:
        wait_for_server(star.grpc_addr, failed=lambda: None if switch.poll() is None else
                        f"the switch exited; see {log}")
        data = loopback_inventory(star.grpc_addr, listen=f"unix:/tmp/hysync-{os.getpid()}.sock")
        data["name"] = "emulated-rack"
        data["switch"].update(data_ipv4=SWITCH_IP, data_mac=SWITCH_MAC, data_udp_port=48620,
                              p4info=str(P4INFO))
        if kind == "bmv2":
            data["switch"].update(target="bmv2", device_config=str(BMV2_JSON))
        data["hosts"] = [{"name": f"h{w + 1}", "interface": star.host_ifs[w],
                          "ipv4": host_ip(w), "mac": host_mac(w), "switch_port": w + 1}
                         for w in range(HOSTS)]
        yield star, write_inventory(tmp_path / "rack.toml", data)
    finally:
        switch.terminate()
        switch.wait(timeout=10)
        star.close()


def hysync(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "controlplane.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_a_rack_from_inventory_to_trained_model_and_back(rack, tmp_path: Path) -> None:
    star, inventory = rack
    deployed = hysync("deploy", str(inventory))
    assert deployed.returncode == 0, deployed.stderr
    check = hysync("deploy", "--check", str(inventory))
    assert check.returncode == 0, check.stdout + check.stderr
    assert len(check.stdout.splitlines()) == 3 + HOSTS
    policy_log = tmp_path / "policy.jsonl"
    serve_out = (tmp_path / "serve.log").open("w")
    serve = subprocess.Popen(
        [sys.executable, "-m", "controlplane.cli", "serve", str(inventory), "--policy-interval",
         "0.25", "--policy-scale", "0.5", "--policy-log", str(policy_log)],
        cwd=ROOT, stdout=serve_out, stderr=subprocess.STDOUT)
    procs: list[subprocess.Popen] = []
    try:
        time.sleep(2)
        assert serve.poll() is None, (tmp_path / "serve.log").read_text()
        port = "29500"
        for w, host in enumerate(star.hosts):
            slow = ["--slowdown", "4"] if w == STRAGGLER else []
            env = dict(os.environ, GLOO_SOCKET_IFNAME=star.host_ifs[w], OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen(
                [*star.exec_in(host), sys.executable, "-m", "torch.distributed.run",
                 "--nnodes", str(HOSTS), "--nproc-per-node", "1", "--node-rank", str(w),
                 "--master-addr", host_ip(0), "--master-port", port,
                 str(ROOT / "examples" / "train_ddp.py"), "--inventory", str(inventory),
                 "--steps", "200", "--compute-ms", "30", "--average-every", "1", *slow],
                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outputs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            kill_tree(p)  # `ip netns exec` became torchrun; its worker is a child
        serve.terminate()
        serve.wait(timeout=10)
        serve_out.close()
    served = (tmp_path / "serve.log").read_text()
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out[-3000:] + served
    results = {r["rank"]: r for out in outputs for line in out.splitlines()
               if line.startswith('{"rank"') for r in [json.loads(line)]}
    assert sorted(results) == list(range(HOSTS))
    for r in results.values():
        assert r["accuracy"] >= TARGET_ACCURACY, results
    # partial rounds let the replicas drift; the final averaging round makes them one model
    assert len({r["accuracy"] for r in results.values()}) == 1, results
    assert "admitted job 1 'torchrun': 3 members" in served
    decisions = [json.loads(line) for line in policy_log.read_text().splitlines()]
    handled = [d for d in decisions if d.get("applied") and d["action"] != "start" and (
        d.get("worker") == STRAGGLER or f"worker {STRAGGLER} " in d.get("reason", ""))]
    assert handled, f"the policy never acted on the straggler: {decisions}"
    assert "job 1 removed: released by its training script" in served
    assert "job 2 removed: released by its training script" in served  # the averaging job

    torn = hysync("teardown", str(inventory))
    assert torn.returncode == 0, torn.stderr
    with Switch(star.grpc_addr, arbitrate=False) as sw:
        assert Controller(sw).list_jobs() == []
        assert read_table(sw, p4names.FORWARDING_L2) == []
        assert [g.group_id for g in sw.read_groups()] == []
