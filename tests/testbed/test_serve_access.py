"""Who may do what through `hysync serve`: a job is its admitting connection's (and its key
holders') or the operator's; a serve on TCP with a token serves nobody who lacks it; a
serve off loopback without a credential does not start; the CLI presents the token."""

from __future__ import annotations

import copy
import io
import json
import socket
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hysync.controlplane.cli.main import main
from hysync.controlplane.controller import Controller
from hysync.controlplane.p4rt.switch import Switch
from hysync.controlplane.serve.auth import (
    FREE_FAILURES,
    MAX_JOBS_PER_CLIENT,
    MAX_WAITING_PER_ADDRESS,
    Gate,
    client_context,
    inventory_client_context,
)
from hysync.controlplane.serve.client import ServeClient, ServeError
from hysync.controlplane.serve.server import Server
from hysync.controlplane.testbed.inventory import Inventory
from hysync.controlplane.testbed.serve_access import ServeAccess

from ..certs import make_certs
from .conftest import ANY_PORT, Softswitch, loopback_inventory, published, write_inventory

TOKEN = "3f1c9a7e5b2d4068a1c3e5f7092b4d6f"
OPERATOR_TOKEN = "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b"
Start = Callable[..., Server]


def hysync(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return main(list(args), stdout=out, stderr=err), out.getvalue(), err.getvalue()


def secret(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text + "\n")
    path.chmod(mode)
    return path


@pytest.fixture
def start(tmp_path: Path, softswitch: Softswitch) -> Iterator[Start]:
    """start(listen=..., **[serve] fields) -> a running serve of a deployed 3-host rack."""
    base = loopback_inventory(softswitch.grpc_addr, softswitch.udp_addr[1], hosts=3)
    deployed = False
    servers: list[Server] = []

    def make(listen: str | None = None, *, connections: int = 64,
             jobs: int = MAX_JOBS_PER_CLIENT, **serve: Any) -> Server:
        nonlocal deployed
        data = copy.deepcopy(base)
        data["serve"] = {"listen": listen or ANY_PORT, **serve}
        inv = write_inventory(tmp_path / f"rack-{len(servers)}.toml", data)
        if not deployed:
            assert hysync("deploy", str(inv))[0] == 0
            deployed = True
        server = published(Server(Inventory.load(inv), policy=None, say=lambda _: None,
                                  max_connections_per_client=connections,
                                  max_jobs_per_client=jobs).start())
        servers.append(server)
        return server
    yield make
    for server in servers:
        server.close()


def members(*hosts: int) -> list[dict[str, object]]:
    return [{"worker": w, "host": f"h{h}", "udp_port": 42000 + 100 * h + w}
            for w, h in enumerate(hosts)]


def installed(server: Server) -> set[int]:
    with Switch(server.inv.switch.grpc_addr, arbitrate=False) as sw:
        return {j.job_id for j in Controller(sw).list_jobs()}


def test_a_second_client_cannot_touch_a_job_it_does_not_own(start: Start) -> None:
    server = start()
    owner, other = ServeClient(server.address), ServeClient(server.address)
    reply = owner.request({"op": "admit", "members": members(1, 2, 3)})
    job, key = reply["jobs"][0]["job_id"], reply["key"]
    refused = {
        "remove": {"op": "job_remove", "job": job},
        "set the mode of": {"op": "mode_set", "job": job, "mode": "async"},
        "exclude a member of": {"op": "exclude", "job": job, "worker": 1},
        "readmit a member of": {"op": "readmit", "job": job, "worker": 1},
        "leave": {"op": "leave", "job": job, "worker": 1},
    }
    for what, request in refused.items():
        with pytest.raises(ServeError, match=f"job {job} is connection 1's, not this "
                                             f"connection's: only its owner or the operator "
                                             f"may {what} it"):
            other.request(request)
    with pytest.raises(ServeError, match="a training script asks for a job with admit"):
        other.request({"op": "job_add", "job": {"job_id": 9}})
    assert installed(server) == {job}
    assert other.request({"op": "status"})["jobs"] == []  # a client sees its own jobs only
    with ServeClient(server.address, operator=True) as operator:
        assert [j["owner"] for j in operator.request({"op": "status"})["jobs"]] == \
            ["connection 1"]

    # The owner may; another rank of its script may with the admit's key, and leave only
    # for a worker of the job.
    assert owner.request({"op": "exclude", "job": job, "worker": 2})["members"] == 2
    assert other.request({"op": "readmit", "job": job, "worker": 2, "key": key})["members"] == 3
    with pytest.raises(ServeError, match=f"worker 7 is not a member of job {job}"):
        other.request({"op": "leave", "job": job, "worker": 7, "key": key})
    with pytest.raises(ServeError, match="not this connection's"):
        other.request({"op": "leave", "job": job, "worker": 1, "key": "0" * 32})
    assert other.request({"op": "leave", "job": job, "worker": 1, "key": key})["worker"] == 1

    # The operator (the CLI) may act on every job.
    code, out, err = hysync("--serve", server.address, "mode", "set", str(job), "--slots",
                            "0-31", "async")
    assert (code, err) == (0, "") and "async" in out
    code, out, err = hysync("--serve", server.address, "job", "remove", str(job))
    assert (code, err) == (0, "")
    assert installed(server) == set()
    owner.close()
    other.close()


def test_tcp_with_a_token_serves_only_who_presents_it(start: Start, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HYSYNC_SERVE_TOKEN_FILE", raising=False)
    tokens = secret(tmp_path / "serve.token", TOKEN)
    operator = secret(tmp_path / "operator.token", OPERATOR_TOKEN)
    server = start(token_file=str(tokens), operator_token_file=str(operator))
    bare = ServeClient(server.address)
    for request in ({"op": "status"}, {"op": "admit", "members": members(1)}):
        with pytest.raises(ServeError, match="authenticate first"):
            bare.request(request)
    with pytest.raises(ServeError, match="refused this connection: wrong token"):
        ServeClient(server.address, token="0" * 32)
    assert installed(server) == set()

    script = ServeClient(server.address, token=TOKEN)
    job = script.request({"op": "admit", "members": members(1, 2)})["jobs"][0]["job_id"]
    with pytest.raises(ServeError, match="may not act as the operator: present "
                                         "serve.operator_token_file's token"):
        ServeClient(server.address, token=TOKEN, operator=True)

    # The CLI: without the token refused, with the operator's token carried out.
    code, _, err = hysync("--serve", server.address, "job", "remove", str(job))
    assert code == 1 and "authenticate first" in err and err.count("\n") == 1
    code, _, err = hysync("--serve", server.address, "--token-file", str(tokens), "job",
                          "remove", str(job))
    assert code == 1 and "may not act as the operator" in err
    code, _, err = hysync("--serve", server.address, "--token-file", str(operator), "job",
                          "remove", str(job))
    assert (code, err) == (0, "")
    assert installed(server) == set()
    script.close()
    bare.close()


def test_a_token_file_others_can_read_is_refused(start: Start, tmp_path: Path) -> None:
    loose = secret(tmp_path / "loose.token", TOKEN, 0o644)
    with pytest.raises(ServeError, match=f"has mode 0644: others may read it; chmod 600 "
                                         f"{loose}"):
        start(token_file=str(loose))
    short = secret(tmp_path / "short.token", "abc")
    with pytest.raises(ServeError, match="holds 3 characters: a token has at least 16"):
        start(token_file=str(short))
    code, _, err = hysync("--serve", "127.0.0.1:1", "--token-file", str(loose), "job",
                          "remove", "1")
    assert code == 1 and "chmod 600" in err


def test_off_loopback_without_a_credential_serve_does_not_start(
        tmp_path: Path, softswitch: Softswitch) -> None:
    data = loopback_inventory(softswitch.grpc_addr, softswitch.udp_addr[1], hosts=3,
                              listen="0.0.0.0:0")
    path = write_inventory(tmp_path / "open.toml", data)
    code, out, err = hysync("serve", str(path))
    assert code == 1 and out == "" and err.count("\n") == 1
    assert "is reachable from other machines and [serve] names no credential: add " \
           "token_file" in err


def test_a_unix_socket_is_its_users_and_roots(start: Start, tmp_path: Path) -> None:
    path = tmp_path / "serve.sock"
    server = start(f"unix:{path}")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with ServeClient(server.address, operator=True) as client:  # the same user: operator
        assert client.request({"op": "status"})["jobs"] == []
    server.close()  # one serve per switch
    group = tmp_path / "group.sock"
    start(f"unix:{group}", socket_mode="0660")
    assert stat.S_IMODE(group.stat().st_mode) == 0o660


def test_connections_per_client_are_bounded(start: Start) -> None:
    server = start(connections=2)
    kept = [ServeClient(server.address) for _ in range(2)]
    host, port = server.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as third:
        reply = json.loads(third.makefile().readline())
        assert reply == {"ok": False, "error": "127.0.0.1 has 2 connections open, the most "
                         "one client may: close one (each training script's rank holds one)"}
    kept[0].close()
    deadline = time.monotonic() + 10
    while server.clients.get(("tcp", "127.0.0.1"), 0) > 1:  # serve saw the close
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with ServeClient(server.address) as again:  # a closed one frees its place
        assert again.request({"op": "status"})["ok"]
    kept[1].close()


def test_mutual_tls_serves_only_certificates_its_ca_signed(start: Start, tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    server = start(cacert=str(certs.ca), cert=str(certs.server_cert),
                   private_key=str(certs.server_key), client_cert=str(certs.client_cert),
                   client_key=str(certs.client_key), operators=["ops"])
    tls = inventory_client_context(server.inv.access)
    script = ServeClient(server.address, tls=tls)
    job = script.request({"op": "admit", "members": members(1, 2)})["jobs"][0]["job_id"]
    assert script.request({"op": "status"})["jobs"][0]["owner"] == "connection 1"
    with pytest.raises(ServeError, match=r"127.0.0.1 \(controller\) may not act as the "
                                         "operator: present a certificate whose common name "
                                         "serve.operators lists"):
        ServeClient(server.address, tls=tls, operator=True)
    for who in (client_context(certs.ca), client_context(certs.ca, certs.stranger_cert,
                                                         certs.stranger_key)):
        with pytest.raises(ServeError):  # no certificate, or one another CA signed
            ServeClient(server.address, tls=who).request({"op": "status"})
    with pytest.raises(ServeError, match="closed the connection"):  # TLS expected
        ServeClient(server.address).request({"op": "status"})
    # The CLI over TLS: the certificate is not an operator's, so it is refused.
    files = f"{certs.ca},{certs.client_cert},{certs.client_key}"
    code, _, err = hysync("--serve", server.address, "--serve-tls", files, "job", "remove",
                          str(job))
    assert code == 1 and "may not act as the operator" in err
    assert installed(server) == {job}
    script.close()


def test_mutual_tls_is_a_credential_off_loopback(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    listen = ("tcp", ("10.1.0.10", 9600))
    Gate(ServeAccess(cacert=certs.ca, cert=certs.server_cert, private_key=certs.server_key),
         *listen, tmp_path)  # accepted: no error
    with pytest.raises(ServeError, match="names no credential"):
        Gate(ServeAccess(), *listen, tmp_path)


def test_attach_presents_the_inventorys_token(start: Start, tmp_path: Path) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from hysync.torch import attach

    token = secret(tmp_path / "serve.token", TOKEN)
    server = start(token_file=str(token))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = DistributedDataParallel(torch.nn.Linear(4, 4))
        # the file names the address serve bound
        job = attach(model, inventory=Inventory.load(server.inv.path), host="h1", timeout=10)
        assert installed(server) == {job.job_id}
        job.close()  # rank 0 releases the job
        assert installed(server) == set()
        bare = Inventory.load(write_inventory(tmp_path / "bare.toml", {
            **loopback_inventory(server.inv.switch.grpc_addr, hosts=3),
            "serve": {"listen": server.address}}))
        with pytest.raises(ServeError, match="authenticate first"):
            attach(DistributedDataParallel(torch.nn.Linear(4, 4)), inventory=bare, host="h1",
                   timeout=10)
    finally:
        dist.destroy_process_group()


def test_a_held_lease_reclaims_its_jobs_over_tls(start: Start, tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    fields = {"cacert": str(certs.ca), "cert": str(certs.server_cert),
              "private_key": str(certs.server_key), "client_cert": str(certs.client_cert),
              "client_key": str(certs.client_key)}
    first = start(**fields)
    client = ServeClient(first.address, timeout=10,
                         tls=inventory_client_context(first.inv.access))
    reply = client.request({"op": "admit", "members": members(1, 2)})
    client.hold([j["job_id"] for j in reply["jobs"]], reply["key"])
    first.close()
    second = start(first.address, **fields)  # the same address: the watcher reconnects
    deadline = time.monotonic() + 10
    while {j["owner"] for j in second.handle(0, {"op": "status"})["jobs"]} != {"connection 1"}:
        assert time.monotonic() < deadline, "the lease was not reclaimed"
        time.sleep(0.1)
    assert client.request({"op": "status"})["ok"]
    client.close()


def test_a_connection_that_never_authenticates_is_closed(start: Start, tmp_path: Path) -> None:
    server = start(token_file=str(secret(tmp_path / "serve.token", TOKEN)))
    server.gate.hello_seconds = 0.5
    host, port = server.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as idle:
        reader = idle.makefile()
        reply = json.loads(reader.readline())
        assert not reply["ok"] and reply["error"].startswith("no hello within 0.5 s: "
                                                             "authenticate first")
        assert reader.readline() == ""  # then closed
    with ServeClient(server.address, token=TOKEN) as client:  # one that did may idle
        time.sleep(1.0)
        assert client.request({"op": "status"})["ok"]


# ---------------------------------------------------------------- attacks on serve


def test_after_serve_restarts_only_the_key_holder_claims_a_job(start: Start,
                                                               tmp_path: Path) -> None:
    """The takeover: B holds the scripts' token but not A's job key, and races A to the
    claim after serve's restart. B is refused every claim, swap and release; A keeps it."""
    tokens = secret(tmp_path / "serve.token", TOKEN)
    first = start(token_file=str(tokens))
    a = ServeClient(first.address, token=TOKEN, timeout=20)
    reply = a.request({"op": "admit", "members": members(1, 2)})
    job = reply["jobs"][0]["job_id"]
    first.close()
    second = start(first.address, token_file=str(tokens))  # A has not reconnected yet
    with ServeClient(second.address, token=TOKEN) as b:
        for key in (None, "0" * 32):
            with pytest.raises(ServeError, match=f"job {job} is claimed with the key its "
                                                 "admit gave"):
                b.request({"op": "claim", "jobs": [job], "key": key})
        with pytest.raises(ServeError, match="unclaimed, not this connection's"):
            b.request({"op": "mode_set", "job": job, "mode": "async"})
        assert b.request({"op": "release"})["jobs"] == []
        assert b.request({"op": "status"})["jobs"] == []  # and it sees nothing of A's
    a.hold([job], reply["key"])  # A's watcher reconnects and claims with the key
    deadline = time.monotonic() + 20
    while {j["owner"] for j in second.handle(0, {"op": "status"})["jobs"]} == {"unclaimed"}:
        assert time.monotonic() < deadline, "A did not get its job back"
        time.sleep(0.1)
    # A's own status shows the job (a client sees only its connection's), as B left it
    assert [(j["job_id"], [m["mode"] for m in j["modes"]])
            for j in a.request({"op": "status"})["jobs"]] == [(job, ["sync"])]
    assert installed(second) == {job}
    a.close()


def test_a_restarted_serve_without_its_key_file_leaves_the_claim_to_the_operator(
        start: Start, tmp_path: Path) -> None:
    first = start()
    a = ServeClient(first.address)
    reply = a.request({"op": "admit", "members": members(1)})
    job = reply["jobs"][0]["job_id"]
    first.close()
    for kept in first.keys.path.parent.glob("serve-*.json"):
        kept.unlink()
    second = start(first.address)
    with ServeClient(second.address) as b, pytest.raises(
            ServeError, match="only the operator may claim it .serve kept no key for it."):
        b.request({"op": "claim", "jobs": [job], "key": reply["key"]})
    with ServeClient(second.address, operator=True) as operator:
        assert operator.request({"op": "claim", "jobs": [job]})["jobs"] == [job]
    a.close()


def _idle_connections(server: Server, n: int) -> list[socket.socket]:
    host, port = server.address.rsplit(":", 1)
    return [socket.create_connection((host, int(port)), timeout=10) for _ in range(n)]


def test_connections_that_never_authenticate_do_not_lock_a_client_out(
        start: Start, tmp_path: Path) -> None:
    server = start(token_file=str(secret(tmp_path / "serve.token", TOKEN)))
    server.gate.hello_seconds = 600  # the lobby, not the hello deadline, makes the room
    idle = _idle_connections(server, 64)
    try:
        with ServeClient(server.address, token=TOKEN) as client:  # the lobby made room
            assert client.request({"op": "admit", "members": members(1)})["ok"]
        # The oldest idle ones were closed to make room; the newest still wait their turn.
        deadline = time.monotonic() + 20
        while True:  # and none of them counts against the client's connections
            alive = [s for s in idle if not _closed_by_serve(s)]
            if len(alive) <= MAX_WAITING_PER_ADDRESS and not server.clients:
                break
            assert time.monotonic() < deadline, (f"{len(alive)} idle connections open, "
                                                 f"{server.clients} counted")
            time.sleep(0.1)
        assert idle[-1] in alive and idle[0] not in alive  # the oldest made room
    finally:
        for s in idle:
            s.close()


def _closed_by_serve(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(4096, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    finally:
        sock.setblocking(True)


def test_a_wrong_token_ends_its_connection_and_repeated_ones_are_slowed(
        start: Start, tmp_path: Path) -> None:
    server = start(token_file=str(secret(tmp_path / "serve.token", TOKEN)))
    host, port = server.address.rsplit(":", 1)

    def guess() -> tuple[dict[str, Any], str, float]:
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            reader = sock.makefile()
            began = time.monotonic()
            sock.sendall(b'{"op": "hello", "token": "00000000000000000000000000000000"}\n'
                         b'{"op": "hello", "token": "11111111111111111111111111111111"}\n')
            reply = json.loads(reader.readline())
            waited = time.monotonic() - began
            return reply, reader.readline(), waited

    for n in range(1, FREE_FAILURES + 4):
        reply, after, waited = guess()
        assert reply == {"ok": False, "error": "wrong token: present the one in the "
                         "inventory's serve.token_file (--token-file FILE, or "
                         "$HYSYNC_SERVE_TOKEN_FILE)"}
        assert after == ""  # closed: the second guess on it was never read
        if n > FREE_FAILURES:  # answered only after the penalty (a lower bound holds on
            assert waited >= 0.25 * (n - FREE_FAILURES) - 0.01  # any machine)
    with ServeClient(server.address, token=TOKEN) as client:  # the token still works
        assert client.request({"op": "status"})["ok"]


def test_a_client_holds_at_most_its_quota_of_jobs(start: Start) -> None:
    server = start(jobs=2)
    client = ServeClient(server.address)
    for h in (1, 2):
        client.request({"op": "admit", "members": members(h)})
    with pytest.raises(ServeError, match="127.0.0.1 holds 2 jobs, the most one client may: "
                                         "release one first"):
        client.request({"op": "admit", "members": members(3)})
    with ServeClient(server.address, operator=True) as operator:  # the operator has none
        assert operator.request({"op": "admit", "members": members(3)})["ok"]
    client.request({"op": "release"})
    with ServeClient(server.address) as again:  # released jobs free the quota
        assert again.request({"op": "admit", "members": members(1)})["ok"]
    client.close()
