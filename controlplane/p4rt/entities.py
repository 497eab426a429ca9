"""P4Runtime entities as small immutable values, encoded and decoded through a Schema.

`TableEntry`, `MulticastGroup` and `CounterCell` are what the controller computes,
writes and reads back; `record(schema)` checks one against the P4Info and gives the
record of the Write codec (hysync/p4rt_codec.py: what `Switch.write` sends as bytes),
`encode(schema)` the `p4.v1.Entity` protobuf of it, and `decode(msg, schema)` the
value again, so that what is installed compares equal to what was intended. Values
are encoded as P4Runtime canonical bytestrings (the shortest big-endian string,
`b"\\x00"` for zero) after a check against the P4Info bit width; decoding accepts any
padding and checks the width again.

Match values by kind: exact and optional take an int (optional: None = wildcard),
range takes `(low, high)` inclusive, ternary `(value, mask)`, lpm `(value, prefix_len)`.
A range covering the whole field, a zero ternary mask or a zero prefix is a
"don't care" that P4Runtime requires to be omitted: encode omits it, decode
restores it, so both directions give the same value.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Union

from p4.v1 import p4runtime_pb2 as p4r

from hysync import p4names, p4rt_codec, wire
from hysync.p4schema import EncodeError, MatchFieldInfo, Schema, SchemaError, decode_int, encode_int

MatchValue = Union[int, tuple[int, int], None]  # noqa: UP007 (a runtime alias, 3.11 safe)


# ------------------------------------------------------------ table entries
@dataclass(frozen=True, slots=True)
class TableEntry:
    """One entry of a P4 table; `match` and `params` are keyed by P4Info field names."""

    table: str
    match: Mapping[str, MatchValue] = field(default_factory=dict)
    action: str | None = None
    params: Mapping[str, int] = field(default_factory=dict)
    priority: int = 0
    is_default: bool = False

    def __post_init__(self) -> None:
        # Private copies: a frozen value must not change under the caller's dict.
        object.__setattr__(self, "match", dict(self.match))
        object.__setattr__(self, "params", dict(self.params))

    def __hash__(self) -> int:
        return hash((self.table, tuple(sorted(self.match.items())), self.action,
                     tuple(sorted(self.params.items())), self.priority, self.is_default))

    @property
    def key(self) -> tuple[str, tuple[tuple[str, MatchValue], ...], int]:
        """What identifies the entry in its table (P4Runtime: match and priority)."""
        return self.table, tuple(sorted(self.match.items())), self.priority

    def encode(self, schema: Schema) -> p4r.Entity:
        return p4r.Entity.FromString(p4rt_codec.encode_entity(self.record(schema)))

    def record(self, schema: Schema) -> p4rt_codec.TableEntry:
        """The entry as the P4Runtime wire codec's record, checked against the P4Info."""
        table = schema.table(self.table)
        match: list[p4rt_codec.FieldMatch] = []
        priority = 0
        if self.is_default:
            if self.match:
                raise EncodeError(f"the default entry of {table.name} takes no match fields")
        else:
            given = set(self.match)
            for info in table.match_fields:
                if info.name not in given and info.kind == "exact":
                    raise EncodeError(f"{table.name}: exact match field {info.name!r} is "
                                      "missing; every exact field needs a value")
            for name, value in self.match.items():
                fm = _encode_match(table.name, table.match_field(name), value)
                if fm is not None:
                    match.append(fm)
            if table.needs_priority and self.priority <= 0:
                raise EncodeError(f"{table.name} has range/ternary/optional fields: an entry "
                                  "needs priority >= 1 (higher wins)")
            if not table.needs_priority and self.priority:
                raise EncodeError(f"{table.name} has exact/lpm fields only: priority must be 0")
            priority = self.priority
        action: p4rt_codec.Action | None = None
        if self.action is not None:
            info = schema.action(self.action)
            schema.check_action_of(table, info)
            missing = [p.name for p in info.params if p.name not in self.params]
            if missing:
                raise EncodeError(f"action {info.name} needs parameter(s) {', '.join(missing)}")
            params = []
            for name, value in self.params.items():
                spec = info.param(name)
                params.append(p4rt_codec.Param(spec.id, encode_int(value, spec.bitwidth,
                                                             f"{info.name}({name})")))
            action = p4rt_codec.Action(info.id, tuple(params))
        elif self.params:
            raise EncodeError(f"{table.name}: parameters given without an action")
        return p4rt_codec.TableEntry(table.id, tuple(match), action, priority,
                               is_default_action=self.is_default)

    @classmethod
    def decode(cls, msg: p4r.Entity | p4r.TableEntry, schema: Schema) -> TableEntry:
        te = msg.table_entry if isinstance(msg, p4r.Entity) else msg
        table = schema.table_by_id(te.table_id)
        match: dict[str, MatchValue] = {}
        present = {fm.field_id: fm for fm in te.match}
        if not te.is_default_action:
            for info in table.match_fields:
                fm = present.pop(info.id, None)
                match[info.name] = _decode_match(table.name, info, fm)
            if present:
                raise SchemaError(f"{table.name} has no match field with id {min(present)}")
        action_name: str | None = None
        params: dict[str, int] = {}
        kind = te.action.WhichOneof("type")
        if kind == "action":
            action = schema.action_by_id(te.action.action.action_id)
            action_name = action.name
            for p in te.action.action.params:
                spec = action.param_by_id(p.param_id)
                params[spec.name] = decode_int(p.value, spec.bitwidth,
                                               f"{action.name}({spec.name})")
        elif kind is not None:
            raise SchemaError(f"{table.name}: action kind {kind} is not supported by HySync")
        return cls(table.name, match, action_name, params, te.priority, te.is_default_action)


