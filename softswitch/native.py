"""The native engine: the reference `Pipeline`'s control-plane half, its data path in C++.

`NativePipeline` is what `python -m hysync.softswitch` runs by default. It keeps the table
entries, multicast groups and default actions exactly where the reference model
keeps them (the P4Runtime server reads and validates against those), and after
every write — or once at the end of a `batch()`, so a P4Runtime write batch is
atomic with respect to packets — hands the compiled pipeline (native/dataplane/)
a whole new snapshot of them. Registers and counters live in the compiled
pipeline; `counters[name].packets[i]` reads them there. `process_datagram` and
`process_frame` run one packet in the caller's thread (tests, the conformance
suite); the data planes below run packets on threads of their own, GIL released.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Self

from hysync import _core, p4names, wire
from hysync.softswitch.pipeline import Pipeline
from hysync.softswitch.tables import Entry, Replica

_engine = _core.dataplane


class _Cells:
    """One side (packets or bytes) of a native counter, indexable like the model's list."""

    __slots__ = ("_engine", "_id", "_size", "_packets")

    def __init__(self, engine: _engine.Pipeline, counter_id: int, size: int,
                 packets: bool) -> None:
        self._engine, self._id, self._size, self._packets = engine, counter_id, size, packets

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[int]:
        return iter(self[:])

    def __getitem__(self, index: int | slice) -> int | list[int]:
        start, stop = self._range(index)
        values = self._engine.read_counter(self._id, start, stop)[0 if self._packets else 1]
        return values if isinstance(index, slice) else values[0]

    def __setitem__(self, index: int | slice, values: int | list[int]) -> None:
        start, stop = self._range(index)
        values = list(values) if isinstance(index, slice) else [values]  # type: ignore[arg-type]
        if self._packets:
            self._engine.write_counter(self._id, start, stop, values, None)
        else:
            self._engine.write_counter(self._id, start, stop, None, values)

    def _range(self, index: int | slice) -> tuple[int, int]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._size)
            if step != 1:
                raise IndexError("a native counter is read in contiguous ranges only")
            return start, max(start, stop)
        if index < 0:
            index += self._size
        if not 0 <= index < self._size:
            raise IndexError(f"counter index {index} is outside 0..{self._size - 1}")
        return index, index + 1


class NativeCounter:
    """A counter of the compiled pipeline, with the model's Counter interface."""

    __slots__ = ("name", "size", "packets", "bytes", "_engine", "_id")

    def __init__(self, engine: _engine.Pipeline, counter_id: int, name: str, size: int) -> None:
        self.name, self.size, self._engine, self._id = name, size, engine, counter_id
        self.packets = _Cells(engine, counter_id, size, packets=True)
        self.bytes = _Cells(engine, counter_id, size, packets=False)

    def count(self, index: int, nbytes: int) -> None:
        """One packet of `nbytes` in cell `index`, as the data plane counts it."""
        (packets,), (total,) = self._engine.read_counter(self._id, index, index + 1)
        self._engine.write_counter(self._id, index, index + 1, [packets + 1], [total + nbytes])

    def clear(self) -> None:
        self._engine.clear_counter(self._id)


class NativeRegister:
    """One register array of the compiled pipeline, indexed like the model's list of it
    (slot registers by slot, member_seq and member_epoch by slot * MAX_WORKERS + worker)."""

    __slots__ = ("_engine", "_name")

    def __init__(self, engine: _engine.Pipeline, name: str) -> None:
        self._engine, self._name = engine, name

    def __getitem__(self, index: int) -> int:
        return self._engine.read_register(self._name, index)

    def __setitem__(self, index: int, value: int) -> None:
        """member_seq and member_epoch only: the cells a P4Runtime register write sets."""
        self._engine.write_member_register(self._name, index, value)


def _register(name: str) -> property:
    return property(lambda self: NativeRegister(self.engine, name),
                    doc=f"The engine's `{name}` register, read cell by cell.")


