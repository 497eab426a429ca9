"""`hysync serve` against a real softswitch: one owner, jobs on leases with disjoint slots
from the pool, a second serve refused, a restart that reconciles, the CLI routed."""

from __future__ import annotations

import io
import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hysync import p4names
from hysync.controlplane.cli.main import main
from hysync.controlplane.controller import Controller
from hysync.controlplane.p4rt.switch import Switch
from hysync.controlplane.serve.client import ServeClient, ServeError
from hysync.controlplane.serve.server import Server
from hysync.controlplane.tables import forwarding
from hysync.controlplane.testbed.inventory import Inventory

from ..controlplane.conftest import read_table
from .conftest import Softswitch, loopback_inventory, published, write_inventory

Start = Callable[..., Server]


def hysync(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def deployed(inventory_for, softswitch: Softswitch) -> Inventory:
    path = inventory_for(softswitch, hosts=3)
    assert hysync("deploy", str(path))[0] == 0
    return Inventory.load(path)


@pytest.fixture
def start(deployed: Inventory) -> Iterator[Start]:
    servers: list[Server] = []

    def make(inventory: Inventory = deployed, **options: object) -> Server:
        options.setdefault("say", lambda _: None)
        server = published(Server(inventory, **options).start())  # type: ignore[arg-type]
        servers.append(server)
        return server
    yield make
    for server in servers:
        server.close()


def members(*hosts: int, avg: bool = False) -> list[dict[str, object]]:
    # Every host of the loopback inventory is 127.0.0.1: ports differ per host so that two
    # jobs never share a member address (the controller refuses that, docs/protocol.md §8).
    return [{"worker": w, "host": f"h{h}", "udp_port": 41000 + 100 * h + 2 * w,
             **({"avg_udp_port": 41001 + 100 * h + 2 * w} if avg else {})}
            for w, h in enumerate(hosts)]


def installed(inv: Inventory) -> dict[int, tuple[int, int]]:
    with Switch(inv.switch.grpc_addr, arbitrate=False) as sw:
        return {j.job_id: j.slots for j in Controller(sw).list_jobs()}


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_jobs_get_disjoint_slots_and_live_as_long_as_their_connection(
        deployed: Inventory, start: Start) -> None:
    server = start(policy=None)
    a, b = ServeClient(server.address), ServeClient(server.address)
    ra = a.request({"op": "admit", "members": members(1, 2, avg=True)})
    rb = b.request({"op": "admit", "members": members(2, 3)})
    assert ra["switch"] == {"ipv4": "127.0.0.1", "udp_port": deployed.switch.data_udp_port}
    assert [(j["job_id"], j["slot_base"], j["slot_count"]) for j in ra["jobs"]] == [
        (1, 0, 32), (2, 32, 8)]
    assert [(j["job_id"], j["slot_base"]) for j in rb["jobs"]] == [(3, 40)]
    assert installed(deployed) == {1: (0, 31), 2: (32, 39), 3: (40, 71)}
    a.close()  # the script ended or crashed: its jobs go, the other job stays
    wait_for(lambda: set(installed(deployed)) == {3})
    rc = a.__class__(server.address).request({"op": "admit", "members": members(1)})
    assert rc["jobs"][0]["slot_base"] == 72  # freed slots rest before they are reused
    assert rc["jobs"][0]["job_id"] == 4  # and so do ids: job 1 is not the next job too
    b.request({"op": "release"})
    with Switch(deployed.switch.grpc_addr, arbitrate=False) as sw:  # deploy's entries stay
        l2 = dict(map(forwarding.l2_of, read_table(sw, p4names.FORWARDING_L2)))
    assert l2 == {h.mac: h.switch_port for h in deployed.hosts}


def test_bad_admissions_are_refused_and_change_nothing(deployed: Inventory,
                                                       start: Start) -> None:
    server = start(policy=None)
    with ServeClient(server.address) as client:
        with pytest.raises(ServeError, match="no host 'h9'"):
            client.request({"op": "admit", "members": [{"worker": 0, "host": "h9",
                                                        "udp_port": 1}]})
        with pytest.raises(ServeError, match=r"members\[1\].worker = 0 is also"):
            client.request({"op": "admit", "members": [
                {"worker": 0, "host": "h1", "udp_port": 41000},
                {"worker": 0, "host": "h2", "udp_port": 41001}]})
        with pytest.raises(ServeError, match="unknown op 'fly'"):
            client.request({"op": "fly"})
        assert installed(deployed) == {}


def test_a_mode_set_that_names_a_level_is_refused_by_a_one_switch_serve(
        deployed: Inventory, start: Start) -> None:
    server = start(policy=None)
    with ServeClient(server.address) as client:
        (job,) = client.request({"op": "admit", "members": members(1, 2)})["jobs"]
        code, out, err = hysync("--serve", server.address, "mode", "set", str(job["job_id"]),
                                "--slots", "0-31", "partial", "--quorum", "1", "--level",
                                "spine")
        assert (code, out) == (1, "") and err.count("\n") == 1, err
        assert "level 'spine': this serve holds one switch" in err, err


def test_a_full_pool_refuses_a_job_with_a_way_out(tmp_path: Path, softswitch: Softswitch,
                                                   deployed: Inventory) -> None:
    data = loopback_inventory(softswitch.grpc_addr, softswitch.udp_addr[1],
                              f"unix:{tmp_path / 'serve.sock'}", hosts=3)
    data["pool"] = {"slot_base": 100, "slot_count": 64, "job_slots": 32, "averaging_slots": 8}
    server = Server(Inventory.load(write_inventory(tmp_path / "small.toml", data)),
                    policy=None, say=lambda _: None).start()
    try:
        with ServeClient(server.address) as client:
            bases = [client.request({"op": "admit", "members": members(h)})["jobs"][0]
                     ["slot_base"] for h in (1, 2)]
            assert bases == [100, 132]
            with pytest.raises(ServeError, match="no 32 free slots in the pool 100-163 .*"
                                                 "lower pool.job_slots"):
                client.request({"op": "admit", "members": members(3)})
    finally:
        server.close()


def test_a_second_serve_is_refused(deployed: Inventory, start: Start) -> None:
    start(policy=None)
    code, out, err = hysync("serve", str(deployed.path))
    assert code == 1 and out == "" and err.count("\n") == 1
    assert "a controller with election id 10 holds the switch" in err
    assert "one switch has one `hysync serve`" in err


def test_a_restarted_serve_adopts_the_jobs_and_removes_the_unclaimed(
        deployed: Inventory, start: Start) -> None:
    first = start(policy=None)
    a, b = ServeClient(first.address), ServeClient(first.address)
    admitted = a.request({"op": "admit", "members": members(1, 2)})
    job_a = admitted["jobs"][0]["job_id"]
    b.request({"op": "admit", "members": members(3)})
    first.close()
    assert set(installed(deployed)) == {1, 2}  # stopping serve is not the scripts ending
    second = start(policy=None, claim_grace=1.5)
    with ServeClient(second.address) as client:
        owners = {j["job_id"]: j["owner"] for j in second.handle(0, {"op": "status"})["jobs"]}
        assert owners == {1: "unclaimed", 2: "unclaimed"}
        client.request({"op": "claim", "jobs": [job_a], "key": admitted["key"]})
        wait_for(lambda: set(installed(deployed)) == {job_a})
        reply = client.request({"op": "admit", "members": members(2)})
        assert reply["jobs"][0]["slot_base"] >= 64  # after every slot the first serve gave
        with pytest.raises(ServeError, match="job 1 is not waiting for a claim"):
            ServeClient(second.address).request({"op": "claim", "jobs": [1]})


def test_job_ids_go_on_after_the_last_given_and_wrap(deployed: Inventory,
                                                     start: Start) -> None:
    server = start(policy=None)
    server._id_cursor = 254  # as after 253 jobs
    with ServeClient(server.address) as client:
        ids = [j["job_id"] for j in client.request(
            {"op": "admit", "members": members(1, avg=True)})["jobs"]]
        assert ids == [254, 255]
        client.request({"op": "release"})
        assert client.request({"op": "admit", "members": members(2)})["jobs"][0]["job_id"] == 1


def test_a_unix_socket_is_gone_when_serve_stops(tmp_path: Path, softswitch: Softswitch,
                                                deployed: Inventory) -> None:
    where = tmp_path / "serve.sock"
    data = loopback_inventory(softswitch.grpc_addr, softswitch.udp_addr[1], f"unix:{where}",
                              hosts=3)
    inv = Inventory.load(write_inventory(tmp_path / "unix.toml", data))
    server = Server(inv, policy=None, say=lambda _: None).start()
    assert where.is_socket()
    server.close()
    assert not where.exists()  # a user's `ls` shows no stale socket; a restart needs none


def test_the_cli_writes_through_serve_and_a_mode_set_holds_the_policy(
        deployed: Inventory, start: Start, tmp_path: Path) -> None:
    log = tmp_path / "policy.jsonl"
    # policy_scale: a dwell of 0.2 s, so that a policy that was not held would decide
    # again within the wait below
    server = start(policy="adaptive", policy_interval=0.1, policy_log=log, policy_scale=0.1)
    client = ServeClient(server.address)
    client.request({"op": "admit", "members": members(1, 2, 3)})
    grpc = ["--grpc-addr", deployed.switch.grpc_addr]
    code, _, err = hysync(*grpc, "mode", "set", "1", "--slots", "0-31", "async")
    assert code == 1 and "not the primary controller" in err  # serve owns the switch
    code, out, err = hysync("--serve", server.address, "mode", "set", "1", "--slots", "0-31",
                            "partial", "--quorum", "2")
    assert (code, err) == (0, "")
    assert out == (f"job 1 slots 0-31: partial(2) (modify) via {server.address}; an override: "
                   f"the job's policy holds until `hysync --serve {server.address} policy "
                   "resume 1`\n")
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert {"action": "override", "mode": "partial", "quorum": 2,
            "held": True}.items() <= records[-1].items()
    time.sleep(1.5)  # many policy intervals, past the dwell: the operator's mode stays
    code, out, _ = hysync(*grpc, "mode", "show", "1")
    assert "slots 0-31: partial(2)" in out
    assert json.loads(log.read_text().splitlines()[-1])["action"] == "override"
    [job] = server.handle(0, {"op": "status"})["jobs"]
    assert (job["policy"], job["held"]) == (True, True)
    # policy run is serve's work while serve holds the switch: one line says what to run
    code, out, err = hysync("--serve", server.address, "policy", "run", "1")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"hysync --serve {server.address} policy resume JOB" in err
    code, out, err = hysync(*grpc, "policy", "run", "1")
    assert code == 1 and err.count("\n") == 1 and "policy resume JOB" in err
    code, out, err = hysync("--serve", server.address, "policy", "run", "1", "--dry-run",
                            "--interval", "0.1", "--duration", "0.3")  # only reads: it runs
    assert (code, err) == (0, "") and "policy adaptive on job 1 (dry run)" in out
    code, out, err = hysync("policy", "resume", "1")
    assert code == 2 and "give --serve ADDR" in err
    code, out, err = hysync("--serve", server.address, "policy", "resume", "1")
    assert (code, err) == (0, "")
    assert out == f"job 1: handed back to its policy (via {server.address})\n"
    actions = [json.loads(line)["action"] for line in log.read_text().splitlines()]
    assert "resume" in actions[actions.index("override"):]
    assert not server.handle(0, {"op": "status"})["jobs"][0]["held"]
    code, out, err = hysync("--serve", server.address, "policy", "resume", "1")
    assert code == 1 and "not held" in err
    code, out, _ = hysync("--serve", server.address, "member", "exclude", "1", "2")
    # a member is named by its host (the admit gave no ranks: none are shown)
    assert code == 0 and "worker 2 (host h3) excluded; 2 active members" in out
    code, out, err = hysync("--serve", server.address, "job", "remove", "9")
    assert code == 1 and "no job 9" in err
    client.close()


def test_a_held_lease_reclaims_its_jobs_from_a_restarted_serve(deployed: Inventory,
                                                                start: Start) -> None:
    first = start(policy=None)
    client = ServeClient(first.address, timeout=10)
    reply = client.request({"op": "admit", "members": members(1, 2, avg=True)})
    ids = [j["job_id"] for j in reply["jobs"]]
    client.hold(ids, reply["key"])
    first.close()
    # where the held lease reconnects: the first serve's address, which the file names now
    second = start(Inventory.load(deployed.path), policy=None, claim_grace=2.0)

    def owners() -> set[str]:
        return {j["owner"] for j in second.handle(0, {"op": "status"})["jobs"]}
    wait_for(lambda: owners() == {"connection 1"})
    assert client.request({"op": "status"})["ok"]  # the same client object, reconnected
    time.sleep(2.5)  # past the grace period: claimed jobs stay
    assert set(installed(deployed)) == set(ids)
    client.close()  # the script ends: the restarted serve removes its jobs
    wait_for(lambda: installed(deployed) == {})


def test_an_operators_job_file_goes_through_serve_and_stays_until_removed(
        deployed: Inventory, start: Start, tmp_path: Path) -> None:
    server = start(policy=None)
    job = tmp_path / "job.toml"
    job.write_text('job_id = 7\n[slots]\nbase = 4000\ncount = 16\n[[members]]\nworker = 0\n'
                   'ipv4 = "127.0.0.1"\nmac = "02:00:00:00:01:01"\nudp_port = 45000\n'
                   'switch_port = 1\n')
    code, out, err = hysync("--serve", server.address, "job", "add", str(job))
    assert (code, err) == (0, "") and out.startswith("job 7 installed")
    assert installed(deployed) == {7: (4000, 4015)}
    owners = {j["job_id"]: j["owner"] for j in server.handle(0, {"op": "status"})["jobs"]}
    assert owners == {7: "operator"}
    code, out, _ = hysync("--serve", server.address, "job", "remove", "7")
    assert code == 0 and installed(deployed) == {}


def test_a_taken_listen_address_is_refused_and_lets_the_switch_go(
        tmp_path: Path, softswitch: Softswitch, deployed: Inventory) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        data = loopback_inventory(softswitch.grpc_addr, softswitch.udp_addr[1],
                                  f"127.0.0.1:{taken.getsockname()[1]}", hosts=3)
        busy = Inventory.load(write_inventory(tmp_path / "busy.toml", data))
        with pytest.raises(ServeError, match="cannot listen on 127.0.0.1:.*pick another "
                                             "serve.listen"):
            Server(busy, policy=None, say=lambda _: None).start()
    Server(deployed, policy=None, say=lambda _: None).start().close()  # the switch is free