def _encode_match(table: str, info: MatchFieldInfo,
                  value: MatchValue) -> p4rt_codec.FieldMatch | None:
    """The field's match, or None for a don't care (which P4Runtime requires omitted)."""
    what = f"{table} match field {info.name}"
    top = (1 << info.bitwidth) - 1
    if info.kind == "exact":
        if value is None or isinstance(value, tuple):
            raise EncodeError(f"{what} is an exact match: give one integer, got {value!r}")
        return p4rt_codec.FieldMatch(info.id, "exact", encode_int(value, info.bitwidth, what))
    if info.kind == "range":
        low, high = _pair(value, what, "(low, high)")
        if low > high:
            raise EncodeError(f"{what}: range low {low} is above high {high}")
        lo, hi = encode_int(low, info.bitwidth, what), encode_int(high, info.bitwidth, what)
        if (low, high) == (0, top):  # the full range is a don't care: omitted
            return None
        # Range bounds go padded to the field's width: PI (BMv2's P4Runtime server)
        # reads a canonical b"\xff" as all-ones of the field, i.e. a don't care, and
        # refuses slot range 0..255. Padding is valid P4Runtime for every server.
        width = (info.bitwidth + 7) // 8
        return p4rt_codec.FieldMatch(info.id, "range", lo.rjust(width, b"\0"),
                                     hi.rjust(width, b"\0"))
    if info.kind == "ternary":
        val, mask = _pair(value, what, "(value, mask)")
        if val & ~mask:
            raise EncodeError(f"{what}: value {val:#x} has bits outside mask {mask:#x}")
        v, m = encode_int(val, info.bitwidth, what), encode_int(mask, info.bitwidth, what)
        return p4rt_codec.FieldMatch(info.id, "ternary", v, m) if mask else None
    if info.kind == "lpm":
        val, plen = _pair(value, what, "(value, prefix_len)")
        if not 0 <= plen <= info.bitwidth:
            raise EncodeError(f"{what}: prefix length {plen} outside 0..{info.bitwidth}")
        v = encode_int(val, info.bitwidth, what)
        return p4rt_codec.FieldMatch(info.id, "lpm", v, prefix_len=plen) if plen else None
    if info.kind == "optional":
        if value is None:
            return None
        if isinstance(value, tuple):
            raise EncodeError(f"{what} is optional: give an integer or None")
        return p4rt_codec.FieldMatch(info.id, "optional", encode_int(value, info.bitwidth, what))
    raise SchemaError(f"{what} has match kind {info.kind}, which HySync does not encode")


