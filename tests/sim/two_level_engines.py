"""Real worker engines as the hosts behind 2-3 leaves and a spine (docs/protocol.md §11).

Every host is the worker engine (native/worker/, on its in-memory backend) making calls of
real gradients; every leaf and the spine is a softswitch pipeline (the reference one,
target `python`, or the native one, `native`) with its two-level role, wired by
tests/softswitch/two_level_fabric.py. A simulated clock and network carry the datagrams:
loss, duplication and reordering on the host links and on the uplinks, mode swaps between
sync and partial(q) at either level, a slow rack and a slow host, each drawn from the seed,
so a seed replays exactly.

The checker holds §10's one-level invariants across both levels (§11, "Invariants, two
levels"):

* exactly-once: every host's gradients, in fixed point, equal what the spine's results hold
  of its contributions (those the leaf counted into a sum the spine counted) plus what it
  still holds (its residual, and packets in flight that no spine result holds);
* agreement: every result a host applied is the spine's result of that round (chunk, count,
  mode and lanes), applied once; a relayed result's bit for a host is set only where its
  contribution is in the sum at both levels;
* divisor: a spine result's count is the number of hosts in its sum, over the leaves it
  counted; every leaf's uplink is the exact sum of what the leaf counted;
* and no call fails (no switch restarts, no deaths are drawn), each one ends, save by §10's
  end_behind, held no wider than its cause: at the failure the spine's open round cannot
  close with the racks that can still send, for the rounds it needs wait on hosts that made
  their last call and hold nothing in flight.

Apart from the drawn seeds, `fairness` runs fair races (equal-pace racks, the spine in
partial(1), no faults) and checks that no leaf is left out of every spine round while its
hosts are calling.

A host past its last call keeps its flights retrying until each is settled, as
`Transport.finish` does (§11, "What a host does"); `drain=False` takes that rule out.

    python -m tests.sim.two_level_engines --seeds 2000 [--start 0] [--target native] [--out F]
    python -m tests.sim.two_level_engines --seed 17 --trace    # replay one seed, every packet
    python -m tests.sim.two_level_engines --fair 20 [--start 0]  # spine rounds per leaf, fair races
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hysync import _core, p4names, wire
from hysync.wire import Flag, Mode, Op
from hysync.worker.config import engine_config
from tests.softswitch.two_level_fabric import JOB, SPINE, Fabric

from .plan import JOIN_AFTER, LIVENESS_BOUND, MISSED_AFTER, RTO_INITIAL, RTO_MIN, SCALE, STALL_AFTER
from .seed_sweep import sweep_seeds

H = wire.HEADER_BYTES
DONE, PENDING = 0, 3
STATUS = {0: "done", 1: "unreachable", 4: "reset"}
QUIESCE = 2.0           # simulated seconds the engines keep ticking after the last call
DRAIN_TICK = 0.01       # simulated seconds between two turns of a host past its last call
MAX_EVENTS = 2_000_000  # a run past this many events is reported as a hang
RESULTS = Path("bench/results/simulate-two-level-engines.json")
TARGETS = {"python": "softswitch reference pipeline (softswitch/pipeline.py)",
           "native": "softswitch native pipeline (native/dataplane/, softswitch/native.py)"}


@dataclass(frozen=True)
class Link:
    loss: float = 0.0
    dup: float = 0.0
    delay: float = 0.0005
    jitter: float = 0.0  # up to this much more per packet: packets overtake each other


@dataclass(frozen=True)
class Swap:
    at: float
    level: object  # SPINE or ("leaf", i)
    mode: int
    quorum: int


@dataclass(frozen=True)
class Draw:
    """One run, drawn from its seed."""
    seed: int
    leaves: int
    hosts: int                 # per leaf
    sizes: tuple[int, ...]     # elements per key
    calls: int                 # per key, per host
    host_link: Link            # host <-> leaf, both ways
    uplink: Link               # leaf <-> spine, both ways
    modes: tuple[tuple[object, int, int], ...]  # (level, mode, quorum) at the start
    swaps: tuple[Swap, ...]
    compute: float             # seconds between two calls of a host, at most
    slow_rack: int             # this leaf's hosts compute slow_factor times longer (-1: none)
    slow_host: tuple[int, int]  # this host does ((-1, -1): none)
    slow_factor: float
    lossy_until: float         # no loss, duplication or jitter after this
    rto_max: float = 0.5
    dead_after: float = 3.0

    @property
    def faults_end(self) -> float:
        return max((s.at for s in self.swaps), default=0.0)


def _mode(rng: random.Random, members: int) -> tuple[int, int]:
    if rng.random() < 0.5:
        return int(Mode.SYNC), 0
    return int(Mode.PARTIAL), rng.randint(1, members)


def _link(rng: random.Random) -> Link:
    if rng.random() < 0.2:
        return Link()
    return Link(loss=rng.uniform(0, 0.15), dup=rng.uniform(0, 0.05) if rng.random() < 0.5
                else 0.0, jitter=rng.choice((0.0, 0.0005, 0.002)))


def draw(seed: int) -> Draw:
    rng = random.Random(seed * 7_919 + 3)
    leaves, hosts = rng.randint(2, 3), rng.randint(1, 3)
    levels: list[object] = [SPINE, *(("leaf", i) for i in range(leaves))]
    members = {SPINE: leaves, **{("leaf", i): hosts for i in range(leaves)}}
    lossy_until = rng.uniform(0.1, 0.6)
    swaps = tuple(sorted(
        (Swap(rng.uniform(0, lossy_until), lv, *_mode(rng, members[lv]))
         for lv in (rng.choice(levels) for _ in range(rng.randint(0, 6)))),
        key=lambda s: s.at))
    slow_rack = rng.randrange(leaves) if rng.random() < 0.25 else -1
    slow_host = (rng.randrange(leaves), rng.randrange(hosts)) if rng.random() < 0.25 \
        else (-1, -1)
    return Draw(
        seed=seed, leaves=leaves, hosts=hosts,
        sizes=tuple(rng.randint(1, 3 * wire.LANES) for _ in range(rng.randint(1, 2))),
        calls=rng.randint(2, 5), host_link=_link(rng), uplink=_link(rng),
        modes=tuple((lv, *_mode(rng, members[lv])) for lv in levels), swaps=swaps,
        compute=0.002, slow_rack=slow_rack, slow_host=slow_host,
        slow_factor=rng.uniform(5, 30), lossy_until=lossy_until)


@dataclass
class Part:
    """A host's contribution a leaf counted into its round."""
    host: int
    chunk: int
    lanes: np.ndarray  # int64, the datagram's lanes


