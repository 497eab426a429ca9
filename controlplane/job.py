"""Jobs as data: a TOML job file, validated on load.

    job_id = 1                  # 1..255
    lanes = 64                  # must equal hysync.wire.LANES
    scale = 65536.0             # fixed-point scale of the quantizer, > 0
    mode = "sync"               # initial mode: sync | partial | async
    quorum = 3                  # partial only: 1..number of members

    [slots]
    base = 0                    # first slot of the job in the switch's pool
    count = 256                 # slots base .. base+count-1

    [[members]]                 # one table per worker
    worker = 0                  # 0..31, unique in the job
    ipv4 = "127.0.0.1"
    mac = "02:00:00:00:00:01"
    udp_port = 47001
    switch_port = 1

A job across switches (docs/protocol.md §11) names, for every member, the leaf it sits
behind (`leaf = "leaf-a"`, a switch of the inventory's `[[switches]]`); worker ids are then
unique per leaf (each leaf aggregates its own members), up to 32 per leaf and 255 in all.
Such a job starts in sync or partial: async is not offered across switches.

Every error is a `JobConfigError` whose message names the field and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hysync import wire
from hysync.controlplane.errors import JobConfigError
from hysync.controlplane.toml_fields import int_field, load_toml, no_unknown_keys, tables
from hysync.wire import Mode

MAX_SWITCH_PORT = 510  # 9-bit v1model port; 511 is BMv2's drop port
_TOP_KEYS = {"job_id", "lanes", "scale", "mode", "quorum", "slots", "members", "name"}
_SLOT_KEYS = {"base", "count"}
_MEMBER_KEYS = {"worker", "ipv4", "mac", "udp_port", "switch_port", "leaf"}
MAX_FABRIC_MEMBERS = 255  # a RESULT's count byte carries the hosts in a two-level sum
# A larger scale saturates every gradient a float32 can hold above its smallest normal
# (2^-126); the bound keeps inf and huge TOML integers out.
_MAX_SCALE = 2.0**126


@dataclass(frozen=True, slots=True, order=True)
class Member:
    worker: int
    ipv4: str
    mac: str
    udp_port: int
    switch_port: int

    @property
    def ip_int(self) -> int:
        return wire.ip_to_int(self.ipv4)

    @property
    def mac_int(self) -> int:
        return int.from_bytes(wire.mac_to_bytes(self.mac), "big")


@dataclass(frozen=True, slots=True)
class JobConfig:
    job_id: int
    members: tuple[Member, ...]
    slot_base: int
    slot_count: int
    lanes: int = wire.LANES
    scale: float = 65536.0
    mode: Mode = Mode.SYNC
    quorum: int = 0  # partial: 1..len(members); sync and async: 0
    name: str = ""
    leaves: tuple[str, ...] = ()  # across switches: the leaf of each member; () on one switch

    @property
    def spans_switches(self) -> bool:
        return bool(self.leaves)

    def leaf_names(self) -> tuple[str, ...]:
        """The leaves the job spans, in the order of their first member."""
        return tuple(dict.fromkeys(self.leaves))

    def on_leaf(self, leaf: str) -> JobConfig:
        """The part of a job across switches that `leaf` aggregates: its members."""
        members = tuple(m for m, lf in zip(self.members, self.leaves, strict=True) if lf == leaf)
        return JobConfig(self.job_id, members, self.slot_base, self.slot_count, self.lanes,
                         self.scale, self.mode, self.quorum, self.name)

    @property
    def slots(self) -> tuple[int, int]:
        """(first, last) slot, inclusive."""
        return self.slot_base, self.slot_base + self.slot_count - 1

    def member(self, worker: int) -> Member:
        for m in self.members:
            if m.worker == worker:
                return m
        raise KeyError(worker)

    @classmethod
    def load(cls, path: str | Path) -> JobConfig:
        return load_toml(Path(path), cls.from_dict, JobConfigError, "the job file",
                         "controlplane/examples/job-loopback.toml")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobConfig:
        no_unknown_keys(data, _TOP_KEYS, "the job file")
        job_id = int_field(data, "job_id", 1, wire.MAX_JOBS - 1, "a job id 1..255 (0 is reserved)")
        lanes = int_field(data, "lanes", None, None, f"{wire.LANES}", default=wire.LANES)
        if lanes != wire.LANES:
            raise JobConfigError(f"lanes = {lanes}: the switch aggregates exactly {wire.LANES} "
                                 f"lanes per packet; set lanes = {wire.LANES}")
        scale = data.get("scale", 65536.0)
        if isinstance(scale, bool) or not isinstance(scale, int | float) or not (
                0 < scale <= _MAX_SCALE):
            raise JobConfigError(f"scale = {scale!r}: the fixed-point scale must be a number "
                                 "> 0 and at most 2^126, e.g. scale = 65536.0")
        slots = data.get("slots")
        if not isinstance(slots, Mapping):
            raise JobConfigError("[slots] is missing: add a table `[slots]` with `base` and "
                                 "`count`, e.g. base = 0, count = 256")
        no_unknown_keys(slots, _SLOT_KEYS, "[slots]")
        base = int_field(slots, "base", 0, wire.NUM_SLOTS - 1, f"0..{wire.NUM_SLOTS - 1}",
                    field="slots.base")
        count = int_field(slots, "count", 1, wire.NUM_SLOTS, f"1..{wire.NUM_SLOTS}",
                     field="slots.count")
        if base + count > wire.NUM_SLOTS:
            raise JobConfigError(
                f"slots.base + slots.count = {base + count} exceeds the switch's "
                f"{wire.NUM_SLOTS} slots: lower slots.count to at most {wire.NUM_SLOTS - base}")
        raw_members = data.get("members")
        leaves: tuple[str, ...] = ()
        if isinstance(raw_members, list) and any(
                isinstance(m, Mapping) and "leaf" in m for m in raw_members):
            members, leaves = _fabric_members(raw_members)
            n = min(sum(1 for lf in leaves if lf == leaf) for leaf in set(leaves))
            n = min(n, len(set(leaves)))
            level_members = ("it starts every level: at most the leaves, and the hosts of "
                             "the smallest leaf")
        else:
            members = _members(raw_members)
            n = len(members)
            level_members = "the number of members"
        mode, quorum = _mode(data, n, level_members)
        if leaves and mode == Mode.ASYNC:
            raise JobConfigError("mode = \"async\" on a job across switches: async is not "
                                 "offered there (docs/protocol.md §11); use sync or partial")
        name = data.get("name", "")
        if not isinstance(name, str):
            raise JobConfigError(f"name = {name!r}: give a string, e.g. name = \"resnet\"")
        return cls(job_id, members, base, count, lanes, float(scale), mode, quorum, name,
                   leaves)


def _members(raw: Any) -> tuple[Member, ...]:
    if not isinstance(raw, list) or not raw:
        raise JobConfigError("members is missing or empty: add one [[members]] table per "
                             "worker with worker, ipv4, mac, udp_port, switch_port")
    if len(raw) > wire.MAX_WORKERS:
        raise JobConfigError(f"{len(raw)} members: a job has at most {wire.MAX_WORKERS} "
                             "(the contributor bitmap is 32 bits); split the job")
    members: list[Member] = []
    for where, item in tables(raw, "members", _MEMBER_KEYS, JobConfigError):
        worker = int_field(item, "worker", 0, wire.MAX_WORKERS - 1, "0..31",
                           field=f"{where}.worker")
        ipv4 = _str(item, "ipv4", where, 'e.g. ipv4 = "10.0.0.1"')
        try:
            wire.ip_to_int(ipv4)
        except ValueError as err:
            raise JobConfigError(f"{where}.ipv4: {err}") from None
        mac = _str(item, "mac", where, 'e.g. mac = "02:00:00:00:00:01"')
        try:
            if len(wire.mac_to_bytes(mac)) != 6:
                raise ValueError
        except ValueError:
            raise JobConfigError(f"{where}.mac = {mac!r}: give six hex bytes separated by ':', "
                                 'e.g. "02:00:00:00:00:01"') from None
        mac = wire.bytes_to_mac(wire.mac_to_bytes(mac))  # one spelling: lower case
        udp_port = int_field(item, "udp_port", 1, 65535, "1..65535", field=f"{where}.udp_port")
        switch_port = int_field(item, "switch_port", 0, MAX_SWITCH_PORT, f"0..{MAX_SWITCH_PORT}",
                           field=f"{where}.switch_port")
        members.append(Member(worker, ipv4, mac, udp_port, switch_port))
    _unique(members)
    return tuple(sorted(members))


def _fabric_members(raw: list[Any]) -> tuple[tuple[Member, ...], tuple[str, ...]]:
    """Members each behind a named leaf: worker ids unique per leaf, addresses over the
    job; sorted by leaf, then worker."""
    if len(raw) > MAX_FABRIC_MEMBERS:
        raise JobConfigError(f"{len(raw)} members: a job across switches has at most "
                             f"{MAX_FABRIC_MEMBERS} (a RESULT's count byte); split the job")
    by_leaf: dict[str, list[Any]] = {}
    for i, item in enumerate(raw):
        leaf = item.get("leaf") if isinstance(item, Mapping) else None
        if not isinstance(leaf, str) or not leaf:
            raise JobConfigError(f"members[{i}].leaf is missing: a job across switches names "
                                 "the leaf of every member (leaf = \"NAME\", a switch of the "
                                 "inventory)")
        by_leaf.setdefault(leaf, []).append({k: v for k, v in item.items() if k != "leaf"})
    pairs: list[tuple[str, Member]] = []
    for leaf, items in sorted(by_leaf.items()):
        try:
            pairs += [(leaf, m) for m in _members(items)]
        except JobConfigError as err:
            raise JobConfigError(f"behind leaf {leaf!r}: {err}") from None
    seen: dict[tuple[str, int], str] = {}
    for leaf, m in pairs:
        other = seen.get((m.ipv4, m.udp_port))
        if other is not None:
            raise JobConfigError(f"members behind leaves {other!r} and {leaf!r} share "
                                 f"{m.ipv4}:{m.udp_port}: give each worker its own UDP port")
        seen[(m.ipv4, m.udp_port)] = leaf
    return tuple(m for _, m in pairs), tuple(lf for lf, _ in pairs)


def _unique(members: list[Member]) -> None:
    seen_worker: dict[int, int] = {}
    seen_addr: dict[tuple[str, int], int] = {}
    port_of_mac: dict[str, tuple[int, int]] = {}
    for i, m in enumerate(members):
        if m.worker in seen_worker:
            raise JobConfigError(f"members[{i}].worker = {m.worker} is also members"
                                 f"[{seen_worker[m.worker]}].worker: worker ids must be unique")
        seen_worker[m.worker] = i
        if (m.ipv4, m.udp_port) in seen_addr:
            raise JobConfigError(
                f"members[{i}] has the same ipv4:udp_port {m.ipv4}:{m.udp_port} as members"
                f"[{seen_addr[(m.ipv4, m.udp_port)]}]: give each worker its own UDP port")
        seen_addr[(m.ipv4, m.udp_port)] = i
        other = port_of_mac.get(m.mac)
        if other is not None and other[0] != m.switch_port:
            raise JobConfigError(
                f"members[{i}].mac {m.mac} is on switch_port {m.switch_port} but members"
                f"[{other[1]}] puts the same MAC on switch_port {other[0]}: one host, one port")
        port_of_mac.setdefault(m.mac, (m.switch_port, i))


def _mode(data: Mapping[str, Any], n: int,
          members: str = "the number of members") -> tuple[Mode, int]:
    text = data.get("mode", "sync")
    names = {m.name.lower(): m for m in Mode}
    if not isinstance(text, str) or text.lower() not in names:
        raise JobConfigError(f"mode = {text!r}: choose one of sync, partial, async")
    mode = names[text.lower()]
    if mode != Mode.PARTIAL:
        quorum = data.get("quorum", 0)
        if isinstance(quorum, bool) or quorum != 0 or not isinstance(quorum, int):
            raise JobConfigError(f"quorum = {data['quorum']!r} is only for mode = \"partial\"; "
                                 f"remove it for mode = \"{text}\"")
        return mode, 0
    if "quorum" not in data:
        raise JobConfigError(f"mode = \"partial\" needs quorum = Q with 1 <= Q <= {n} "
                             f"({members})")
    quorum = int_field(data, "quorum", 1, n, f"1..{n} ({members})")
    return mode, quorum


def _str(table: Mapping[str, Any], key: str, where: str, hint: str) -> str:
    value = table.get(key)
    if not isinstance(value, str):
        raise JobConfigError(f"{where}.{key} is missing or not a string: {hint}")
    return value