def _pair(value: MatchValue, what: str, shape: str) -> tuple[int, int]:
    if not (isinstance(value, tuple) and len(value) == 2):
        raise EncodeError(f"{what} takes a pair {shape}, got {value!r}")
    return value


def _decode_match(table: str, info: MatchFieldInfo, fm: p4r.FieldMatch | None) -> MatchValue:
    what = f"{table} match field {info.name}"
    top = (1 << info.bitwidth) - 1
    if fm is None:
        if info.kind == "exact":
            raise SchemaError(f"{what}: the switch returned an entry without this exact field")
        return {"range": (0, top), "ternary": (0, 0), "lpm": (0, 0)}.get(info.kind)
    kind = fm.WhichOneof("field_match_type")
    if kind != info.kind:
        raise SchemaError(f"{what} is {info.kind} in the P4Info but the switch sent {kind}")
    if kind == "exact":
        return decode_int(fm.exact.value, info.bitwidth, what)
    if kind == "range":
        return (decode_int(fm.range.low, info.bitwidth, what),
                decode_int(fm.range.high, info.bitwidth, what))
    if kind == "ternary":
        return (decode_int(fm.ternary.value, info.bitwidth, what),
                decode_int(fm.ternary.mask, info.bitwidth, what))
    if kind == "lpm":
        return decode_int(fm.lpm.value, info.bitwidth, what), fm.lpm.prefix_len
    return decode_int(fm.optional.value, info.bitwidth, what)


# ------------------------------------------------------------ multicast
@dataclass(frozen=True, slots=True, order=True)
class Replica:
    port: int
    rid: int  # P4Runtime "instance": the egress_rid the packet copy carries


@dataclass(frozen=True, slots=True)
class MulticastGroup:
    """A multicast group of the packet replication engine. Replicas are kept sorted:
    P4Runtime treats them as a set, and so does equality here."""

    group_id: int
    replicas: tuple[Replica, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "replicas", tuple(sorted(set(self.replicas))))

    def encode(self, schema: Schema | None = None) -> p4r.Entity:
        return p4r.Entity.FromString(p4rt_codec.encode_entity(self.record(schema)))

    def record(self, schema: Schema | None = None) -> p4rt_codec.MulticastGroupEntry:
        if not 0 < self.group_id < 1 << 32:
            raise EncodeError(f"multicast group id {self.group_id} must be 1..2^32-1")
        for r in self.replicas:
            if not 0 <= r.port < 1 << 32 or not 0 <= r.rid < 1 << 32:
                raise EncodeError(f"group {self.group_id}: replica {r} out of 32-bit range")
        # egress_port (deprecated in 1.4 but what BMv2/PI and Stratum read).
        return p4rt_codec.MulticastGroupEntry(self.group_id, tuple(
            p4rt_codec.Replica(r.rid, egress_port=r.port) for r in self.replicas))

    @classmethod
    def decode(cls, msg: p4r.Entity | p4r.MulticastGroupEntry,
               schema: Schema | None = None) -> MulticastGroup:
        group = (msg.packet_replication_engine_entry.multicast_group_entry
                 if isinstance(msg, p4r.Entity) else msg)
        replicas = []
        for r in group.replicas:
            port = (int.from_bytes(r.port, "big") if r.WhichOneof("port_kind") == "port"
                    else r.egress_port)
            replicas.append(Replica(port, r.instance))
        return cls(group.multicast_group_id, tuple(replicas))

    def ports(self) -> set[int]:
        return {r.port for r in self.replicas}


