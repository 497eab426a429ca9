"""The native UDP data plane behind the real P4Runtime server, over real sockets.

Garbage, truncated and oversized datagrams change no state, crash nothing, and are
counted as drops that `hysync stats` shows; the round that follows them aggregates as if
they had never arrived.
"""

from __future__ import annotations

import io
import socket
import time
from collections.abc import Iterator

import numpy as np
import pytest

from hysync import wire
from hysync.controlplane.cli.main import main as hysync
from hysync.controlplane.controller import Controller
from hysync.controlplane.p4rt.switch import Switch
from tests.controlplane.conftest import (
    P4INFO,
    Softswitch,
    free_udp_socket,
    make_job,
    running_softswitch,
)

WORKERS = 4
DROPS = "HySyncIngress.stats.drops"


@pytest.fixture
def native() -> Iterator[Softswitch]:
    yield from running_softswitch("native")


@pytest.fixture
def members(native: Softswitch) -> Iterator[list[socket.socket]]:
    socks = [free_udp_socket() for _ in range(WORKERS)]
    for s in socks:
        s.settimeout(5)
    with Switch(native.grpc_addr) as sw:
        sw.push_pipeline(P4INFO)
        Controller(sw).attach().add_job(
            make_job(1, workers=WORKERS, count=16, ports=[s.getsockname()[1] for s in socks]))
    yield socks
    for s in socks:
        s.close()


def contribution(w: int, lanes: np.ndarray, *, slot: int = 3, version: int = wire.VERSION,
                 op: int = wire.Op.CONTRIB) -> bytes:
    header = wire.Header(op=op, job_id=1, worker_id=w, slot=slot, round=0, chunk=9,
                         version=version)
    return header.pack() + lanes.astype(">i4").tobytes()


def drops(native: Softswitch, job: int) -> dict[str, int]:
    cells = native.pipeline.counters[DROPS].packets
    base = job * wire.NUM_DROP_REASONS
    return {r.name: cells[base + r] for r in wire.DropReason if cells[base + r]}


def test_junk_changes_nothing_and_is_counted_where_hysync_stats_shows_it(
        native: Softswitch, members: list[socket.socket]) -> None:
    lanes = np.arange(wire.LANES, dtype=np.int32)
    good = contribution(0, lanes)
    junk = {
        "MALFORMED": [b"", b"\x01", good[:wire.HEADER_BYTES + 10]],
        "BAD_VERSION": [contribution(0, lanes, version=7)],
        "BAD_OP": [contribution(0, lanes, op=wire.Op.RESULT), good[:1] + b"\x09" + good[2:24]],
        # 3000 bytes: cut to the data plane's 2048-byte buffers, then refused by length.
        "BAD_LENGTH": [good + b"\x00", good + bytes(3000 - len(good))],
        "SLOT_RANGE": [contribution(0, lanes, slot=16)],
    }
    for datagrams in junk.values():
        for d in datagrams:
            members[0].sendto(d, native.udp_addr)
    stranger = free_udp_socket()
    stranger.sendto(good, native.udp_addr)  # same bytes, not a member's address: NOT_MEMBER
    stranger.close()

    # The round after the junk: every member's lanes, every member gets the exact sum.
    for w, sock in enumerate(members):
        sock.sendto(contribution(w, lanes * (w + 1)), native.udp_addr)
    for sock in members:
        result = wire.Packet.decode(sock.recv(2048))
        assert (result.header.op, result.header.count, result.header.bitmap) == \
            (wire.Op.RESULT, WORKERS, 0b1111)
        np.testing.assert_array_equal(result.lanes, lanes * sum(range(1, WORKERS + 1)))

    expected = {reason: len(datagrams) for reason, datagrams in junk.items()}
    expected["MALFORMED"] -= 2  # the two shorter than a header carry no job: job 0's block
    expected["NOT_MEMBER"] = 1
    # The stranger's datagram may land on another data-plane thread than the members'.
    deadline = time.monotonic() + 5
    while drops(native, 1) != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    assert drops(native, 1) == expected
    assert drops(native, 0) == {"MALFORMED": 2}

    out = io.StringIO()
    assert hysync(["--grpc-addr", native.grpc_addr, "stats", "1"], stdout=out) == 0
    shown = out.getvalue().splitlines()[-1]
    for reason, n in expected.items():
        assert f"{reason} {n}" in shown, shown