@dataclass
class Host:
    leaf: int
    h: int
    engine: Any
    keys: list[str]
    firsts: list[int]
    grads: list[np.ndarray]  # per key: every gradient given, in fixed point (int64)
    calls: list[tuple[float, float, str]] = field(default_factory=list)  # (start, end, status)
    values: np.ndarray | None = None
    inbox: list[bytes] = field(default_factory=list)
    in_call: bool = False
    finished: bool = False
    draining: bool = False  # made its last call, its flights still retrying (§11)
    # call index -> what the spine's open round waited on when the call failed ("" where only
    # on racks whose own rounds wait on hosts that made their last call)
    stalled: dict[int, str] = field(default_factory=dict)
    gen: int = 0
    results: list[bytes] = field(default_factory=list)  # the header of every result applied

    @property
    def label(self) -> tuple[str, int, int]:
        return ("host", self.leaf, self.h)


class TwoLevelSim:
    """`faults` takes rules out of the hosts' engines (`hysync._core.worker.Faults`'s fields
    set true): how the mutation test takes the RELAYED rule out. `drain` False takes out the
    host's rule of keeping its flights retrying after its last call (§11, "What a host does")."""

    def __init__(self, d: Draw, target: str = "native", faults: dict[str, bool] | None = None,
                 trace: Callable[[str], None] | None = None,
                 engine: dict[str, Any] | None = None, drain: bool = True) -> None:
        if target not in TARGETS:
            raise ValueError(f"unknown target {target!r}: python or native")
        self.d, self.target, self.trace, self.drain = d, target, trace, drain
        self.quiescing = False
        self.engine_options = {"behind_leaf": True, **(engine or {})}
        self.fabric = Fabric(d.leaves, d.hosts, engine=target)
        self.desired: dict[object, tuple[int, int]] = {}  # level -> (mode, quorum) set last
        for level, mode, quorum in d.modes:
            self.fabric.set_mode(level, Mode(mode), quorum)
            self.desired[level] = (mode, quorum)
        self.faults = _core.worker.Faults()
        for name, on in (faults or {}).items():
            if not hasattr(self.faults, name):
                raise TypeError(f"no fault {name!r} (see native/worker/faults.h)")
            setattr(self.faults, name, on)
        self.rng = random.Random(d.seed * 1_000_003 + 29)
        self.grad_rng = np.random.default_rng(d.seed)
        self.events: list[tuple[float, int, Callable[..., None], tuple]] = []
        self.seq = 0
        self.now = 0.0
        self.last_arrival: dict[tuple[object, object], float] = {}
        self.hosts = [self._host(i, h) for i in range(d.leaves) for h in range(d.hosts)]
        self.by_label = {hs.label: hs for hs in self.hosts}
        # what the switches did: (leaf, round) -> parts counted; round -> leaves the spine
        # counted; round -> the spine's result (chunk, count, bitmap, mode, lanes bytes)
        self.parts: dict[tuple[int, int], list[Part]] = {}
        self.spine_counted: dict[int, set[int]] = {}
        self.spine_results: dict[int, tuple[int, int, int, int, bytes]] = {}
        self.spine_closed_at: dict[int, float] = {}  # round -> when the spine closed it
        self.told_counted: list[tuple[int, int, int]] = []  # (leaf, host, round) of bits set
        # (leaf, part) counted at a leaf whose round was then taken back open: in no sum
        self.withdrawn: list[tuple[int, Part]] = []
        self.leaf_past_spine: set[int] = set()  # leaves that sent a sum ahead of the spine
        self.violations: list[str] = []
        self.stats: Counter = Counter()

    # ------------------------------------------------------------ hosts
    def _host(self, leaf: int, h: int) -> Host:
        d = self.d
        config = engine_config(
            job_id=JOB, worker_id=h, switch_ip=f"10.1.{leaf}.1",
            switch_port=wire.HYSYNC_UDP_PORT, slot_base=0, slot_count=1,
            members=d.leaves * d.hosts, scale=SCALE, rto_initial=RTO_INITIAL, rto_min=RTO_MIN,
            rto_max=d.rto_max, dead_after=d.dead_after, stall_after=STALL_AFTER,
            missed_after=MISSED_AFTER, join_after=JOIN_AFTER, staleness_decay=1.0,
            seed=d.seed * 64 + leaf * 8 + h, install_tag=wire.install_tag(self.fabric.epoch),
            **self.engine_options)
        engine = _core.worker.Engine(config, faults=self.faults)
        keys = [f"key{k}" for k in range(len(d.sizes))]
        for key, n in zip(keys, d.sizes, strict=True):
            engine.register(key, n)
        return Host(leaf, h, engine, keys, [engine.first_chunk(k) for k in keys],
                    [np.zeros(-(-n // wire.LANES) * wire.LANES, np.int64) for n in d.sizes])

    def _compute(self, hs: Host) -> float:
        d = self.d
        slow = hs.leaf == d.slow_rack or (hs.leaf, hs.h) == d.slow_host
        return d.compute * (d.slow_factor if slow else 1.0)

    def _say(self, text: str) -> None:
        if self.trace is not None:
            self.trace(f"{self.now:10.6f} {text}")

    @staticmethod
    def describe(data: bytes) -> str:
        h = wire.Header.unpack(data)
        flags = [f.name for f in Flag if f.value and f.value & h.flags and not (
            h.op == Op.RESYNC and f is Flag.RETRANSMIT) and not (
            h.op != Op.RESYNC and f is Flag.RELAYED)]
        tx = (h.flags & wire.TX_MASK) >> wire.TX_SHIFT
        return (f"{Op(h.op).name} w{h.worker_id} round {h.round} chunk {h.chunk} "
                f"mode {h.mode}/q{h.quorum} tx {tx} count {h.count} bitmap {h.bitmap:#x}"
                f"{' reason ' + str(h.reason) if h.op == Op.RESYNC else ''}"
                f"{' ' + '|'.join(flags) if flags else ''}")

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, fn, args))

    def run(self) -> list[str]:
        for hs in self.hosts:
            self.at(self.rng.uniform(0, self._compute(hs)), self._next_call, hs)
        for s in self.d.swaps:
            self.at(s.at, self._swap, s)
        events = 0
        while self.events:
            self.now, _, fn, args = heapq.heappop(self.events)
            fn(*args)
            events += 1
            if events > MAX_EVENTS:
                self.violations.append(f"liveness: more than {MAX_EVENTS} events by "
                                       f"t={self.now:.3f} s")
                break
        self.stats["sim_seconds"] = round(self.now, 3)
        self.stats["leaves_past_spine"] = len(self.leaf_past_spine)
        return self.check()

    def _swap(self, s: Swap) -> None:
        self._say(f"swap {s.level} to mode {s.mode} quorum {s.quorum}")
        self.stats["swaps"] += 1
        self.fabric.set_mode(s.level, Mode(s.mode), s.quorum)
        self.desired[s.level] = (s.mode, s.quorum)

    def _next_call(self, hs: Host) -> None:
        d = self.d
        if len(hs.calls) == d.calls * len(d.sizes):
            hs.finished = True
            if all(x.finished for x in self.hosts):
                self.quiescing = True
                self.at(self.now, self._quiesce, max(self.now, d.lossy_until) + QUIESCE)
            elif self.drain and hs.engine.in_flight:
                self.stats["hosts_draining"] += 1
                self._drain(hs)
            return
        k = len(hs.calls) % len(d.sizes)
        # Whole multiples of 1/scale, small: float32 holds every sum exactly, so the
        # fixed-point books balance bit for bit.
        fixed = self.grad_rng.integers(-1000, 1001, d.sizes[k])
        hs.grads[k][:d.sizes[k]] += fixed
        hs.values = (fixed / SCALE).astype(np.float32)
        hs.calls.append((self.now, -1.0, ""))
        self._say(f"host {hs.leaf}.{hs.h} call {len(hs.calls) - 1} (key {k}) starts")
        e = hs.engine
        e.set_time(self.now)
        for data in hs.inbox:
            self._hand(hs, data)
        hs.inbox.clear()
        e.begin_call(hs.keys[k], hs.values)
        hs.in_call = True
        self.at(max(self.now, d.faults_end, d.lossy_until) + LIVENESS_BOUND, self._deadline,
                hs, len(hs.calls) - 1)
        self._turn(hs)

    def _turn(self, hs: Host) -> None:
        e = hs.engine
        e.set_time(self.now)
        status = e.step(self.now)
        self._sent(hs)
        if status == PENDING:
            hs.gen += 1
            wake = e.next_wake()
            if wake != float("inf"):
                self.at(max(self.now, wake), self._wake, hs, hs.gen)
            return
        start, _, _ = hs.calls[-1]
        hs.calls[-1] = (start, self.now, STATUS.get(status, str(status)))
        if hs.calls[-1][2] != "done":
            hs.stalled[len(hs.calls) - 1] = self._spine_waits_on()
        self._say(f"host {hs.leaf}.{hs.h} call {len(hs.calls) - 1} {hs.calls[-1][2]}")
        hs.in_call = False
        self._take_results(hs)
        hs.values = None
        self.at(self.now + self.rng.uniform(0, self._compute(hs)), self._next_call, hs)

    def _wake(self, hs: Host, gen: int) -> None:
        if gen == hs.gen and hs.in_call:
            self._turn(hs)

    def _deadline(self, hs: Host, index: int) -> None:
        if hs.calls[index][1] < 0:
            self.violations.append(
                f"liveness: host {hs.leaf}.{hs.h} call {index} started at "
                f"{hs.calls[index][0]:.3f} s has not ended at {self.now:.3f} s: "
                f"{hs.engine.describe_flights()}")

    def _take_results(self, hs: Host, last: bool = False) -> None:
        """The headers of the results the engine applied since it was last asked; `last`:
        its counters too (they count from the engine's start)."""
        stats = hs.engine.stats()
        raw = bytes(stats["results"])
        hs.results += [raw[i:i + H] for i in range(0, len(raw), H)]
        if last:
            for name in ("relayed", "retransmits", "carried", "included", "stray_replies"):
                self.stats[f"host_{name}"] += stats[name]

    def _hand(self, hs: Host, data: bytes) -> None:
        hs.engine.on_datagram(data, self.now, self.now)

    def _deliver(self, hs: Host, data: bytes) -> None:
        if self.trace is not None:
            self._say(f"host {hs.leaf}.{hs.h} <- {self.describe(data)}"
                      f"{'' if hs.in_call or hs.draining else ' (queued)'}")
        if hs.draining and not self.quiescing:
            hs.engine.set_time(self.now)
            self._hand(hs, data)
            self._drain(hs)
            return
        if not hs.in_call:
            hs.inbox.append(data)
            return
        hs.engine.set_time(self.now)
        self._hand(hs, data)
        self._turn(hs)

    def _sent(self, hs: Host) -> None:
        for data in hs.engine.take_sent():
            self.stats["host_packets"] += 1
            if self.trace is not None:
                self._say(f"host {hs.leaf}.{hs.h} -> {self.describe(data)}")
            self._send(hs.label, ("leaf", hs.leaf), data)

    def _poll(self, hs: Host) -> None:
        """What poll_results does between a host's calls: hand it what arrived, let its
        timers fire, send what it wrote."""
        hs.engine.set_time(self.now)
        for data in hs.inbox:
            self._hand(hs, data)
        hs.inbox.clear()
        hs.engine.tick(self.now)
        self._sent(hs)

    def _drain(self, hs: Host, gen: int | None = None) -> None:
        """A host past its last call keeps its flights retrying until each is settled, as
        `Transport.finish` does (§11, "What a host does"): a leaf's pending sum and its held
        close move only on its hosts' packets. Until every host has finished; the quiesce
        ticks everyone after that."""
        if self.quiescing or gen is not None and gen != hs.gen:
            return
        self._poll(hs)
        hs.gen += 1
        hs.draining = hs.engine.in_flight > 0
        if hs.draining:  # poll_results' pace: timers fall due between its reads
            self.at(self.now + DRAIN_TICK, self._drain, hs, hs.gen)

    def _quiesce(self, end: float) -> None:
        """Between calls a host's packets in flight keep retrying (poll_results)."""
        for hs in self.hosts:
            self._poll(hs)
        if self.now < end:
            self.at(self.now + 0.01, self._quiesce, end)
        else:
            self.events.clear()
            for hs in self.hosts:
                self._take_results(hs, last=True)

    # ------------------------------------------------------------ the network
    def _send(self, src: object, dst: object, data: bytes) -> None:
        uplink = src[0] != "host" and dst[0] != "host"  # type: ignore[index]
        link = self.d.uplink if uplink else self.d.host_link
        lossy = self.now < self.d.lossy_until
        if lossy and self.rng.random() < link.loss:
            self.stats["lost"] += 1
            self._say(f"lost {src} -> {dst}: {self.describe(data)}")
            return
        copies = 2 if lossy and self.rng.random() < link.dup else 1
        self.stats["duplicated"] += copies - 1
        for _ in range(copies):
            t = self.now + link.delay + (self.rng.uniform(0, link.jitter) if lossy else 0.0)
            # A leaf's uplinks of a slot stay in order: the spine's slot may run partial
            # (docs/protocol.md §11, "Faults").
            if dst == SPINE:
                t = max(t, self.last_arrival.get((src, dst), 0.0))
                self.last_arrival[(src, dst)] = t
            if dst[0] == "host":  # type: ignore[index]
                self.at(t, self._deliver, self.by_label[dst], data)
            else:
                self.at(t, self._switch, src, dst, data)

    def _counted(self, level: object, member: int) -> int:
        p = self.fabric.pipeline(level)
        return p.counters[p4names.STATS_CONTRIBUTIONS].packets[JOB * wire.MAX_WORKERS + member]

    def _switch(self, src: object, dst: object, data: bytes) -> None:
        h = wire.Header.unpack(data)
        member = h.worker_id
        before = self._counted(dst, member) if h.op == Op.CONTRIB else 0
        verdict_at_leaf = src == SPINE and dst != SPINE
        was = self.fabric.pipeline(dst).round[0] if verdict_at_leaf else 0
        out = self.fabric.deliver(src, dst, data)
        if verdict_at_leaf and self.fabric.pipeline(dst).round[0] == (was - 1) & 0xFFFFFFFF:
            # The leaf took round was - 1 back open (§11, the leaf, step 5): the sum the spine
            # refused there and what it held open at `was` are in no sum that goes up.
            self.stats["leaf_steps_back"] += 1
            for rnd in (was, (was - 1) & 0xFFFFFFFF):
                leaf = dst[1]  # type: ignore[index]
                self.withdrawn += [(leaf, p) for p in self.parts.pop((leaf, rnd), [])]
        self.stats["switch_packets"] += 1
        counted = h.op == Op.CONTRIB and self._counted(dst, member) != before
        if self.trace is not None:
            self._say(f"{dst} <- {src}: {self.describe(data)}"
                      f"{' (counted)' if counted else ''}")
        if counted and dst == SPINE:
            self.spine_counted.setdefault(h.round, set()).add(member)
            parts = self.parts.get((src[1], h.round), [])  # type: ignore[index]
            total = sum((p.lanes for p in parts), np.zeros(wire.LANES, np.int64))
            if h.count != len(parts) or not _same(data, total):
                self.violations.append(
                    f"divisor: the spine counted {src}'s sum of round {h.round} as {h.count} "
                    f"hosts, the leaf counted {len(parts)}"
                    f"{'' if _same(data, total) else ', other lanes'}")
        elif counted:
            self.parts.setdefault((dst[1], h.round), []).append(  # type: ignore[index]
                Part(member, h.chunk, _lanes(data)))
        for to, reply in out:
            if self.trace is not None:
                self._say(f"{dst} -> {to}: {self.describe(reply)}")
            self._observe(dst, to, reply, h.round if h.op == Op.CONTRIB else None)
            self._send(dst, to, reply)

    def _observe(self, src: object, dst: object, data: bytes,
                 trigger_round: int | None = None) -> None:
        """What a switch sent, held against what the switches counted."""
        h = wire.Header.unpack(data)
        if src != SPINE and dst == SPINE:  # an uplink (checked where the spine counts it)
            self.stats["uplinks"] += 1
            return
        if h.op == Op.RESYNC and src == SPINE:
            self.stats[f"spine_{wire.ResyncReason(h.reason).name.lower()}"] += 1
            if h.reason == wire.ResyncReason.STALE_ROUND and trigger_round is not None and \
                    _serial_after(trigger_round, h.round):
                # A leaf's sum for a round the spine has not reached: the leaf moved past
                # a round the spine still waits on.
                self.leaf_past_spine.add(dst[1])  # type: ignore[index]
        if h.op != Op.RESULT:
            if h.op == Op.RESYNC and h.flags & Flag.RELAYED and dst[0] == "host":  # type: ignore[index]
                self.stats["relayed_resyncs"] += 1
            return
        if src == SPINE and not h.flags & Flag.RESEND and h.round not in self.spine_results:
            self._spine_closed(h, data)
        kept = self.spine_results.get(h.round)
        if kept is None:
            self.violations.append(f"agreement: {src} sent a result of round {h.round}, "
                                   f"which the spine never closed")
            return
        if (h.chunk, h.count, h.mode) != kept[:2] + kept[3:4] or data[H:] != kept[4]:
            self.violations.append(
                f"agreement: {src} sent {dst} round {h.round} chunk {h.chunk} count {h.count}"
                f" mode {h.mode}, the spine's result was chunk {kept[0]} count {kept[1]} mode "
                f"{kept[3]}{'' if data[H:] == kept[4] else ', other lanes'}")
        if dst[0] == "host":  # type: ignore[index]
            self.stats["results_to_hosts"] += 1
            leaf = dst[1]  # type: ignore[index]
            for b in range(wire.MAX_WORKERS):
                if h.bitmap >> b & 1:
                    self.told_counted.append((leaf, b, h.round))

    def _spine_closed(self, h: wire.Header, data: bytes) -> None:
        """A spine result: its sum is the leaves' sums it counted, its count their hosts."""
        self.spine_results[h.round] = (h.chunk, h.count, h.bitmap, h.mode, data[H:])
        self.spine_closed_at[h.round] = self.now
        self.stats["spine_results"] += 1
        leaves = self.spine_counted.get(h.round, set())
        parts = [p for i in leaves for p in self.parts.get((i, h.round), [])]
        bits = sum(1 << i for i in leaves)
        if bits != h.bitmap or len(parts) != h.count or \
                not _same(data, sum((p.lanes for p in parts), np.zeros(wire.LANES, np.int64))):
            self.violations.append(
                f"divisor: spine round {h.round} closed with bitmap {h.bitmap:#x} count "
                f"{h.count}, but the leaves counted bitmap {bits:#x} ({len(parts)} hosts)")
        for p in parts:
            if p.chunk != h.chunk:
                self.violations.append(
                    f"exactly-once: spine round {h.round} (chunk {h.chunk}) holds a host's "
                    f"contribution for chunk {p.chunk}")

    # ------------------------------------------------------------ the checker
    def _quorum(self, level: object, members: int) -> int:
        """How many members the level's open round needs: its latched mode while it holds a
        contribution, the mode set last before its next latch."""
        p = self.fabric.pipeline(level)
        mode, quorum = (p.mode[0], p.quorum[0]) if p.count[0] else self.desired[level]
        return members if mode != Mode.PARTIAL or quorum == 0 else min(quorum, members)

    def _spine_waits_on(self) -> str:
        """What the spine's open round waits on, leaf by leaf, where the racks it can still hear
        from are enough to close it; "" where they are not: the rounds it needs wait on hosts
        that made their last call and hold nothing in flight (§10's end_behind, two levels)."""
        spine = self.fabric.pipeline(SPINE)
        rnd, counted = spine.round[0], spine.bitmap[0]
        live = []
        for i in range(self.d.leaves):
            if counted >> i & 1:
                continue
            leaf = self.fabric.pipeline(("leaf", i))
            hosts = [x for x in self.hosts if x.leaf == i]
            able = sum(1 for x in hosts if not leaf.bitmap[0] >> x.h & 1 and (
                not x.finished or x.engine.in_flight))
            at = leaf.round[0]
            if leaf.up_pending[0]:
                live.append(f"leaf {i} pending round {leaf.up_round[0]}")
            elif _serial_after(at, rnd):
                live.append(f"leaf {i} at round {at}")
            elif leaf.count[0] >= self._quorum(("leaf", i), self.d.hosts):
                live.append(f"leaf {i} holds round {at} at its quorum, closing on a host's "
                            f"next packet")
            elif leaf.count[0] + able >= self._quorum(("leaf", i), self.d.hosts):
                # (a round behind the spine's closes as any round does, and the spine's
                # STALE reply to its sum takes the leaf to the spine's round)
                live.append(f"leaf {i} round {at} with {leaf.count[0]} hosts counted, "
                            f"{able} to come")
        need = self._quorum(SPINE, self.d.leaves)
        if bin(counted).count("1") + len(live) < need:
            return ""
        return f"spine round {rnd} waits on " + "; ".join(live)

    def check(self) -> list[str]:
        out = list(self.violations)
        total = self.d.calls * len(self.d.sizes)
        finished = [x.calls[-1][1] for x in self.hosts if x.finished]
        for hs in self.hosts:
            failed = [(i, c) for i, c in enumerate(hs.calls) if c[2] not in ("done", "")]
            for i, (start, end, status) in failed:
                # (rule end_behind of §10 at two levels: the spine's open round cannot close
                # with the racks it can still hear from, because the rounds it needs wait on
                # hosts that made their last call)
                # (not where a leaf moved past a round the spine waits on: that round
                # cannot close whoever is left)
                if status == "unreachable" and any(t <= end for t in finished) and \
                        not hs.stalled[i] and not self.leaf_past_spine:
                    self.stats["excused_end_behind"] += 1
                    continue
                out.append(f"failure: host {hs.leaf}.{hs.h} call {i} (started {start:.3f} s) "
                           f"ended {status!r} at {end:.3f} s: no switch restarted "
                           f"({hs.engine.reset_why or 'silence'})"
                           f"{'; ' + hs.stalled[i] if hs.stalled[i] else ''}"
                           f"{'; a leaf moved past a spine round' if self.leaf_past_spine else ''}")
                break
            if len(hs.calls) < total:
                out.append(f"liveness: host {hs.leaf}.{hs.h} made {len(hs.calls)} of {total} "
                           f"calls")
            out += self._exactly_once(hs) + self._agreement(hs)
        for leaf, host, rnd in self.told_counted:
            if leaf not in self.spine_counted.get(rnd, ()) or not any(
                    p.host == host for p in self.parts.get((leaf, rnd), ())):
                out.append(f"exactly-once: host {leaf}.{host} was told its contribution is in "
                           f"round {rnd}, which holds none of it at both levels")
                break
        return out

    def _in_results(self, hs: Host) -> dict[int, np.ndarray]:
        """chunk -> the host's contributions that a spine result holds."""
        held: dict[int, np.ndarray] = {}
        for rnd in self.spine_results:
            if hs.leaf not in self.spine_counted.get(rnd, ()):
                continue
            for p in self.parts.get((hs.leaf, rnd), ()):
                if p.host == hs.h:
                    held[p.chunk] = held.get(p.chunk, 0) + p.lanes
        return held

    def _exactly_once(self, hs: Host) -> list[str]:
        in_results = self._in_results(hs)
        counted = {(p.chunk, p.lanes.tobytes()) for rnd in self.spine_results
                   if hs.leaf in self.spine_counted.get(rnd, ())
                   for p in self.parts.get((hs.leaf, rnd), ()) if p.host == hs.h}
        pending: dict[int, np.ndarray] = {}  # in flight, in no spine result
        for _slot, data, amount in hs.engine.flights():
            chunk = int.from_bytes(data[wire.FIELD_OFFSET["chunk"]:][:4], "big")
            if (chunk, _lanes(data).tobytes()) in counted:
                continue
            lanes = _lanes(data) if amount is None else \
                np.rint(np.asarray(amount, np.float64) * SCALE).astype(np.int64)
            pending[chunk] = pending.get(chunk, 0) + lanes
        unknown: dict[int, np.ndarray] = {}  # chunk -> |lanes| of all it had counted
        every = [(leaf, p) for (leaf, _rnd), parts in self.parts.items() for p in parts]
        for leaf, p in every + self.withdrawn:
            if leaf == hs.leaf and p.host == hs.h:
                unknown[p.chunk] = unknown.get(p.chunk, 0) + np.abs(p.lanes)
        out = []
        for k, first in enumerate(hs.firsts):
            res = np.asarray(hs.engine.residual(hs.keys[k]), np.float64) * SCALE
            if not np.array_equal(res, np.rint(res)):
                out.append(f"exactly-once: host {hs.leaf}.{hs.h} key {k}: residual not in "
                           f"fixed point")
                continue
            res = res.astype(np.int64)
            given = hs.grads[k]
            for local in range(len(given) // wire.LANES):
                chunk, rows = first + local, slice(local * wire.LANES, (local + 1) * wire.LANES)
                diff = given[rows] - in_results.get(chunk, 0) - res[rows] - pending.get(chunk, 0)
                # (rule unknown_fate of §10: a call that failed carried what it had in flight,
                # which a round may still have counted; the host knows its replica is off)
                if np.any(diff) and hs.engine.needs_resync and \
                        any(c[2] not in ("done", "") for c in hs.calls) and \
                        (np.abs(diff) <= unknown.get(chunk, 0)).all():
                    self.stats["excused_unknown_fate"] += 1
                    continue
                if np.any(diff):
                    j = int(np.flatnonzero(diff)[0])
                    out.append(f"exactly-once: host {hs.leaf}.{hs.h} chunk {chunk} lane {j}: "
                               f"{'doubled' if diff[j] < 0 else 'lost'} {abs(int(diff[j]))}")
                    return out
        return out

    def _agreement(self, hs: Host) -> list[str]:
        seen: set[int] = set()
        out = []
        for head in hs.results:
            h = wire.Header.unpack(head)
            kept = self.spine_results.get(h.round)
            if h.round in seen:
                out.append(f"agreement: host {hs.leaf}.{hs.h} applied round {h.round} twice")
            seen.add(h.round)
            if kept is None or (h.chunk, h.count, h.mode) != kept[:2] + kept[3:4]:
                out.append(f"agreement: host {hs.leaf}.{hs.h} applied round {h.round} chunk "
                           f"{h.chunk} count {h.count}, not the spine's result")
        self.stats["results_applied"] += len(hs.results)
        return out


def _serial_after(a: int, b: int) -> bool:
    """a is after b, as 32-bit serial numbers."""
    return 0 < (a - b) & 0xFFFFFFFF < 1 << 31


def _lanes(data: bytes) -> np.ndarray:
    return np.frombuffer(data, ">i4", wire.LANES, H).astype(np.int64)


def _same(data: bytes, total: Any) -> bool:
    """Whether a datagram's int32 lanes are `total` (int64), as a switch's sum wraps."""
    want = np.zeros(wire.LANES, np.int64) + total
    return bool(np.array_equal((_lanes(data) - want) % (1 << 32), np.zeros(wire.LANES)))


def simulate(seed: int, target: str = "native", faults: dict[str, bool] | None = None,
             trace: Callable[[str], None] | None = None,
             engine: dict[str, Any] | None = None,
             drain: bool = True) -> tuple[list[str], Counter]:
    """One seed's run: its violations and its counters. `faults` takes engine rules out,
    `engine` overrides the hosts' engine settings, `drain` False stops a host at its last
    call with its flights unsettled."""
    sim = TwoLevelSim(draw(seed), target, faults, trace, engine, drain)
    return sim.run(), sim.stats


# The fair race: racks of equal pace, the spine in partial(1), nothing lost or late.
FAIR_LEAVES, FAIR_HOSTS, FAIR_CALLS = 2, 3, 20


def fair_race(seed: int, calls: int = FAIR_CALLS) -> Draw:
    """Equal-pace racks (leaves in sync) under a spine in partial(1), one chunk per call, no
    loss, duplication, jitter or swap: each spine round is a race between the racks' sums, and
    only the compute times drawn from the seed decide who wins it."""
    return Draw(
        seed=seed, leaves=FAIR_LEAVES, hosts=FAIR_HOSTS, sizes=(wire.LANES,), calls=calls,
        host_link=Link(), uplink=Link(),
        modes=((SPINE, int(Mode.PARTIAL), 1),
               *((("leaf", i), int(Mode.SYNC), 0) for i in range(FAIR_LEAVES))),
        swaps=(), compute=0.002, slow_rack=-1, slow_host=(-1, -1), slow_factor=1.0,
        lossy_until=0.0)


def rounds_per_leaf(sim: TwoLevelSim) -> list[int]:
    """Per leaf, the spine rounds that counted its sum among those that closed while every
    host was still calling (before the first host's last call ended)."""
    window = min(hs.calls[-1][1] for hs in sim.hosts)
    bitmaps = [sim.spine_results[r][2] for r, t in sim.spine_closed_at.items() if t <= window]
    return [sum(1 for b in bitmaps if b >> i & 1) for i in range(sim.d.leaves)]


def fairness(seed: int, target: str = "native", faults: dict[str, bool] | None = None,
             calls: int = FAIR_CALLS) -> tuple[list[str], list[int]]:
    """One fair race: the invariants' violations, plus a leaf left out of every spine round
    while its hosts were calling (a rack that loses one race must not lose all the rest:
    its hosts learn the verdict when the winners do, §11 "What a host does"); and the
    rounds per leaf."""
    sim = TwoLevelSim(fair_race(seed, calls), target, faults)
    problems = sim.run()
    counts = rounds_per_leaf(sim)
    problems += [f"fairness: leaf {i} is in none of the {len(sim.spine_closed_at)} spine "
                 f"rounds closed while its hosts were calling (per leaf: {counts})"
                 for i, n in enumerate(counts) if n == 0]
    return problems, counts


def sweep(target: str, start: int, seeds: int, out: Path) -> int:
    """Seeds start.. on one target, results to `out` (every 50 seeds, and at the end); the
    number of failing seeds."""
    return sweep_seeds(
        lambda seed: simulate(seed, target), label=target, start=start, seeds=seeds, out=out,
        about={"target": TARGETS[target], "hosts": "real worker engines (native/worker/)"},
        replay=f"python -m tests.sim.two_level_engines --seed {{seed}} --target {target}",
        every=50,
        kind=lambda stats: "leaf_past_spine_round" if stats["leaves_past_spine"] else "other")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--seed", type=int, help="replay one seed")
    ap.add_argument("--trace", action="store_true", help="with --seed: every packet")
    ap.add_argument("--fair", type=int, metavar="N",
                    help="N fair races (seeds --start..): spine rounds per leaf while all call")
    ap.add_argument("--target", choices=sorted(TARGETS), default="native",
                    help="the switches' pipeline (default: native)")
    ap.add_argument("--out", type=Path, default=RESULTS, help=f"results file (default {RESULTS})")
    args = ap.parse_args(argv)
    if args.fair is not None:
        failing = 0
        for seed in range(args.start, args.start + args.fair):
            problems, counts = fairness(seed, args.target)
            failing += bool(problems)
            print(f"seed {seed}: spine rounds per leaf {counts}"
                  + "".join(f"\n  {p}" for p in problems))
        return 1 if failing else 0
    if args.seed is not None:
        problems, stats = simulate(args.seed, args.target,
                                   trace=print if args.trace else None)
        print(json.dumps(dict(stats)))
        print("\n".join(problems) or f"seed {args.seed} on {args.target}: no violation")
        return 1 if problems else 0
    return 1 if sweep(args.target, args.start, args.seeds, args.out) else 0


if __name__ == "__main__":
    sys.exit(main())