# ------------------------------------------------------------ counters
@dataclass(frozen=True, slots=True)
class CounterCell:
    """One cell of an indexed counter array."""

    counter: str
    index: int
    packets: int = 0
    bytes: int = 0

    def encode(self, schema: Schema) -> p4r.Entity:
        return p4r.Entity.FromString(p4rt_codec.encode_entity(self.record(schema)))

    def record(self, schema: Schema) -> p4rt_codec.CounterEntry:
        info = schema.counter(self.counter)
        if not 0 <= self.index < info.size:
            raise EncodeError(f"counter {info.name} has cells 0..{info.size - 1}, "
                              f"not {self.index}")
        data = p4rt_codec.CounterData(self.bytes, self.packets)
        return p4rt_codec.CounterEntry(info.id, self.index, data)

    @classmethod
    def decode(cls, msg: p4r.Entity | p4r.CounterEntry, schema: Schema) -> CounterCell:
        entry = msg.counter_entry if isinstance(msg, p4r.Entity) else msg
        info = schema.counter_by_id(entry.counter_id)
        return cls(info.name, entry.index.index, entry.data.packet_count, entry.data.byte_count)


def counter_query(schema: Schema, counter: str, index: int | None = None) -> p4r.Entity:
    """A read request entity for one cell, or every cell when `index` is None."""
    info = schema.counter(counter)
    entity = p4r.Entity()
    entity.counter_entry.counter_id = info.id
    if index is not None:
        if not 0 <= index < info.size:
            raise EncodeError(f"counter {info.name} has cells 0..{info.size - 1}, not {index}")
        entity.counter_entry.index.index = index
    return entity


def table_query(schema: Schema, table: str) -> p4r.Entity:
    """A read request entity for every entry of one table."""
    entity = p4r.Entity()
    entity.table_entry.table_id = schema.table(table).id
    return entity


def groups_query() -> p4r.Entity:
    """A read request entity for every multicast group (id 0 is the wildcard)."""
    entity = p4r.Entity()
    entity.packet_replication_engine_entry.multicast_group_entry.multicast_group_id = 0
    return entity


Entity = TableEntry | MulticastGroup | CounterCell


# ------------------------------------------------------------ updates
class UpdateType(enum.Enum):
    INSERT = p4r.Update.INSERT
    MODIFY = p4r.Update.MODIFY
    DELETE = p4r.Update.DELETE


@dataclass(frozen=True, slots=True)
class Update:
    type: UpdateType
    entity: Entity

    def encode(self, schema: Schema) -> p4r.Update:
        return p4r.Update.FromString(p4rt_codec.encode_update(self.record(schema)))

    def record(self, schema: Schema) -> p4rt_codec.Update:
        """The update as the P4Runtime wire codec's record (what Switch.write sends)."""
        return p4rt_codec.Update(self.type.value, self.entity.record(schema))

    def __str__(self) -> str:
        return f"{self.type.name} {describe(self.entity)}"


def insert(entity: Entity) -> Update:
    return Update(UpdateType.INSERT, entity)


def modify(entity: Entity) -> Update:
    return Update(UpdateType.MODIFY, entity)


def delete(entity: Entity) -> Update:
    return Update(UpdateType.DELETE, entity)


def describe(entity: Entity) -> str:
    """A short human description, for error messages and logs."""
    if isinstance(entity, TableEntry):
        keys = {k[0]: k[1] for k in p4names.TABLE_KEYS.get(entity.table, ())}
        bits = {p[0]: p[1] for p in p4names.ACTION_PARAMS.get(entity.action, ())}
        match = ", ".join(f"{k}={_fmt(v, keys.get(k))}" for k, v in entity.match.items())
        params = ", ".join(f"{k}={_fmt(v, bits.get(k))}" for k, v in entity.params.items())
        prio = f" priority {entity.priority}" if entity.priority else ""
        return f"{entity.table}[{match}]{prio} -> {entity.action}({params})"
    if isinstance(entity, MulticastGroup):
        reps = ", ".join(f"port {r.port} rid {r.rid}" for r in entity.replicas)
        return f"multicast group {entity.group_id} [{reps}]"
    return f"{entity.counter}[{entity.index}]"


def _fmt(value: MatchValue, bits: int | None = None) -> str:
    if isinstance(value, tuple):
        return f"{value[0]}..{value[1]}"
    if bits == 48 and isinstance(value, int):  # a MAC address, as `ip link` prints it
        return wire.bytes_to_mac(value.to_bytes(6, "big"))
    return str(value)
