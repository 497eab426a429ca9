"""Fixtures for the softswitch's P4Runtime server: a running server and a raw-protobuf client.

The client is deliberately local and small (grpc stubs and protobufs, no controlplane/
code): these tests pin the server to the P4Runtime spec, not to our own client.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import text_format
from google.rpc import status_pb2
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2 as p4r
from p4.v1 import p4runtime_pb2_grpc

from hysync.softswitch.native import NativePipeline
from hysync.softswitch.pipeline import Pipeline
from hysync.softswitch.server import serve

REPO = Path(__file__).resolve().parents[2]
P4INFO_PATH = REPO / "p4src" / "v1model" / "hysync.p4info.txtpb"
DEVICE_ID = 1
CONTROLLER_ELECTION_ID = 10

INSERT, MODIFY, DELETE = p4r.Update.INSERT, p4r.Update.MODIFY, p4r.Update.DELETE
Config = p4r.SetForwardingPipelineConfigRequest


def load_p4info() -> p4info_pb2.P4Info:
    if not P4INFO_PATH.exists():
        pytest.skip(f"{P4INFO_PATH} is missing (it is the P4 program's control-plane contract)")
    return text_format.Parse(P4INFO_PATH.read_text(), p4info_pb2.P4Info())


class Names:
    """P4Info ids by name, the way a controller looks them up."""

    def __init__(self, p4info: p4info_pb2.P4Info) -> None:
        self.p4info = p4info
        self.tables = {t.preamble.name: t for t in p4info.tables}
        self.actions = {a.preamble.name: a for a in p4info.actions}
        self.counters = {c.preamble.name: c for c in p4info.counters}

    def table_id(self, table: str) -> int:
        return self.tables[table].preamble.id

    def field(self, table: str, name: str) -> p4info_pb2.MatchField:
        return next(f for f in self.tables[table].match_fields if f.name == name)

    def action_id(self, action: str) -> int:
        return self.actions[action].preamble.id

    def param_id(self, action: str, name: str) -> int:
        return next(p.id for p in self.actions[action].params if p.name == name)

    def counter_id(self, counter: str) -> int:
        return self.counters[counter].preamble.id


def enc(value: int, width: int = 0) -> bytes:
    """Canonical bytestring, or `width` bytes (leading zeros) when given."""
    return value.to_bytes(width or max(1, (value.bit_length() + 7) // 8), "big")


def table_entry(names: Names, table: str, match: dict[str, Any], action: str | None = None,
                params: dict[str, int] | None = None, priority: int = 0) -> p4r.TableEntry:
    """A TableEntry by names: exact values are ints, range values (lo, hi) pairs."""
    te = p4r.TableEntry(table_id=names.table_id(table), priority=priority)
    for name, value in match.items():
        f = names.field(table, name)
        fm = te.match.add(field_id=f.id)
        if f.match_type == p4info_pb2.MatchField.RANGE:
            fm.range.low, fm.range.high = enc(value[0]), enc(value[1])
        else:
            fm.exact.value = enc(value)
    if action is not None:
        a = te.action.action
        a.action_id = names.action_id(action)
        for name, value in (params or {}).items():
            a.params.add(param_id=names.param_id(action, name), value=enc(value))
    return te


def update(kind: int, **entity: Any) -> p4r.Update:
    """update(INSERT, table_entry=te) / (MODIFY, counter_entry=ce) / (INSERT, group=mge)."""
    u = p4r.Update(type=kind)
    if "group" in entity:
        u.entity.packet_replication_engine_entry.multicast_group_entry.CopyFrom(entity["group"])
    elif "table_entry" in entity:
        u.entity.table_entry.CopyFrom(entity["table_entry"])
    else:
        u.entity.counter_entry.CopyFrom(entity["counter_entry"])
    return u


def group(group_id: int, replicas: list[tuple[int, int]]) -> p4r.MulticastGroupEntry:
    g = p4r.MulticastGroupEntry(multicast_group_id=group_id)
    for port, rid in replicas:
        g.replicas.add(egress_port=port, instance=rid)
    return g


def p4_errors(err: grpc.RpcError) -> list[p4r.Error]:
    """The per-update p4.v1.Error list of a batch failure (spec §12.3)."""
    for key, value in err.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            errors = []
            for detail in status.details:
                error = p4r.Error()
                assert detail.Unpack(error)
                errors.append(error)
            return errors
    return []


def uint128(value: int) -> p4r.Uint128:
    return p4r.Uint128(high=value >> 64, low=value & (1 << 64) - 1)


class Client:
    """A P4Runtime client speaking raw protobufs: one channel, one optional StreamChannel."""

    def __init__(self, port: int, device_id: int = DEVICE_ID) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = p4runtime_pb2_grpc.P4RuntimeStub(self.channel)
        self.device_id = device_id
        self.election_id: int | None = None
        self._requests: queue.Queue[p4r.StreamMessageRequest | None] = queue.Queue()
        self.responses: queue.Queue[p4r.StreamMessageResponse | grpc.RpcError] = queue.Queue()
        self._call: Any = None

    # ------------------------------------------------------- stream
    def open_stream(self) -> None:
        self._call = self.stub.StreamChannel(iter(self._requests.get, None))
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        try:
            for response in self._call:
                self.responses.put(response)
        except grpc.RpcError as err:
            self.responses.put(err)

    def send_arbitration(self, election_id: int | None, role: str = "",
                         device_id: int | None = None) -> None:
        if self._call is None:
            self.open_stream()
        msg = p4r.StreamMessageRequest()
        msg.arbitration.device_id = self.device_id if device_id is None else device_id
        if role:
            msg.arbitration.role.name = role
        if election_id is not None:
            msg.arbitration.election_id.CopyFrom(uint128(election_id))
            self.election_id = election_id
        self._requests.put(msg)

    def send(self, msg: p4r.StreamMessageRequest) -> None:
        self._requests.put(msg)

    def next_message(self, timeout: float = 5) -> p4r.StreamMessageResponse | grpc.RpcError:
        return self.responses.get(timeout=timeout)

    def next_arbitration(self, timeout: float = 5) -> p4r.MasterArbitrationUpdate:
        msg = self.next_message(timeout)
        assert isinstance(msg, p4r.StreamMessageResponse), f"stream ended: {msg}"
        assert msg.WhichOneof("update") == "arbitration", msg
        return msg.arbitration

    def no_message(self, wait: float = 0.3) -> bool:
        try:
            self.responses.get(timeout=wait)
        except queue.Empty:
            return True
        return False

    def arbitrate(self, election_id: int | None, role: str = "") -> p4r.MasterArbitrationUpdate:
        self.send_arbitration(election_id, role)
        return self.next_arbitration()

    def close_stream(self) -> None:
        if self._call is not None:
            self._requests.put(None)
            self._call.cancel()
            self._call = None

    def close(self) -> None:
        self.close_stream()
        self.channel.close()

    # ---------------------------------------------------------- RPCs
    def _election(self, request: Any, election_id: int | None) -> None:
        eid = self.election_id if election_id is None else election_id
        if eid is not None:
            request.election_id.CopyFrom(uint128(eid))

    def set_pipeline(self, p4info: p4info_pb2.P4Info | None,
                     action: int = Config.VERIFY_AND_COMMIT, election_id: int | None = None,
                     device_config: bytes = b"", cookie: int = 0) -> None:
        request = Config(device_id=self.device_id, action=action)
        self._election(request, election_id)
        if p4info is not None:
            request.config.p4info.CopyFrom(p4info)
            request.config.p4_device_config = device_config
            request.config.cookie.cookie = cookie
        self.stub.SetForwardingPipelineConfig(request, timeout=10)

    def get_pipeline(self, response_type: int = 0) -> p4r.GetForwardingPipelineConfigResponse:
        return self.stub.GetForwardingPipelineConfig(
            p4r.GetForwardingPipelineConfigRequest(device_id=self.device_id,
                                                   response_type=response_type), timeout=10)

    def write(self, *updates: p4r.Update, election_id: int | None = None,
              device_id: int | None = None, atomicity: int = 0) -> None:
        request = p4r.WriteRequest(device_id=self.device_id if device_id is None else device_id,
                                   atomicity=atomicity)
        self._election(request, election_id)
        request.updates.extend(updates)
        self.stub.Write(request, timeout=10)

    def read_responses(self, *entities: p4r.Entity) -> list[p4r.ReadResponse]:
        request = p4r.ReadRequest(device_id=self.device_id)
        request.entities.extend(entities)
        return list(self.stub.Read(request, timeout=30))

    def read(self, *entities: p4r.Entity) -> list[p4r.Entity]:
        return [e for r in self.read_responses(*entities) for e in r.entities]

    def read_table(self, table_id: int = 0) -> list[p4r.TableEntry]:
        return [e.table_entry for e in self.read(p4r.Entity(table_entry=p4r.TableEntry(
            table_id=table_id)))]


@pytest.fixture(scope="session")
def p4info() -> p4info_pb2.P4Info:
    return load_p4info()


@pytest.fixture(scope="session")
def names(p4info: p4info_pb2.P4Info) -> Names:
    return Names(p4info)


@pytest.fixture(params=["python", "native"])
def pipeline(request) -> Pipeline:
    """The server's tests on the reference model and on the native engine behind it."""
    return NativePipeline() if request.param == "native" else Pipeline()


@pytest.fixture
def server_port(pipeline: Pipeline) -> Iterator[int]:
    """A real P4Runtime gRPC server on 127.0.0.1, any free port, around `pipeline`."""
    server, port = serve(pipeline, "127.0.0.1:0", DEVICE_ID)
    yield port
    server.stop(None)


@pytest.fixture
def connect(server_port: int) -> Iterator[Any]:
    """connect() -> a new Client of the server; all are closed after the test."""
    clients: list[Client] = []

    def make(device_id: int = DEVICE_ID) -> Client:
        clients.append(Client(server_port, device_id))
        return clients[-1]

    yield make
    for c in clients:
        c.close()


@pytest.fixture
def controller(connect: Any, p4info: p4info_pb2.P4Info) -> Client:
    """The primary controller (election id 10), with the real P4Info committed."""
    client = connect()
    status = client.arbitrate(CONTROLLER_ELECTION_ID).status
    assert status.code == 0, status
    client.set_pipeline(p4info)
    return client
