"""Retransmission when the switch is silent because the job waits, not because packets were
lost: a sync round cannot close before its late member contributes, and the early member's
window does not go out again packet by packet while it waits, nor, once it has seen the job
wait that long, at all.

The members are the real worker engine on its in-memory backend and the switch the real
pipeline, on a simulated clock (as tests/sim drives them): how long the late member is late
and how fast the switch answers are exactly what the test says, however busy the machine
running it is. Wall-clock behaviour over real sockets: bench/retransmission_bench.py."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from hysync import _core, wire
from hysync.softswitch.native import NativePipeline
from hysync.softswitch.tables import Entry, Replica
from hysync.worker.config import TransportConfig
from tests.conformance.targets import job_group, job_writes
from tests.conformance.topology import Job, Member

JOB, BASE, SLOTS = 9, 100, 16
SWITCH_IP = "10.0.0.254"
ONE_WAY_S = 50e-6  # each link's delay: answers within a tenth of a millisecond, as on loopback
LATE_S = 0.4
DONE, PENDING = 0, 3


class Clocked:
    """Two members of a sync job and the switch, on one simulated clock."""

    def __init__(self) -> None:
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self.job = Job(JOB, BASE, SLOTS, (Member(0, 1), Member(1, 2)))
        self.pipeline = NativePipeline()
        self.pipeline.write_group("INSERT", JOB, [Replica(p, r) for p, r in job_group(self.job)])
        for w in job_writes(self.job, wire.Mode.SYNC, 0):
            self.pipeline.write_entry("INSERT", Entry(w.table, w.match, w.action, w.params,
                                                      w.priority))
        self.engines = [_core.worker.Engine(  # the in-memory backend
            TransportConfig(JOB, m.worker, SWITCH_IP, slot_base=BASE, slot_count=SLOTS,
                            members=2).engine_config(SWITCH_IP, 2.0**20, seed=m.worker))
            for m in self.job.members]
        self._keys: set[str] = set()
        self._busy = [False, False]
        self._gen = [0, 0]
        self._values: list[np.ndarray | None] = [None, None]
        self._stats: list[dict | None] = [None, None]

    def _at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._events, (t, next(self._seq), fn, args))

    def _run(self) -> None:
        while any(s is None for s in self._stats):
            assert self._events, "a call neither ended nor waits for anything"
            self.now, _, fn, args = heapq.heappop(self._events)
            fn(*args)

    def call(self, key: str, values: np.ndarray, late_s: float) -> dict:
        """One call of both members; the late one starts `late_s` after the early one.
        Returns the early member's stats of the call (retransmits, rto)."""
        if key not in self._keys:
            for e in self.engines:
                e.register(key, values.size)
            self._keys.add(key)
        self._stats = [None, None]
        start = self.now
        self._at(start, self._begin, 0, key, values)
        self._at(start + late_s, self._begin, 1, key, values)
        self._run()
        return self._stats[0]  # type: ignore[return-value]

    def _begin(self, w: int, key: str, values: np.ndarray) -> None:
        e = self.engines[w]
        e.set_time(self.now)
        e.reset_stats()
        self._values[w] = values.copy()  # the engine reads it until the call is done
        e.begin_call(key, self._values[w])
        self._busy[w] = True
        self._turn(w)

    def _turn(self, w: int) -> None:
        e = self.engines[w]
        e.set_time(self.now)
        status = e.step(self.now)
        m = self.job.members[w]
        for data in e.take_sent():
            self._at(self.now + ONE_WAY_S, self._switch, m, data)
        if status == PENDING:
            self._gen[w] += 1
            wake = e.next_wake()
            if wake != float("inf"):
                self._at(max(self.now, wake), self._wake, w, self._gen[w])
            return
        assert status == DONE, f"member {w}: call ended with status {status}"
        self._busy[w] = False
        self._stats[w] = dict(e.stats(), rto=e.rto)

    def _wake(self, w: int, gen: int) -> None:
        if self._busy[w] and gen == self._gen[w]:
            self._turn(w)

    def _switch(self, m: Member, data: bytes) -> None:
        for _ip, port, reply in self.pipeline.process_datagram(m.ip, m.udp_port, data):
            w = next(x.worker for x in self.job.members if x.udp_port == port)
            self._at(self.now + ONE_WAY_S, self._deliver, w, reply)

    def _deliver(self, w: int, data: bytes) -> None:
        e = self.engines[w]
        e.set_time(self.now)
        e.on_datagram(data, self.now)
        if self._busy[w]:
            self._turn(w)


def warm() -> Clocked:
    """Two members of a sync job whose slots have all been heard from."""
    job = Clocked()
    job.call("w", np.ones(SLOTS * wire.LANES, dtype=np.float32), 0.0)
    return job


def values(chunks_per_slot: int = 1) -> np.ndarray:
    # (within the quantizer's range for two members at its scale: +-341)
    return np.arange(SLOTS * chunks_per_slot * wire.LANES, dtype=np.float32) % 300


def test_a_window_waiting_on_a_late_member_is_probed_not_resent():
    job = warm()
    stats = job.call("g", values(), LATE_S)
    # Over LATE_S, with timeouts from rto_initial (20 ms) up, resending every packet of the
    # window on its own timer resends each packet at least once; probing sends about one
    # packet per RTO, and the RTO doubles with each timeout.
    assert 0 < stats["retransmits"] <= SLOTS // 2, stats["retransmits"]


def test_a_wait_the_job_has_just_been_through_is_not_probed_again():
    """The early member's answers after a wait tell it the job waited (no loss). Hundreds of
    prompt answers later, which bring its RTO back to a few milliseconds, the same wait
    again within the second sends nothing; a longer one is probed."""
    job = warm()
    first = job.call("g", values(), 0.08)
    assert first["retransmits"] > 0  # the RTO was a few milliseconds: it probed
    prompt = job.call("p", values(40), 0.0)
    # The RTO is back to a few milliseconds: far below the next wait, which an RTO alone
    # would therefore probe.
    assert prompt["rto"] < 0.05 / 4, prompt["rto"]
    again = job.call("g", values(), 0.05)
    assert again["retransmits"] == 0, again["retransmits"]
    # The control: the same history of prompt answers without the wait, and the same wait
    # is probed - the wait remembered is what kept the first job silent.
    control = warm()
    control.call("p", values(40), 0.0)
    assert control.call("g", values(), 0.05)["retransmits"] > 0
    # 1.5 x the waits seen, but never over 0.1 s beyond the RTO (a lost last packet)
    longer = job.call("g", values(), 0.4)
    assert longer["retransmits"] > 0, "a wait longer than any seen was never probed"
