"""Read for the softswitch's server: snapshots under the lock, encoded lazily in chunks.

Table entries and multicast groups are snapshot under the server's lock and encoded
as protobuf; counters are snapshot under the pipeline's lock and encoded by hand
(see `encode_counters`). Responses are serialized ReadResponses, READ_CHUNK entities
each, so that a 49k-cell counter read is a stream of bounded messages.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator

import grpc
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2 as p4r

from hysync import p4rt_codec
from hysync.softswitch.p4binding import BoundCounter, PipelineBinding
from hysync.softswitch.p4status import BatchError, P4RuntimeError, p4_error, unsupported_entity
from hysync.softswitch.p4values import (
    counter_index,
    decode_match,
    encode_action,
    encode_entry,
    encode_value,
)
from hysync.softswitch.p4write import Annotations
from hysync.softswitch.pipeline import Pipeline

READ_CHUNK = 512  # entities per ReadResponse: bounded messages for 49k-cell counter reads


class Reader:
    """Answers the Read requests of one pipeline."""

    def __init__(self, pipeline: Pipeline, lock: threading.Lock,
                 annotations: Annotations) -> None:
        self.pipeline = pipeline
        self._lock = lock  # the server's: no write lands in the middle of a snapshot
        self.annotations = annotations

    def read(self, binding: PipelineBinding, request: p4r.ReadRequest) -> Iterator[bytes]:
        """Serialized ReadResponses (see encode_counters for why bytes, not messages)."""
        errors: list[p4r.Error] = []
        failed: list[str] = []
        batch: list[bytes] = []  # serialized ReadResponse.entities fields
        for i, entity in enumerate(request.entities):
            try:
                found = self._read_entity(binding, entity)
            except P4RuntimeError as err:
                errors.append(p4_error(err.code, err.message))
                failed.append(f"entity {i}: {err.code.name}: {err.message}")
                continue
            errors.append(p4_error(grpc.StatusCode.OK))
            for item in found:
                raw = item if isinstance(item, bytes) else item.SerializeToString()
                batch.append(_length_delimited(_TAG_RESPONSE_ENTITIES, raw))
                if len(batch) >= READ_CHUNK:
                    yield b"".join(batch)
                    batch = []
        if batch:
            yield b"".join(batch)
        if failed:
            more = f"; and {len(failed) - 3} more" if len(failed) > 3 else ""
            raise BatchError(f"Read failed for {len(failed)} of {len(errors)} entities: "
                             + "; ".join(failed[:3]) + more, errors)

    def _read_entity(self, binding: PipelineBinding,
                     entity: p4r.Entity) -> Iterator[p4r.Entity] | Iterator[bytes]:
        """Validate one read request and snapshot what it selects; encode lazily."""
        kind = entity.WhichOneof("entity")
        if kind == "table_entry":
            return self._read_tables(binding, entity.table_entry)
        if kind == "counter_entry":
            return self._read_counters(binding, entity.counter_entry)
        if kind == "packet_replication_engine_entry":
            pre = entity.packet_replication_engine_entry
            if pre.WhichOneof("type") == "multicast_group_entry":
                return self._read_groups(pre.multicast_group_entry.multicast_group_id)
            raise P4RuntimeError(grpc.StatusCode.UNIMPLEMENTED,
                                 "clone sessions are not supported: the HySync program does not "
                                 "clone")
        raise unsupported_entity(kind)

    def _read_tables(self, binding: PipelineBinding, te: p4r.TableEntry) -> Iterator[p4r.Entity]:
        if te.table_id == 0:
            if te.match or te.priority or te.HasField("action") or te.is_default_action:
                raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                     "table_id 0 reads every table and takes no other filter: "
                                     "set table_id to filter")
            tables = list(binding.tables.values())
        else:
            tables = [binding.table(te.table_id)]
        if te.is_default_action:
            table = tables[0]
            action, params = self.pipeline.tables[table.name].default_action, \
                self.pipeline.tables[table.name].default_params
            out = p4r.TableEntry(table_id=table.id, is_default_action=True)
            encode_action(binding, out, action, params)
            return iter([p4r.Entity(table_entry=out)])
        match = decode_match(tables[0], [p4rt_codec.decode_field_match(fm.SerializeToString())
                                         for fm in te.match]) if te.match else None
        action_id = te.action.action.action_id if te.HasField("action") else 0
        snapshot = []
        with self._lock:
            for table in tables:
                for entry in self.pipeline.tables[table.name].entries.values():
                    meta = self.annotations.entries.get((table.name, entry.key), (0, b""))
                    if ((match is None or entry.match == match)
                            and (not te.priority or entry.priority == te.priority)
                            and (not action_id
                                 or binding.action_ids.get(entry.action) == action_id)
                            and (not te.controller_metadata
                                 or meta[0] == te.controller_metadata)
                            and (not te.metadata or meta[1] == te.metadata)):
                        snapshot.append((table, entry, meta))
        return (p4r.Entity(table_entry=encode_entry(binding, *row)) for row in snapshot)

    def _read_counters(self, binding: PipelineBinding, ce: p4r.CounterEntry) -> Iterator[bytes]:
        if ce.counter_id == 0:
            if ce.HasField("index"):
                raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                     "an index needs a counter_id: counter_id 0 reads every cell "
                                     "of every counter")
            infos = list(binding.counters.values())
        else:
            infos = [binding.counter(ce.counter_id)]
        snapshot = []
        for info in infos:
            index = counter_index(info, ce.index.index if ce.HasField("index") else None)
            counter = self.pipeline.counters[info.name]
            with self.pipeline.lock:
                if index is None:
                    snapshot.append((info, 0, counter.packets[:], counter.bytes[:]))
                else:
                    snapshot.append((info, index, counter.packets[index:index + 1],
                                     counter.bytes[index:index + 1]))
        return encode_counters(snapshot)

    def _read_groups(self, gid: int) -> Iterator[p4r.Entity]:
        with self._lock:
            groups = sorted(self.pipeline.groups.items()) if gid == 0 else \
                [(gid, self.pipeline.groups[gid])] if gid in self.pipeline.groups else []
            snapshot = [(g, list(replicas), self.annotations.groups.get(g, (b"", False)))
                        for g, replicas in groups]
        for g, replicas, (metadata, uses_port_bytes) in snapshot:
            out = p4r.MulticastGroupEntry(multicast_group_id=g, metadata=metadata)
            for r in replicas:
                replica = out.replicas.add(instance=r.rid)
                if uses_port_bytes:
                    replica.port = encode_value(r.port)
                else:
                    replica.egress_port = r.port
            entity = p4r.Entity()
            entity.packet_replication_engine_entry.multicast_group_entry.CopyFrom(out)
            yield entity


# Counter reads are encoded by hand: the straggler policy reads 8192-cell counters
# periodically, and building one p4.v1.Entity per cell with the pure-Python protobuf
# this project pins (3.20) costs ~100 us each, seconds per read, holding the GIL the
# data plane needs. The wire format of Entity{counter_entry} is small and fixed
# (field numbers from p4/v1/p4runtime.proto; a test parses the result with protobuf).
_TAG_RESPONSE_ENTITIES = b"\x0a"  # ReadResponse.entities = 1
_TAG_COUNTER_ENTRY = b"\x3a"  # Entity.counter_entry = 7
_TAG_COUNTER_ID = b"\x08"  # CounterEntry.counter_id = 1
_TAG_INDEX = b"\x12"  # CounterEntry.index = 2 (Index.index = 1)
_TAG_DATA = b"\x1a"  # CounterEntry.data = 3 (CounterData.byte_count = 1, packet_count = 2)
_EMPTY_DATA = _TAG_DATA + b"\x00"


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _length_delimited(tag: bytes, payload: bytes) -> bytes:
    return tag + _varint(len(payload)) + payload


@functools.cache
def _index_field(index: int) -> bytes:
    return _length_delimited(_TAG_INDEX, b"\x08" + _varint(index) if index else b"")


def _data_field(packets: int, nbytes: int, unit: int) -> bytes:
    body = b""
    if nbytes and unit != p4info_pb2.CounterSpec.PACKETS:
        body += b"\x08" + _varint(nbytes)
    if packets and unit != p4info_pb2.CounterSpec.BYTES:
        body += b"\x10" + _varint(packets)
    return _length_delimited(_TAG_DATA, body) if body else _EMPTY_DATA


def encode_counters(snapshot: list[tuple[BoundCounter, int, list[int], list[int]]]
                     ) -> Iterator[bytes]:
    """Serialized Entity{counter_entry{counter_id, index, data}}, one per cell."""
    for info, first, packets, nbytes in snapshot:
        head = _TAG_COUNTER_ID + _varint(info.id)
        for i, (p, b) in enumerate(zip(packets, nbytes, strict=True)):
            entry = head + _index_field(first + i) + _data_field(p, b, info.unit)
            yield _length_delimited(_TAG_COUNTER_ENTRY, entry)