class NativePipeline(Pipeline):
    """The model's tables, groups and write API; registers, counters and packets native."""

    # The registers the reference model keeps as lists, read from the engine (tests look
    # into them; the data plane never goes through these).
    slot_epoch = _register("slot_epoch")
    res_valid = _register("res_valid")
    round = _register("round")
    count = _register("count")
    bitmap = _register("bitmap")
    chunk = _register("chunk")
    mode = _register("mode")
    quorum = _register("quorum")
    res_bitmap = _register("res_bitmap")
    res_count = _register("res_count")
    res_chunk = _register("res_chunk")
    member_seq = _register("member_seq")
    member_epoch = _register("member_epoch")
    weight = _register("weight")
    up_pending = _register("up_pending")
    up_round = _register("up_round")
    up_bitmap = _register("up_bitmap")
    up_count = _register("up_count")
    up_chunk = _register("up_chunk")
    up_tx = _register("up_tx")

    def __init__(self, num_slots: int = wire.NUM_SLOTS) -> None:
        self.engine = _engine.Pipeline(num_slots)
        self._batch_depth = 0
        super().__init__(num_slots)
        self.counters = {name: NativeCounter(self.engine, i, name, counter.size)
                         for i, (name, counter) in enumerate(self.counters.items())}

    # The model's registers are the engine's; nothing to allocate in Python.
    def reset_registers(self) -> None:
        self.engine.reset_registers()

    def _rebuild_index(self, name: str) -> None:
        self._changed()

    def _changed(self) -> None:
        """A write outside a batch is published at once; inside one, when the batch ends."""
        if self._batch_depth == 0:
            self._publish()

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Several writes, then one snapshot: packets see all of them or none."""
        with self.lock:
            self._batch_depth += 1
            try:
                yield
            finally:
                self._batch_depth -= 1
                if self._batch_depth == 0:
                    self._publish()

    def write_group(self, update: str, group_id: int, replicas: list[Replica]) -> None:
        with self.lock:
            super().write_group(update, group_id, replicas)
            self._changed()

    def clear_tables(self) -> None:
        with self.batch():
            super().clear_tables()

    def replace(self, tables: dict[str, dict[Any, Entry]],
                groups: dict[int, list[Replica]] | None = None,
                defaults: dict[str, tuple[str, tuple[int, ...]]] | None = None) -> None:
        """The batch becomes one snapshot (packets run on it without the Python lock)."""
        with self.batch():
            self._swap(tables, groups, defaults)

    def _publish(self) -> None:
        """Hand the engine the current tables and groups, as one snapshot (and keep the
        model's lookup indexes in step, so that its helpers answer for this state too)."""
        for name in self.tables:
            super()._rebuild_index(name)
        entries = {name: list(table.entries.values()) for name, table in self.tables.items()}
        self.engine.set_tables(
            members=[e.match for e in entries[p4names.ADMISSION_MEMBERS]],
            jobs=[(e.match[0], *e.params) for e in entries[p4names.ADMISSION_JOBS]],
            modes=[(e.match[0], e.priority, *e.match[1], *e.params)  # type: ignore[misc]
                   for e in entries[p4names.SYNC_MODE_MODES]],
            l2=[(e.match[0], e.params[0]) for e in entries[p4names.FORWARDING_L2]],
            rewrites=[(e.match[0], *e.params) for e in entries[p4names.REPLICATION_REWRITE]],
            groups=[(gid, [(r.port, r.rid) for r in replicas])
                    for gid, replicas in self.groups.items()],
            roles=[(job, int(role.level), *((u.spine_addr, u.spine_mac, u.uplink_id, u.leaf_addr)
                                            if (u := role.uplink) else (0, 0, 0, 0)))
                   for job, role in self._roles.items()])

    # ------------------------------------------------------- one packet
    def process_datagram(self, src_ip: int, src_port: int,
                         payload: bytes) -> list[tuple[int, int, bytes]]:
        return self.engine.process_datagram(src_ip, src_port, payload)

    def process_frame(self, ingress_port: int, frame: bytes) -> list[tuple[int, bytes]]:
        return self.engine.process_frame(ingress_port, frame)


def default_threads() -> int:
    """Data-plane threads when none are asked for: one per core this process may use, to 8."""
    return max(1, min(8, len(os.sched_getaffinity(0))))


class _NativeServer:
    """start/stop and the packet totals of a native server, as ServingThread has them."""

    _server: _engine.UdpServer | _engine.RawServer

    def start(self) -> Self:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    @property
    def packets_in(self) -> int:
        return self._server.packets_in

    @property
    def packets_out(self) -> int:
        return self._server.packets_out


class NativeUdpDataPlane(_NativeServer):
    """`--udp HOST:PORT` on the native engine, with the UdpDataPlane's interface."""

    def __init__(self, pipeline: NativePipeline, host: str = "127.0.0.1", port: int = 0,
                 threads: int | None = None) -> None:
        self.threads = threads or default_threads()
        self._server = _engine.UdpServer(pipeline.engine, host, port, self.threads)
        self.address: tuple[str, int] = (host, self._server.port)


class NativeRawDataPlane(_NativeServer):
    """`-i PORT@IFACE ...` on the native engine, with the RawDataPlane's interface."""

    def __init__(self, pipeline: NativePipeline, ports: dict[int, str],
                 delays_ms: dict[int, float] | None = None) -> None:
        if not ports:
            raise ValueError("the raw data plane needs at least one PORT@IFACE")
        self.ports = dict(ports)
        self._server = _engine.RawServer(pipeline.engine, self.ports, dict(delays_ms or {}))
