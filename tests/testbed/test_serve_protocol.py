"""`hysync serve` refuses bad requests cleanly: whatever a client sends, the answer is one
line `{"ok": false, "error": ...}` on a connection that stays open, serve logs no traceback,
and a 100 MB line does not grow serve's memory."""

from __future__ import annotations

import io
import json
import logging
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hysync.controlplane.cli.main import main
from hysync.controlplane.serve.requests import MAX_LINE, OPS
from hysync.controlplane.serve.server import Server
from hysync.controlplane.testbed.inventory import Inventory

from .conftest import (
    ANY_PORT,
    ROOT,
    Softswitch,
    loopback_inventory,
    published,
    write_inventory,
)


class Line:
    """A raw connection to serve: bytes out, one JSON reply line in."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=20)
        self.reader = self.sock.makefile("rb")

    def ask(self, data: bytes) -> dict[str, Any]:
        self.sock.sendall(data)
        return self.reply()

    def reply(self) -> dict[str, Any]:
        line = self.reader.readline()
        assert line.endswith(b"\n"), "serve closed the connection"
        reply = json.loads(line)
        assert isinstance(reply, dict) and isinstance(reply.get("ok"), bool), reply
        if not reply["ok"]:
            assert isinstance(reply["error"], str) and reply["error"], reply
            assert "Traceback" not in reply["error"] and "\n" not in reply["error"]
        return reply

    def request(self, message: object) -> dict[str, Any]:
        return self.ask(json.dumps(message).encode() + b"\n")

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


@pytest.fixture
def inventory(tmp_path: Path, softswitch: Softswitch) -> Path:
    data = loopback_inventory(softswitch.grpc_addr, softswitch.udp_addr[1],
                              ANY_PORT, hosts=3)
    path = write_inventory(tmp_path / "rack.toml", data)
    assert main(["deploy", str(path)], stdout=io.StringIO(), stderr=io.StringIO()) == 0
    return path


@pytest.fixture
def server(inventory: Path) -> Iterator[Server]:
    server = published(Server(Inventory.load(inventory), policy=None,
                              say=lambda _: None).start())
    yield server
    server.close()


def test_the_malformed_requests_that_once_closed_the_connection(server: Server) -> None:
    line = Line(server.address)
    line.request({"op": "admit", "members": [{"worker": 0, "host": "h1", "udp_port": 41000},
                                             {"worker": 1, "host": "h2", "udp_port": 41001}]})
    cases: list[tuple[bytes, str]] = [
        (b'{"op": "admit", "members": [null]}',
         r"members\[0\] = null: give an object \{worker, host, udp_port"),
        (b'{"op": "mode_set", "job": 1, "mode": "sync", "slots": [1]}',
         r"slots = a list: give a list of 2 slots \[first, last\]"),
        (b'{"op": "mode_set", "job": 1, "mode": "sync", "slots": Infinity}',
         "Infinity is not a number a request may hold"),
        (b'{"op": "mode_set", "job": 1, "mode": "sync", "slots": [1e400, 2]}',
         r"slots\[0\] = Infinity: give an integer 0..8191"),
        (b"[" * 30_000 + b"]" * 30_000, "nests deeper than 16 levels"),
        (b"[" * 100_000 + b"]" * 100_000, "request line longer than 65536 bytes"),
        # Quotes and escapes that a backtracking string scan takes quadratic time over.
        (b'"' + b'\\"' * 32_000, "not JSON"),
        (b'{"op": "leave", "job": 1, "worker": ' + b"7" * 5000 + b"}",
         "a number of 5000 digits: no field takes more than 20"),
        (b'{"op": "mode_set", "job": 1, "mode": "fast"}',
         "mode = 'fast': give one of sync, partial, async"),
        (b'{"op": "exclude", "job": 1, "worker": 1, "force": true}',
         "op exclude has no field 'force': its fields are job, worker, key"),
        (b"\xff\xfe", "byte 0 of the request is not UTF-8"),
        (b"[1, 2]", "a request is a JSON object, not a list"),
        (b"{", "not JSON"),
    ]
    for data, error in cases:
        reply = line.ask(data + b"\n")
        assert not reply["ok"] and re.search(error, reply["error"]), (data[:60], reply)
    assert line.request({"op": "status"})["jobs"][0]["job_id"] == 1  # nothing changed
    line.close()


# Values of every JSON type, nested a little; field names each op knows and others.
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=4),
    max_leaves=10)
JOB_TABLE = st.fixed_dictionaries(  # job_add's job file, near valid
    {"job_id": st.integers(0, 300),
     "slots": st.fixed_dictionaries({"base": st.integers(-1, 9000), "count": st.integers(-1, 300)}),
     "members": st.lists(st.fixed_dictionaries(
         {"worker": st.integers(0, 3), "ipv4": st.sampled_from(["127.0.0.1", "10.0.0.300"]),
          "mac": st.sampled_from(["02:00:00:00:01:01", "zz"]),
          "udp_port": st.integers(0, 70000), "switch_port": st.integers(-1, 600)}), max_size=3)},
    optional={"mode": st.sampled_from(["sync", "partial", "async", "x"]), "quorum": JSON,
              "scale": JSON, "lanes": JSON, "name": JSON})
NEAR = {  # values close to valid, so that requests reach the switch too
    "job": st.integers(0, 3) | JOB_TABLE, "worker": st.integers(-1, 33), "mode": st.sampled_from(
        ["sync", "partial", "async", "Sync", ""]), "quorum": st.integers(-1, 40),
    "slots": st.lists(st.integers(-2, 8200), max_size=3),
    "members": st.lists(st.fixed_dictionaries(
        {"worker": st.integers(0, 3), "host": st.sampled_from(["h1", "h2", "h3", "h9"]),
         "udp_port": st.integers(0, 70000)}), max_size=3),
}
FIELDS = sorted({f for fields in OPS.values() for f in fields})


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    if draw(st.integers(0, 9)) == 0:  # raw bytes: not JSON, or not UTF-8
        return draw(st.binary(max_size=64)).replace(b"\n", b" ") + b"\n"
    request: dict[str, Any] = {}
    for name in draw(st.lists(st.sampled_from(FIELDS) | st.text(max_size=6), max_size=5)):
        near = NEAR.get(name)
        request[name] = draw(near | JSON if near is not None else JSON)
    op = draw(st.sampled_from(sorted(OPS)) | JSON)
    request = {"op": op, **request} if draw(st.booleans()) else {**request, "op": op}
    top = draw(st.sampled_from(["object"] * 8 + ["value"]))
    return json.dumps(request if top == "object" else draw(JSON)).encode() + b"\n"


@pytest.mark.parametrize("role", ["client", "operator"])
def test_arbitrary_requests_to_every_op_get_one_line_and_keep_the_connection(
        server: Server, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture,
        role: str) -> None:
    caplog.set_level(logging.WARNING)
    line = Line(server.address)
    if role == "operator":  # every op reaches its handler: job_add's job file too
        assert line.request({"op": "hello", "operator": True})["operator"]
    line.request({"op": "admit", "members": [{"worker": w, "host": f"h{w + 1}",
                                              "udp_port": 41000 + w} for w in range(3)]})
    sent = 0

    @settings(max_examples=400, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(requests())
    def one(data: bytes) -> None:
        nonlocal sent
        line.ask(data)
        sent += 1

    one()
    assert sent >= 400
    assert line.request({"op": "status"})["ok"]  # the same connection, still served
    line.close()
    problems = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert problems == []
    assert "Traceback" not in capsys.readouterr().err


def _memory(pid: int) -> dict[str, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    return {k: int(v) * 1024 for k, v in re.findall(r"^(VmHWM|VmRSS):\s+(\d+) kB", status, re.M)}


@pytest.mark.slow
def test_a_100_mb_line_is_refused_in_bounded_memory(inventory: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "hysync.controlplane.cli", "serve",
                             str(inventory), "--policy", "none"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        match = re.search(r"requests on (127\.0\.0\.1:\d+)", first)
        assert match, first + proc.stdout.read()
        line = Line(match[1])
        assert line.request({"op": "status"})["ok"]
        before = _memory(proc.pid)
        chunk = b"x" * (1 << 20)
        for _ in range(100):
            line.sock.sendall(chunk)
        line.sock.sendall(b"\n")
        reply = line.reply()  # answered as soon as the line passed MAX_LINE
        assert reply == {"ok": False, "error": f"request line longer than {MAX_LINE} bytes: a "
                         "request is one JSON object of at most 64 KiB ending in a newline"}
        assert line.request({"op": "status"})["ok"]  # resynchronized at the newline
        after = _memory(proc.pid)
        grown = after["VmHWM"] - before["VmHWM"]
        assert grown < 4 << 20, f"serve's peak memory grew by {grown / 2**20:.1f} MB"
        line.close()
    finally:
        proc.terminate()
        proc.wait(timeout=15)
