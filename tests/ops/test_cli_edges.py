"""The rough edges a newcomer hit, each against a real softswitch (and serve): the
advice while serve owns the switch, `--serve ... mode set --wait`, `--grpc-addr` beside
an inventory, `deploy --check` off the data plane, help texts, the arbitration floor."""

from __future__ import annotations

import json

from p4runtime_sh import shell

from hysync.controlplane.p4rt.switch import Switch
from hysync.controlplane.serve.client import ServeClient
from hysync.controlplane.testbed.inventory import Inventory
from tests.controlplane.conftest import P4INFO, Softswitch

from .conftest import hysync


def test_a_write_while_serve_owns_the_switch_advises_serve(deployed: Inventory, serve,
                                                           workers) -> None:  # type: ignore[no-untyped-def]
    server = serve(policy=None)
    with ServeClient(server.address) as client:
        job = client.request({"op": "admit", "members": workers(2).members()})["jobs"][0]
        code, out, err = hysync("--grpc-addr", deployed.switch.grpc_addr, "mode", "set",
                                str(job["job_id"]), "--slots", "0-31", "async")
        assert (code, out) == (1, "")
        assert "election id 10 is primary" in err and "hysync --serve ADDR" in err
        assert "would take the switch from it" in err


def test_serve_mode_set_waits_for_the_latch(deployed: Inventory, serve, workers,
                                            softswitch: Softswitch) -> None:  # type: ignore[no-untyped-def]
    server = serve(policy=None)
    team = workers(2)
    with ServeClient(server.address) as client:
        job = client.request({"op": "admit", "members": team.members()})["jobs"][0]
        job_id, base = job["job_id"], job["slot_base"]
        slots = f"{base}-{base + job['slot_count'] - 1}"
        # no traffic yet: written, the latch not seen, exit 3
        code, out, err = hysync("--serve", server.address, "mode", "set", str(job_id),
                                "--slots", slots, "partial", "--quorum", "1", "--wait", "0.3")
        assert code == 3 and "written, not latched within 0.3 s" in out, (out, err)
        team.start(job_id, range(base, base + job["slot_count"]), softswitch.udp_addr)
        code, out, err = hysync("--serve", server.address, "--json", "mode", "set",
                                str(job_id), "--slots", slots, "sync", "--wait", "60")
        assert (code, err) == (0, "")
        report = json.loads(out)
        assert report["latched"] is True and report["latched_after"] > 0


def test_a_grpc_addr_other_than_the_inventorys_is_refused(deployed: Inventory) -> None:
    code, out, err = hysync("--grpc-addr", "127.0.0.1:1", "deploy", "--check",
                            str(deployed.path))
    assert (code, out) == (2, "")
    assert f"--grpc-addr 127.0.0.1:1 is not the switch of {deployed.path}" in err
    assert deployed.switch.grpc_addr in err
    code, out, _ = hysync("--grpc-addr", deployed.switch.grpc_addr, "deploy", "--check",
                          str(deployed.path))
    assert code == 0 and "ok    reachable" in out


def test_a_check_off_the_data_plane_skips_the_probe_rather_than_passing_it(
        deployed: Inventory) -> None:
    code, out, _ = hysync("--json", "deploy", "--check", str(deployed.path))
    assert code == 0
    probe = next(c for c in json.loads(out)["checks"] if c["name"] == "probe")
    assert probe["ok"] is None and probe["skipped"] is True
    code, out, _ = hysync("deploy", "--check", str(deployed.path))
    assert "skip  probe: not sent" in out and "ok    probe" not in out


def test_positional_arguments_have_help(capsys) -> None:  # type: ignore[no-untyped-def]
    assert hysync("member", "exclude", "--help")[0] == 0  # argparse prints on sys.stdout
    out = " ".join(capsys.readouterr().out.split())
    assert "JOB the job id (1..255)" in out
    assert "WORKER the member's worker id in the job (0..31)" in out
    assert hysync("stats", "--help")[0] == 0
    assert "JOB the job id (1..255)" in " ".join(capsys.readouterr().out.split())


def test_an_inspection_at_p4runtime_shells_default_id_gets_a_clear_error(
        softswitch: Softswitch) -> None:
    with Switch(softswitch.grpc_addr, election_id=(0, 10)) as sw:
        sw.push_pipeline(P4INFO)
    shell.setup(device_id=1, grpc_addr=softswitch.grpc_addr, election_id=(1, 0),
                verbose=False)  # p4runtime-shell's default: (high=1, low=0)
    shell.teardown()
    code, out, err = hysync("--grpc-addr", softswitch.grpc_addr, "--election-id", "100",
                            "job", "remove", "1")
    assert (code, out) == (1, "")
    assert "no controller is primary now, but the switch has seen election id 1,0" in err
    assert "(high=1, low=0)" in err and "p4runtime-shell's default" in err
    assert "--election-id 1,1" in err and 'switch.election_id = "1,1"' in err
    assert "restart the switch" in err
    # the fix it names works
    code, _, err = hysync("--grpc-addr", softswitch.grpc_addr, "--election-id", "1,1",
                          "pipeline", "push", "--p4info", str(P4INFO))
    assert code == 0, err
