"""`hysync deploy`, `--dry-run`, `--check` and `teardown` against a real softswitch
(P4Runtime over gRPC): what each writes, reads back and refuses."""

from __future__ import annotations

import io
import socket
from pathlib import Path

import pytest

from hysync import p4names
from hysync.controlplane.cli.main import main
from hysync.controlplane.controller import Controller
from hysync.controlplane.job import JobConfig
from hysync.controlplane.p4rt.entities import modify
from hysync.controlplane.p4rt.switch import Switch
from hysync.controlplane.tables import forwarding

from ..controlplane.conftest import make_job, read_table
from .conftest import P4INFO, Softswitch, loopback_inventory, write_inventory


def hysync(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def _forwarding(grpc_addr: str) -> tuple[dict[str, int], set[int] | None]:
    with Switch(grpc_addr, arbitrate=False) as sw:
        if not sw.has_pipeline:
            return {}, None
        l2 = dict(map(forwarding.l2_of, read_table(sw, p4names.FORWARDING_L2)))
        flood = [g.ports() for g in sw.read_groups() if g.group_id == forwarding.FLOOD_GROUP]
        return l2, flood[0] if flood else None


def test_dry_run_prints_every_write_and_makes_none(inventory_for, softswitch: Softswitch) -> None:
    inv = inventory_for(softswitch)
    code, out, err = hysync("deploy", "--dry-run", str(inv))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith(f"would push pipeline {P4INFO}")
    assert [ln for ln in lines if ln.startswith("would write INSERT")] == [
        "would write INSERT HySyncIngress.forwarding.l2[dst_addr=02:00:00:00:01:01] -> "
        "HySyncIngress.forwarding.set_egress_port(port=1)",
        "would write INSERT HySyncIngress.forwarding.l2[dst_addr=02:00:00:00:01:02] -> "
        "HySyncIngress.forwarding.set_egress_port(port=2)",
        "would write INSERT multicast group 1024 [port 1 rid 0, port 2 rid 0]"]
    assert _forwarding(softswitch.grpc_addr) == ({}, None)  # not even the pipeline


def test_deploy_writes_the_hosts_forwarding_once(inventory_for, softswitch: Softswitch) -> None:
    inv = inventory_for(softswitch)
    code, out, _ = hysync("deploy", str(inv))
    assert code == 0 and "3 writes" in out
    assert _forwarding(softswitch.grpc_addr) == (
        {"02:00:00:00:01:01": 1, "02:00:00:00:01:02": 2}, {1, 2})
    code, out, _ = hysync("deploy", str(inv))
    assert code == 0 and out.startswith("nothing to do:")
    code, out, _ = hysync("deploy", "--dry-run", str(inv))
    assert code == 0 and out.startswith("nothing to do:")


def test_deploy_repairs_a_host_moved_to_another_port(inventory_for,
                                                     softswitch: Softswitch) -> None:
    inv = inventory_for(softswitch)
    assert hysync("deploy", str(inv))[0] == 0
    with Switch(softswitch.grpc_addr, election_id=(0, 10)) as sw:
        sw.write([modify(forwarding.l2_entry("02:00:00:00:01:02", 7))])
    code, out, _ = hysync("deploy", "--check", str(inv))
    assert code == 1 and "FAIL  port map h2: l2 sends 02:00:00:00:01:02 to port 7" in out
    code, out, _ = hysync("deploy", str(inv))
    assert code == 0 and "write MODIFY HySyncIngress.forwarding.l2" in out
    assert _forwarding(softswitch.grpc_addr)[0]["02:00:00:00:01:02"] == 2


def test_check_reports_one_line_per_check(inventory_for, softswitch: Softswitch) -> None:
    inv = inventory_for(softswitch)
    code, out, err = hysync("deploy", "--check", str(inv))
    assert code == 1 and "1 check(s) failed: pipeline" in err
    assert out.splitlines() == [
        f"ok    reachable: P4Runtime at {softswitch.grpc_addr}, device 1",
        "ok    arbitration: election id 10 becomes primary (no controller holds the switch now)",
        out.splitlines()[2]]
    assert out.splitlines()[2].startswith("FAIL  pipeline: the switch has no pipeline")
    hysync("deploy", str(inv))
    code, out, err = hysync("deploy", "--check", str(inv))
    assert (code, err) == (0, "")
    assert [ln.split(":")[0] for ln in out.splitlines()] == [
        "ok    reachable", "ok    arbitration", "ok    pipeline", "skip  probe",
        "ok    port map h1", "ok    port map h2"]
    # loopback hosts have no data plane: the probe line says how to send one from a host
    probe = out.splitlines()[3]
    assert probe.startswith("skip  probe: not sent: this machine has no host's data interface")
    assert f"run `hysync deploy --check --from HOST {inv}` on a host of the inventory" in probe


def test_check_from_a_host_this_machine_is_not_is_one_line(inventory_for,
                                                           softswitch: Softswitch) -> None:
    inv = inventory_for(softswitch)
    hysync("deploy", str(inv))
    code, out, err = hysync("deploy", "--check", "--from", "h1", str(inv))
    assert (code, out) == (1, "")
    assert err == ("hysync: error: --from h1: its address 127.0.0.1 is a loopback address, which "
                   "never reaches the switch; run the check on h1 itself\n")
    code, out, err = hysync("deploy", "--check", "--from", "h9", str(inv))
    assert (code, out) == (2, "") and err.count("\n") == 1 and "h9" in err
    code, out, err = hysync("deploy", "--from", "h1", str(inv))
    assert (code, out) == (2, "") and "--from HOST goes with --check" in err


def test_an_unreachable_switch_fails_fast_with_one_line(tmp_path: Path) -> None:
    # A port held bound but not listening for the whole test: connections to it are
    # refused, and no other process can start listening there meanwhile.
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    dead = f"127.0.0.1:{held.getsockname()[1]}"
    inv = write_inventory(tmp_path / "rack.toml", loopback_inventory(dead))
    code, out, err = hysync("--timeout", "1", "deploy", "--check", str(inv))
    assert code == 1 and out.startswith(f"FAIL  reachable: cannot reach the switch at {dead}")
    assert len(out.splitlines()) == 1
    code, out, err = hysync("--timeout", "1", "deploy", str(inv))
    assert code == 1 and out == "" and err.count("\n") == 1
    assert f"cannot reach the switch at {dead}" in err
    held.close()


@pytest.fixture
def other_pipeline(tmp_path: Path, softswitch: Softswitch) -> Path:
    """The switch runs a P4Info that is not the inventory's (another program name)."""
    other = tmp_path / "other.p4info.txtpb"
    other.write_text(P4INFO.read_text().replace('arch: "v1model"',
                                                'name: "other.p4"\n  arch: "v1model"'))
    with Switch(softswitch.grpc_addr, election_id=(0, 10)) as sw:
        sw.push_pipeline(other)
    return other


def test_a_wrong_pipeline_fails_the_check_and_is_not_replaced_silently(
        inventory_for, softswitch: Softswitch, other_pipeline: Path) -> None:
    inv = inventory_for(softswitch)
    code, out, _ = hysync("deploy", "--check", str(inv))
    assert code == 1
    assert "FAIL  pipeline: the switch runs cookie" in out and "another P4Info" in out
    code, out, err = hysync("deploy", str(inv))
    assert code == 1 and "--replace-pipeline" in err and "clear every entry" in err
    with Switch(softswitch.grpc_addr, arbitrate=False) as sw:
        assert sw.schema.p4info.pkg_info.name == "other.p4"
    code, out, _ = hysync("deploy", "--replace-pipeline", str(inv))
    assert code == 0 and out.startswith("push pipeline")
    assert hysync("deploy", "--check", str(inv))[0] == 0


def test_teardown_removes_what_deploy_and_the_jobs_wrote_and_nothing_else(
        inventory_for, softswitch: Softswitch) -> None:
    inv = inventory_for(softswitch)
    hysync("deploy", str(inv))
    ours = JobConfig.from_dict({  # on the inventory's hosts
        "job_id": 1, "slots": {"base": 0, "count": 32},
        "members": [{"worker": w, "ipv4": "127.0.0.1", "mac": f"02:00:00:00:01:0{w + 1}",
                     "udp_port": 47000 + w, "switch_port": w + 1} for w in range(2)]})
    theirs = make_job(9, workers=2, base=100, count=16, mac_base=0x500, switch_port=9)
    with Switch(softswitch.grpc_addr, election_id=(0, 10)) as sw:
        controller = Controller(sw).attach()
        controller.add_job(ours)
        controller.add_job(theirs)
    code, out, _ = hysync("teardown", "--dry-run", str(inv))
    assert code == 0 and "would remove job 1" in out and "job 9" not in out
    assert "would write DELETE HySyncIngress.forwarding.l2" in out
    code, out, _ = hysync("teardown", str(inv))
    assert code == 0 and "job 1 removed" in out
    with Switch(softswitch.grpc_addr, arbitrate=False) as sw:
        jobs = Controller(sw).list_jobs()
    assert [j.job_id for j in jobs] == [9]
    l2, flood = _forwarding(softswitch.grpc_addr)
    assert set(l2) == {m.mac for m in theirs.members} and flood == {9}
    code, out, _ = hysync("teardown", str(inv))
    assert code == 0 and out.startswith("removed 0 entries")
