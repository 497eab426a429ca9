"""hysync.scapy: the scapy layer agrees byte for byte with hysync.wire, dissects both
directions of the HySync port, and `hysync sniff` prints what crosses an interface."""

from __future__ import annotations

import io
import json
import os
import random
import socket
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from hysync import wire
from hysync.controlplane.cli.main import main
from hysync.scapy import HySync, describe
from hysync.wire import FrameAddress, Header, Op

u8, u16, u32 = (st.integers(0, 2**bits - 1) for bits in (8, 16, 32))
headers = st.builds(Header, op=st.sampled_from(list(Op)), job_id=u16, worker_id=u8, slot=u16,
                    round=u32, chunk=u32, flags=st.integers(0, 3), mode=st.integers(0, 2),
                    count=u8, reason=st.integers(0, 3), quorum=u8, bitmap=u32)


def _fields(h: Header) -> dict[str, int]:
    return {name: getattr(h, name) for name, _ in wire.HEADER_FIELDS}


@settings(max_examples=100, deadline=None)
@given(h=headers, seed=st.integers(0, 2**32 - 1))
def test_a_crafted_packet_is_the_wire_encoding(h: Header, seed: int) -> None:
    lanes = np.random.default_rng(seed).integers(-2**31, 2**31, wire.LANES, dtype=np.int64)
    has_lanes = h.op in (Op.CONTRIB, Op.RESULT)
    expected = wire.Packet(h, lanes.astype(np.int32) if has_lanes else None).encode()
    crafted = HySync(**_fields(h), lanes=[int(v) for v in lanes]) if has_lanes else \
        HySync(**_fields(h))
    assert bytes(crafted) == expected
    back = wire.Packet.decode(bytes(crafted))
    assert back.header == h


def test_frames_to_and_from_the_port_dissect_as_hysync() -> None:
    h = Header(op=Op.RESULT, job_id=3, worker_id=1, slot=9, round=41, chunk=7, mode=1,
               count=3, reason=0x5C, quorum=3, bitmap=0b1011)
    lanes = np.arange(wire.LANES, dtype=np.int32) - 20
    payload = wire.Packet(h, lanes).encode()
    addr = FrameAddress(b"\x02" * 6, b"\x04" * 6, wire.ip_to_int("10.0.0.254"),
                        wire.ip_to_int("10.0.0.2"), wire.HYSYNC_UDP_PORT, 40002)
    frame = Ether(wire.build_frame(addr, payload))  # from the switch: sport 48620
    assert frame.haslayer(HySync)
    assert {name: frame[HySync].getfieldval(name) for name, _ in wire.HEADER_FIELDS} == \
        _fields(h)
    assert frame[HySync].lanes == lanes.tolist()
    assert describe(frame) == ("10.0.0.254:48620 > 10.0.0.2:40002 RESULT job 3 worker 1 slot 9 "
                               "round 41 chunk 7 mode PARTIAL quorum 3 count 3 "
                               "bitmap 0x0000000b tag 92")
    crafted = Ether() / IP() / UDP(sport=40001) / HySync(op="ACK")
    assert Ether(bytes(crafted))[UDP].dport == wire.HYSYNC_UDP_PORT
    assert not Ether(bytes(Ether() / IP() / UDP(sport=1, dport=2) / (b"x" * 24))).haslayer(HySync)


def test_sniff_of_an_unknown_interface_is_a_one_line_error() -> None:
    err = io.StringIO()
    assert main(["sniff", f"nosuch{os.getpid() % 10000}", "--duration", "1"],
                stdout=io.StringIO(), stderr=err) == 1
    assert err.getvalue().count("\n") == 1
    assert err.getvalue().startswith("hysync: error: ")


@pytest.mark.skipif(os.geteuid() != 0, reason="capturing on lo needs root (CAP_NET_RAW)")
def test_hysync_sniff_prints_the_headers_crossing_an_interface() -> None:
    job = random.randrange(1000, 60000)  # tells our packets from any other on lo
    out = io.StringIO()
    status: list[int] = []
    sniffer = threading.Thread(target=lambda: status.append(
        main(["sniff", "lo", "--duration", "4"], stdout=out, stderr=out)))
    sniffer.start()
    sent = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        while sniffer.is_alive():  # from before the capture starts until it ends
            sock.sendto(Header(op=Op.ACK, job_id=job, worker_id=2, slot=5, round=sent).pack(),
                        ("127.0.0.1", wire.HYSYNC_UDP_PORT))
            sent += 1
            time.sleep(0.1)
    assert status == [0], out.getvalue()
    ours = [line.split(" > ")[1] for line in out.getvalue().splitlines()
            if f"ACK job {job} " in line]
    rounds = [int(line.split(" round ")[1].split()[0]) for line in ours]
    assert ours == [f"127.0.0.1:48620 ACK job {job} worker 2 slot 5 round {r} chunk 0 tag 0"
                    for r in rounds]
    # once each (lo shows a packet twice: sent and received), in order; a capture on a
    # loaded machine may miss one, so not necessarily every one of the ~30 sent
    assert rounds == sorted(set(rounds)) and len(rounds) >= 5, out.getvalue()
    assert out.getvalue().splitlines()[-1].endswith("HySync packet(s) on lo")


@pytest.mark.skipif(os.geteuid() != 0, reason="capturing on lo needs root (CAP_NET_RAW)")
def test_hysync_sniff_json_prints_one_object_per_packet() -> None:
    job = random.randrange(1000, 60000)
    out = io.StringIO()
    status: list[int] = []
    sniffer = threading.Thread(target=lambda: status.append(
        main(["sniff", "lo", "--json", "--duration", "3"], stdout=out, stderr=out)))
    sniffer.start()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sent = 0
        while sniffer.is_alive():
            sock.sendto(Header(op=Op.ACK, job_id=job, worker_id=2, slot=5, round=sent).pack(),
                        ("127.0.0.1", wire.HYSYNC_UDP_PORT))
            sent += 1
            time.sleep(0.1)
    assert status == [0], out.getvalue()
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    ours = [r for r in records if r.get("job_id") == job]
    assert len(ours) >= 3, out.getvalue()
    assert {k: ours[0][k] for k in ("op", "worker_id", "slot", "dst")} == {
        "op": "ACK", "worker_id": 2, "slot": 5, "dst": f"127.0.0.1:{wire.HYSYNC_UDP_PORT}"}
    assert records[-1] == {"packets": len(records) - 1, "iface": "lo"}
