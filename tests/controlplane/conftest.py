"""Fixtures: the recorded P4Info, and a real softswitch (P4Runtime gRPC server on a free
port plus its UDP data plane) started in-process for each test that needs one."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hysync.controlplane.controller import Controller
from hysync.controlplane.job import JobConfig, Member
from hysync.controlplane.p4rt.entities import TableEntry
from hysync.controlplane.p4rt.switch import Switch
from hysync.p4schema import Schema
from hysync.softswitch.native import NativePipeline, NativeUdpDataPlane
from hysync.softswitch.pipeline import Pipeline
from hysync.softswitch.server import serve
from hysync.softswitch.udp_dataplane import UdpDataPlane

ROOT = Path(__file__).resolve().parents[2]
P4INFO = ROOT / "p4src" / "v1model" / "hysync.p4info.txtpb"
EXAMPLE_JOB = ROOT / "controlplane" / "examples" / "job-loopback.toml"


@pytest.fixture(scope="session")
def schema() -> Schema:
    return Schema.from_file(P4INFO)


@dataclass
class Softswitch:
    pipeline: Pipeline
    grpc_addr: str
    udp_addr: tuple[str, int]


def running_softswitch(engine: str = "python") -> Iterator[Softswitch]:
    """A softswitch on `engine`: the reference model, or the native one with 2 threads."""
    dataplane: UdpDataPlane | NativeUdpDataPlane
    if engine == "native":
        native = NativePipeline()
        dataplane = NativeUdpDataPlane(native, "127.0.0.1", 0, threads=2).start()
        pipeline: Pipeline = native
    else:
        pipeline = Pipeline()
        dataplane = UdpDataPlane(pipeline, "127.0.0.1", 0).start()
    server, port = serve(pipeline, "127.0.0.1:0")
    try:
        yield Softswitch(pipeline, f"127.0.0.1:{port}", dataplane.address)
    finally:
        dataplane.stop()
        server.stop(None)


@pytest.fixture
def softswitch() -> Iterator[Softswitch]:
    yield from running_softswitch()


@pytest.fixture
def switch(softswitch: Softswitch) -> Iterator[Switch]:
    """A primary session (election id 1) with the HySync pipeline pushed."""
    with Switch(softswitch.grpc_addr) as sw:
        sw.push_pipeline(P4INFO)
        yield sw


@pytest.fixture
def controller(switch: Switch) -> Controller:
    return Controller(switch).attach()


def free_udp_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
    sock.bind(("127.0.0.1", 0))
    return sock


def make_job(job_id: int = 1, *, workers: int = 4, base: int = 0, count: int = 256,
             ports: list[int] | None = None, mode: str = "sync", quorum: int | None = None,
             mac_base: int = 0, switch_port: int = 1) -> JobConfig:
    """A loopback job; `ports` are the members' UDP ports (default 47001...)."""
    ports = ports or [47000 + job_id * 100 + w for w in range(workers)]
    members = [Member(w, "127.0.0.1", f"02:00:00:00:{(mac_base + w) >> 8:02x}:"
                      f"{(mac_base + w + 1) & 0xFF:02x}", ports[w], switch_port)
               for w in range(workers)]
    data: dict[str, object] = {
        "job_id": job_id, "mode": mode, "slots": {"base": base, "count": count},
        "members": [{"worker": m.worker, "ipv4": m.ipv4, "mac": m.mac, "udp_port": m.udp_port,
                     "switch_port": m.switch_port} for m in members]}
    if quorum is not None:
        data["quorum"] = quorum
    return JobConfig.from_dict(data)


def read_table(switch: Switch, name: str) -> list[TableEntry]:
    """Every entry of one table (Switch reads several tables in one RPC)."""
    return next(iter(switch.read_tables([name]).values()))
