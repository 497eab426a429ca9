"""Play one Plan: real worker engines and a real switch pipeline on a simulated network.

One heap of events ordered by (simulated time, sequence number) drives everything; every
random choice of the network comes from one `random.Random` seeded by the plan's seed, so a
run is a pure function of (plan, target). The engines run on their in-memory backend: the
simulation sets their clock, hands them datagrams and takes what they send.

What the simulation records for the checker (check.py): every contribution the switch
counted (its `contributions` counter moved), the result of every round it closed, the
rounds a restart or a re-install wiped, what every worker contributed and holds, and how
every call ended; and for non-finite elements (docs/protocol.md §9, "Non-finite values"):
where they were given, when the switch counted an overflow sentinel, which results a worker
applied non-finite and which elements of its calls' outputs were.
"""

from __future__ import annotations

import heapq
import random
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hysync import _core, p4names, wire
from hysync.softswitch.native import NativePipeline
from hysync.softswitch.pipeline import Pipeline
from hysync.softswitch.tables import Entry, Replica
from hysync.worker.config import engine_config
from tests.conformance.targets import job_group, job_writes, mode_write
from tests.conformance.tna_model import TnaModelPipeline
from tests.conformance.topology import Job, Member

from .hosts import Rank, draw_gradients, ranks_of, reduce_mean, updates
from .plan import (
    JOIN_AFTER,
    MISSED_AFTER,
    NONFINITE_VALUES,
    RTO_INITIAL,
    RTO_MIN,
    SCALE,
    STALL_AFTER,
    Plan,
)

SWITCH_IP = "10.0.0.254"
DONE, UNREACHABLE, PENDING, RESET = 0, 1, 3, 4
STATUS = {DONE: "done", UNREACHABLE: "unreachable", RESET: "reset"}
_SLOT_NAMED = re.compile(r"slot (\d+): ")  # a flight in the engine's description of its own
QUIESCE = 2.0          # simulated seconds the engines keep ticking after the last call
MAX_EVENTS = 3_000_000  # a run past this many events is reported as a hang
_OFF_FLAGS, _OFF_OP, _OFF_SLOT, _OFF_REASON, _OFF_ROUND, _OFF_CHUNK, _OFF_MODE = (
    wire.FIELD_OFFSET[f] for f in ("flags", "op", "slot", "reason", "round", "chunk", "mode"))
# The RESYNC reasons that tell a contribution the slot's open round (it named another).
_STALE_REASONS = (wire.ResyncReason.STALE_ROUND, wire.ResyncReason.STALE_COUNTED)
_PROGRESS_REASONS = (wire.ResyncReason.STALE_COUNTED, wire.ResyncReason.CHUNK_MISMATCH)
H = wire.HEADER_BYTES


def _pipeline(target: str) -> Pipeline:
    if target == "native":
        return NativePipeline()
    if target == "python":
        return Pipeline()
    if target == "tna-model":
        return TnaModelPipeline()
    raise ValueError(f"unknown simulation target {target!r}: native, python or tna-model")


class Switch:
    """A pipeline with the job's tables, as the controller writes them (P4Info names)."""

    def __init__(self, make: Callable[[], Pipeline], job: Job) -> None:
        self.make, self.job = make, job
        self.pipeline = make()
        self.installed = False
        self.mode_entry = False

    def _write(self, update: str, w: Any) -> None:
        self.pipeline.write_entry(update, Entry(w.table, w.match, w.action, w.params,
                                                w.priority))

    def install(self, epoch: int, mode: int, quorum: int) -> None:
        self.job = Job(self.job.job_id, self.job.slot_base, self.job.slot_count,
                       self.job.members, epoch)
        self.pipeline.write_group("INSERT", self.job.job_id,
                                  [Replica(p, r) for p, r in job_group(self.job)])
        for w in job_writes(self.job, mode, quorum):
            self._write("INSERT", w)
        self.installed = True

    def remove(self) -> None:
        for w in job_writes(self.job):
            self._write("DELETE", w)
        self.pipeline.write_group("DELETE", self.job.job_id, [])
        self.installed = False

    def swap(self, mode: int, quorum: int) -> None:
        if self.installed:
            self._write("MODIFY", mode_write(self.job, mode, quorum))

    def counted(self, worker: int) -> int:
        cell = self.job.job_id * wire.MAX_WORKERS + worker
        return self.pipeline.counters[p4names.STATS_CONTRIBUTIONS].packets[cell]


@dataclass
class Call:
    index: int           # the worker's call number (iteration * keys + key)
    key: int
    start: float
    end: float = -1.0
    status: str = ""
    # absolute slots of the packets it still had in flight when it failed 'unreachable'
    waiting: frozenset[int] = frozenset()
    # (absolute slot, chunk) of the packets it had in flight when it started (an earlier
    # call's, parked in a round, say)
    held: frozenset[tuple[int, int]] = frozenset()


@dataclass
class Worker:
    w: int
    member: Member
    engine: Any
    keys: list[str]                   # per key: its name in the engine
    firsts: list[int]
    grads: list[np.ndarray]           # per key: every gradient given, in fixed point (int64)
    calls: list[Call] = field(default_factory=list)
    values: np.ndarray | None = None  # the call's buffer, alive while the engine writes it
    # what reached the worker while it did not read, with when it arrived
    inbox: list[tuple[bytes, float]] = field(default_factory=list)
    in_call: bool = False
    paused_until: float = 0.0
    dead: bool = False
    finished: bool = False
    gen: int = 0                      # the latest wake event; older ones are void
    # (switch state, header) of every result applied; state None: applied outside a datagram
    results: list[tuple[int | None, bytes]] = field(default_factory=list)
    # (switch state, slot, round) of every result applied; those dropped as duplicates of
    # none of them (the checker wants the replica flagged for a resync then)
    applied: set[tuple[int, int, int]] = field(default_factory=set)
    dropped: list[tuple[int, int, int]] = field(default_factory=list)
    got: list[tuple[float, int]] = field(default_factory=list)  # (when, chunk) of each applied
    heard: set[int] = field(default_factory=set)  # switch states it got a RESULT or ACK of
    # (when, bitmap) of every RESULT its engine took: each restarts the engine's dead timer
    results_heard: list[tuple[float, int]] = field(default_factory=list)
    # when it heard each CHUNK_MISMATCH that answered a contribution of its (not a JOIN): the
    # open round of another chunk, which it joins; each restarts the engine's dead timer too
    mismatches_heard: list[float] = field(default_factory=list)
    # when it heard each STALE reply that answered its flight's latest transmission (not a
    # JOIN): the flight is sent again at the open round after one RTO's grace (sync), which
    # starts that packet's deadline afresh
    stales_heard: list[float] = field(default_factory=list)
    # when it heard each reply of the switch other than a NOT_JOINED (which any JOIN may meet,
    # and which tells nothing of the switch's state): a RESULT, an ACK, any other RESYNC
    answers_heard: list[float] = field(default_factory=list)
    # (when, chunk, open round's chunk, the open round's bitmap, (slot, round) of the open
    # round, when the transmission answered was sent) of each contribution of its a partial
    # slot answered CHUNK_MISMATCH: the call carries its chunk (partial never chases it) and
    # joins the round of the other
    displaced: list[tuple[float, int, int, int, tuple[int, int], float]] = field(
        default_factory=list)
    # (slot, transmission number) -> when its latest contribution so numbered was sent
    sent_at: dict[tuple[int, int], float] = field(default_factory=dict)
    # (when, absolute slot, chunk) of every contribution it sent, retransmissions included
    sent: list[tuple[float, int, int]] = field(default_factory=list)
    # (when, absolute slot, chunk) of each flight its engine parked (docs/protocol.md §9,
    # partial liveness: the call settles it and carries its chunks left on the slot, unsent),
    # noted at the step that parked it; and the flights parked as of its last step
    parks: list[tuple[float, int, int]] = field(default_factory=list)
    parked_now: frozenset[tuple[int, int, int]] = frozenset()
    # (when, chunk, the round's chunk, the round's quorum, when the transmission answered was
    # sent) of each contribution of its a partial round of another chunk that had closed
    # without it answered RESEND: the call carries its chunk (docs/protocol.md §10, limit
    # "Rounds of one raced on a slow switch")
    raced: list[tuple[float, int, int, int, float]] = field(default_factory=list)
    # (switch state, slot, round) of every round it heard a RESULT or an ACK of with its bit
    # (the switch acknowledged its contribution there) -> the moment it first heard one
    acked: dict[tuple[int, int, int], tuple[float, int]] = field(default_factory=dict)
    # the moments the worker dropped what it had in flight: a call failed, or it learned of a
    # new switch state (between calls it drops its packets in flight then). Moments
    # (Sim.moment), not times: a send, an abort and an acknowledgement often share an
    # instant, and which came first decides whether the worker could know a packet's fate.
    aborts: list[tuple[float, int]] = field(default_factory=list)
    # chunk -> |lanes| of flights a RESULT settled as counted whose round had counted another
    # transmission of this worker's, and of that transmission (Sim._check_settled)
    missettled: dict[int, np.ndarray] = field(default_factory=dict)
    # chunk -> the lanes of its flights whose own count the worker took for "not counted" at
    # the round of a packet of another chunk its last abort forgot (docs/protocol.md §9)
    misread_own: dict[int, np.ndarray] = field(default_factory=dict)
    # Non-finite elements: (key, element) -> start times of the calls that gave one there;
    # (time, chunk, lanes) of every result applied with non-finite lanes (an ACK: its own
    # lanes); per call that ended, (call index, key, end, elements of the output not
    # finite); (chunk, lane) -> times the engine absorbed a sentinel of its in a round
    # non-finite there already (settle(), prepare_chunk()).
    injected: dict[tuple[int, int], list[float]] = field(default_factory=dict)
    applied_nonfinite: list[tuple[float, int, frozenset[int]]] = field(default_factory=list)
    outputs: list[tuple[int, int, float, frozenset[int]]] = field(default_factory=list)
    absorbed: dict[tuple[int, int], list[float]] = field(default_factory=dict)
    absorbed_seen: int = 0
    # A member that is a host of several ranks (tests/sim/hosts.py): its ranks, leader
    # first (none where each member is one rank); when a stalled rank lets its host's next
    # reduce finish; how many results the engine had applied when the call began.
    ranks: list[Rank] = field(default_factory=list)
    stalled_until: float = 0.0
    results_at_call: int = 0


@dataclass
class Record:
    """What the checker reads."""
    plan: Plan
    target: str
    counted: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)  # (w, chunk)
    last_counted: dict[tuple[int, int], bytes] = field(default_factory=dict)  # (w, slot)
    # (switch state, slot, round, chunk, count, bitmap) of every round the switch closed
    emitted: set[tuple[int, int, int, int, int, int]] = field(default_factory=set)
    # (switch state, slot, round) -> (w, chunk, lanes) counted into it, of every round closed
    closed: dict[tuple[int, int, int], list[tuple[int, int, np.ndarray]]] = field(
        default_factory=dict)
    # (switch state, slot, round) of every round some member applied (its RESULT, or the ACK
    # of its own contribution)
    applied: set[tuple[int, int, int]] = field(default_factory=set)
    resets: list[tuple[float, str]] = field(default_factory=list)  # (when, fault kind)
    # every contribution the switch counted: [w, chunk, lanes, (state, slot, round) of the
    # round it closed in, or None while open or once wiped, whether its datagram was first
    # sent before a state reset that came before it was counted (it crossed the reset),
    # the moment its datagram was first sent (Sim.moment)]
    contribs: list[list[Any]] = field(default_factory=list)
    # (w, chunk and lanes of a datagram) -> the moment w first sent it
    launched: dict[tuple[int, bytes], tuple[float, int]] = field(default_factory=dict)
    # (when, w, slot) of every transmission of a contribution the network lost after losing
    # the one before it (same slot, round and chunk): a member held back by losses in a row
    loss_streaks: list[tuple[float, int, int]] = field(default_factory=list)
    # (when, w, slot) of every answer to a contribution of w's (a RESULT with its bit, a
    # RESEND) the network lost after losing the one before it, of the same round: a member
    # held back by its round's answers lost in a row
    answer_loss_streaks: list[tuple[float, int, int]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    packets: int = 0
    swaps: int = 0
    sim_seconds: float = 0.0
    state_resets: int = 0
    modes: list[tuple[float, int, int]] = field(default_factory=list)  # swaps: (t, mode, q)
    # failed calls and other events each allowed by a rule of docs/protocol.md §10
    # ("Allowed, by rule"), counted per rule (check.RULES); the checker fills it in
    excused: dict[str, int] = field(default_factory=dict)
    # (w, chunk, lane) -> times the switch counted an overflow sentinel from w there
    sentinels: dict[tuple[int, int, int], list[float]] = field(default_factory=dict)
    nonfinite_rounds: int = 0  # rounds that closed with a non-finite lane
    # (w, chunk) -> the magnitudes of w's contributions whose count in an open round a copy
    # of theirs, refused there, erased from w's member cell (Sim._note_copy_refused)
    erased: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)


class Sim:
    """`make_pipeline` replaces the target's pipeline, `engine` sets the workers' engine
    settings (hysync.worker.config.engine_config) and `faults` takes rules out of their
    engines (`hysync._core.worker.Faults`'s fields set true): how tests/sim/test_races.py
    takes a rule out."""

    def __init__(self, plan: Plan, target: str, make_pipeline: Callable[[], Pipeline] | None
                 = None, engine: dict[str, Any] | None = None,
                 faults: dict[str, bool] | None = None,
                 trace: Callable[[str], None] | None = None) -> None:
        self.plan, self.target = plan, target
        self.trace = trace  # given: one line per packet, swap, pause and call (--trace)
        self.make_pipeline = make_pipeline or (lambda: _pipeline(target))
        self.engine_options = {"join_after": JOIN_AFTER, **(engine or {})}
        self.faults = _core.worker.Faults()
        for name, on in (faults or {}).items():
            if not hasattr(self.faults, name):
                raise TypeError(f"Sim: no fault {name!r} (see native/worker/faults.h)")
            setattr(self.faults, name, on)
        self.rng = random.Random(plan.seed * 1_000_003 + 17)
        self.events: list[tuple[float, int, Callable[..., None], tuple]] = []
        self.seq = 0
        self.now = 0.0
        self.moments = 0  # what Sim.moment has handed out
        self.rec = Record(plan, target)
        # id -> (the switch state that emitted it, the RESULT itself, kept alive so that
        # its id stays its own): the state a result came from, when a worker gets it
        self.state_of: dict[int, tuple[int, bytes]] = {}
        # id -> (the switch state, the reply) of every STALE_COUNTED the TNA model sent, whose
        # member_seq has no refusal mark (_check_settled)
        self.stale_counted_of: dict[int, tuple[int, bytes]] = {}
        members = tuple(Member(w, w + 1) for w in range(plan.workers))
        job = Job(1, plan.slot_base, plan.slots, members, self._epoch())
        self.switch = Switch(self.make_pipeline, job)
        self.switch.install(job.epoch, plan.mode, plan.quorum)
        self.switch_up_at = 0.0
        self.last_progress = 0.0  # the last reply a worker's dead timer counts (_deliver)
        self.baseline = [0] * plan.workers
        self.by_addr = {(m.ip, m.udp_port): m.worker for m in members}
        self.last_arrival: dict[tuple[str, int], float] = {}
        # (w, slot) -> (round and chunk of its latest contribution sent, its losses in a row)
        self.up_losses: dict[tuple[int, int], tuple[bytes, int]] = {}
        # (w, slot) -> (round of the latest answer with w's bit sent to w, its losses in a row)
        self.down_losses: dict[tuple[int, int], tuple[bytes, int]] = {}
        self.open: dict[int, list[tuple[int, int, np.ndarray]]] = {}  # slot -> (w, chunk, lanes)
        self.open_contribs: dict[int, list[list[Any]]] = {}  # slot -> its Record.contribs
        # (w, chunk and lanes of a datagram) -> its Record.contribs entry, the last counted
        self.counted_as: dict[tuple[int, bytes], list[Any]] = {}
        self.may_async = plan.mode == wire.Mode.ASYNC or any(
            f.kind == "swap" and f.mode == wire.Mode.ASYNC for f in plan.faults)
        self.workers = [self._worker(w, m) for w, m in enumerate(members)]
        if plan.ranks_per_host > 1:
            for wk in self.workers:
                wk.ranks = ranks_of(wk.w, plan.ranks_per_host, plan.sizes, wire.LANES)
        self.grad_rng = np.random.default_rng(plan.seed)
        self.sentinel, self.bound = _core.worker.quantizer_limits(plan.workers)
        self.max_sum = plan.workers * self.bound  # a sum beyond holds a sentinel
        self.injections: dict[tuple[int, int], list[tuple[int, float]]] = {}
        for w, call, element, kind in plan.nonfinite:
            self.injections.setdefault((w, call), []).append((element, NONFINITE_VALUES[kind]))

    # ------------------------------------------------------------ the trace
    def _say(self, text: str) -> None:
        if self.trace is not None:
            self.trace(f"{self.now:10.6f} {text}")

    @staticmethod
    def describe(data: bytes) -> str:
        """One packet's header, for the trace."""
        (_v, op, flags, mode, _job, w, count, slot, reason, quorum, rnd, chunk,
         bitmap) = wire.HEADER_STRUCT.unpack_from(data)
        ops = {1: "CONTRIB", 2: "RESULT", 3: "RESYNC", 4: "ACK"}
        names = [f.name for f in wire.Flag if f.value and f.value & flags]
        tx = (flags & wire.TX_MASK) >> wire.TX_SHIFT
        out = (f"{ops.get(op, op)} w{w} slot {slot} round {rnd} chunk {chunk} "
               f"mode {mode}/q{quorum} tx {tx}")
        if names:
            out += " " + "|".join(names)
        if op == wire.Op.RESYNC:
            out += f" reason {reason}"
        if op in (wire.Op.RESULT, wire.Op.RESYNC):
            out += f" count {count} bitmap {bitmap:#x}"
        return out

    # ------------------------------------------------------------ the scheduler
    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, fn, args))

    def run(self) -> Record:
        for w in self.workers:
            self.at(self.rng.uniform(0, self._compute(w.w)), self._next_call, w)
        for f in self.plan.faults:
            self.at(f.at, self._fault, f)
        events = 0
        while self.events:  # on past a violation: every violation of the run is reported
            self.now, _, fn, args = heapq.heappop(self.events)
            fn(*args)
            events += 1
            if events > MAX_EVENTS:
                self.rec.violations.append(
                    f"liveness: more than {MAX_EVENTS} events by t={self.now:.3f} s")
                break
        self.rec.sim_seconds = self.now
        return self.rec

    def _epoch(self) -> int:
        """A new install's epoch, whose install tag no earlier install of the run had. The
        controller avoids its predecessor's tag where it knows it (admission.new_epoch); a
        tag reused beyond that (1 in 256 per install it has no record of) is the limit of
        docs/protocol.md §9, not drawn here."""
        used = self.__dict__.setdefault("tags_used", set())
        while True:
            epoch = self.rng.randrange(1, wire.MAX_EPOCH + 1)
            if wire.install_tag(epoch) not in used or len(used) == 256:
                used.add(wire.install_tag(epoch))
                return epoch

    # ------------------------------------------------------------ workers
    def _worker(self, w: int, m: Member) -> Worker:
        p = self.plan
        config = engine_config(
            job_id=1, worker_id=w, switch_ip=SWITCH_IP, switch_port=wire.HYSYNC_UDP_PORT,
            slot_base=p.slot_base, slot_count=p.slots, members=p.workers, scale=SCALE,
            rto_initial=RTO_INITIAL, rto_min=RTO_MIN, stall_after=STALL_AFTER,
            missed_after=MISSED_AFTER, staleness_decay=1.0, seed=p.seed * 64 + w,
            **{"rto_max": p.rto_max, "dead_after": p.dead_after,
               # the tag of the install it attaches to, given with the job (§9)
               "install_tag": wire.install_tag(self.switch.job.epoch), **self.engine_options})
        engine = _core.worker.Engine(config, faults=self.faults)
        keys = [f"key{i}" for i in range(len(p.sizes))]
        for key, n in zip(keys, p.sizes, strict=True):
            engine.register(key, n)
        firsts = [engine.first_chunk(k) for k in keys]
        grads = [np.zeros(-(-n // wire.LANES) * wire.LANES, np.int64) for n in p.sizes]
        return Worker(w, m, engine, keys, firsts, grads)

    def _next_call(self, wk: Worker) -> None:
        if wk.dead or wk.finished:
            return
        if self.now < max(wk.paused_until, wk.stalled_until):
            self.at(max(wk.paused_until, wk.stalled_until), self._next_call, wk)
            return
        p = self.plan
        index = len(wk.calls)
        if index == p.calls * len(p.sizes):
            wk.finished = True
            if all(x.finished or x.dead for x in self.workers):
                self._quiesce_start()
            return
        k = index % len(p.sizes)
        n = p.sizes[k]
        if wk.ranks:
            wk.values = self._host_gradient(wk, index, k, n)
        else:
            # Gradients that are whole multiples of 1/scale and small: float32 holds every
            # sum of them exactly, so the fixed-point books balance bit for bit.
            fixed = self.grad_rng.integers(-1000, 1001, n)
            wk.grads[k][:n] += fixed
            wk.values = (fixed / SCALE).astype(np.float32)
            for element, value in self.injections.get((wk.w, index), ()):
                wk.values[element] = value
                wk.injected.setdefault((k, element), []).append(self.now)
        wk.results_at_call = len(wk.results)
        wk.calls.append(Call(index, k, self.now))
        self._say(f"w{wk.w} call {index} (key {k}) starts")
        e = wk.engine
        e.set_time(self.now)
        for d in wk.inbox:  # allreduce drains the socket first
            self._hand(wk, *d)
        wk.inbox.clear()
        wk.calls[-1].held = frozenset(
            (self.plan.slot_base + i, struct.unpack_from("!I", d, _OFF_CHUNK)[0])
            for i, d, _a in e.flights())
        e.begin_call(wk.keys[k], wk.values)
        self._note_absorbed(wk)
        wk.in_call = True
        bound = max(self.now, p.faults_end, p.lossy_until) + p.liveness_bound
        self.at(bound, self._deadline, wk, index)
        self._turn(wk)

    def _turn(self, wk: Worker) -> None:
        e = wk.engine
        e.set_time(self.now)
        status = e.step(self.now)
        self._note_parks(wk)
        self._note_absorbed(wk)
        self._take_results(wk, e.stats(), None)  # (at once: a timer may apply my own lanes)
        if status == RESET:  # aborted before the step sent anything of its own
            wk.aborts.append(self.moment())
        self._sent(wk)
        if status == PENDING:
            wk.gen += 1
            wake = e.next_wake()
            if wake != float("inf"):
                self.at(max(self.now, wake), self._wake, wk, wk.gen)
            return
        call = wk.calls[-1]
        call.end, call.status = self.now, STATUS[status]
        if status == UNREACHABLE:  # gave up after the step's own sends
            wk.aborts.append(self.moment())
            # (the engine forgets them as it gives up: its log line names them)
            gave_up = [m for _level, m in e.take_logs() if "gives up waiting" in m]
            call.waiting = frozenset(int(x) for x in _SLOT_NAMED.findall(gave_up[-1])) \
                if gave_up else frozenset()
        else:
            e.take_logs()  # (kept by the engine until taken)
        self._say(f"w{wk.w} call {call.index} {call.status}")
        wk.in_call = False
        if call.status == "done":
            wk.outputs.append((call.index, call.key, self.now,
                               frozenset(np.flatnonzero(~np.isfinite(wk.values)).tolist())))
        self._take_results(wk, e.stats(), None)
        if wk.ranks:
            self._host_broadcast(wk, call)
        wk.values = None
        self.at(self.now + self.rng.uniform(0, self._compute(wk.w)), self._next_call, wk)

    def _take_results(self, wk: Worker, stats: dict[str, Any], state: int | None) -> None:
        """The headers of the results the engine applied since it was last asked, and the
        flights it applied as their own async rounds' results (an ACK's, or a STALE_COUNTED's
        once its grace period passed): their non-finite lanes, and the round that counted
        them, in the state the switch holds now, which a member has then applied."""
        raw = stats["results"]
        wk.results += [(state, bytes(raw[i:i + H])) for i in range(0, len(raw), H)]
        own = wk.engine.take_own()
        for i in range(0, len(own), wire.PACKET_BYTES):
            flight = own[i:i + wire.PACKET_BYTES]
            self._applied_lanes(wk, flight)
            c = self.counted_as.get((wk.w, flight[_OFF_CHUNK:_OFF_CHUNK + 4] + flight[H:]))
            if c is not None and c[3] is not None and c[3][0] == self.rec.state_resets:
                self.rec.applied.add(c[3])
        refused = wk.engine.take_forgotten_round_refused()
        for i in range(0, len(refused), wire.PACKET_BYTES):
            flight = refused[i:i + wire.PACKET_BYTES]
            # (the switch counted these very lanes: the answer was the flight's own count)
            if (wk.w, flight[_OFF_CHUNK:_OFF_CHUNK + 4] + flight[H:]) in self.counted_as:
                chunk = struct.unpack_from("!I", flight, _OFF_CHUNK)[0]
                wk.misread_own[chunk] = wk.misread_own.get(chunk, 0) + np.abs(self._lanes(flight))

    # ------------------------------------------------------------ hosts of several ranks
    def _host_gradient(self, wk: Worker, index: int, k: int, n: int) -> np.ndarray:
        """The host's ranks are given their gradients (a non-finite element of the plan's at
        rank `element mod R`) and reduced onto the leader: its switch call's input."""
        fixed = draw_gradients(self.grad_rng, len(wk.ranks), n)
        grads = (fixed / SCALE).astype(np.float32)
        injected = np.zeros(n, bool)  # (their books are the non-finite checks')
        for element, value in self.injections.get((wk.w, index), ()):
            grads[element % len(wk.ranks), element] = value
            injected[element] = True
            wk.injected.setdefault((k, element), []).append(self.now)
        for rank, row in zip(wk.ranks, fixed, strict=True):
            rank.given[k][:n] += np.where(injected, 0, row)
        values = self._host_reduce(wk, index, grads)
        # the leader's books: what its engine was given (exact: hosts.py's doc)
        given = np.where(injected, 0, values).astype(np.float64) * SCALE
        wk.grads[k][:n] += np.rint(given).astype(np.int64)
        return values

    def _host_reduce(self, wk: Worker, index: int, grads: np.ndarray) -> np.ndarray:
        """The host-level reduction of call `index` (a mutation test replaces it)."""
        return reduce_mean(grads)

    def _host_broadcast(self, wk: Worker, call: Call) -> None:
        """What the leader's call ended with reaches every rank of its host: (ok, updates,
        needs resync), then the leader's output where ok (host_group.py's `finish`)."""
        ok = call.status == "done"
        done = updates([h for _s, h in wk.results[wk.results_at_call:]],
                       wk.firsts[call.key], self.plan.workers)
        flag = bool(wk.engine.needs_resync)
        assert wk.values is not None
        for rank in wk.ranks:
            rank.outputs.append((call.index, ok, done, flag,
                                 wk.values.copy() if ok else None))

    def _compute(self, w: int) -> float:
        """The longest a worker computes between two calls (the straggler: that many times)."""
        p = self.plan
        return p.compute * (p.slow_factor if w == p.slow_worker else 1.0)

    def _wake(self, wk: Worker, gen: int) -> None:
        if gen != wk.gen or not wk.in_call or wk.dead or self.now < wk.paused_until:
            return
        self._turn(wk)

    def _deadline(self, wk: Worker, index: int) -> None:
        """Invariant 3: the bound is fixed when the call starts (Plan.liveness_bound after the
        later of its start and the faults' end); it never moves."""
        call = wk.calls[index]
        if call.end < 0 and not wk.dead:
            self.rec.violations.append(
                f"liveness: worker {wk.w} call {index} (key {call.key}) started at "
                f"{call.start:.3f} s is neither done nor failed at {self.now:.3f} s "
                f"({self.plan.liveness_bound:g} s after the faults stopped): "
                f"{wk.engine.describe_flights()}")

    def _deliver(self, wk: Worker, data: bytes) -> None:
        if wk.dead:
            return
        if self.trace is not None:
            held = not wk.in_call or self.now < wk.paused_until
            self._say(f"w{wk.w} <- {self.describe(data)}{' (queued)' if held else ''}")
        if not wk.in_call or self.now < wk.paused_until:
            if len(wk.inbox) < 4096:  # a socket buffer
                wk.inbox.append((data, self.now))
            return
        if data[_OFF_OP] != wire.Op.RESYNC or data[_OFF_REASON] in _PROGRESS_REASONS:
            self.last_progress = self.now  # what a worker's dead timer hears (§9 Failures)
        wk.engine.set_time(self.now)
        self._hand(wk, data)
        self._turn(wk)

    def _resume(self, wk: Worker) -> None:
        if wk.dead or self.now < wk.paused_until:
            return
        if wk.in_call:
            e = wk.engine
            e.set_time(self.now)
            for d in wk.inbox:
                self._hand(wk, *d)
            wk.inbox.clear()
            self._turn(wk)

    # ------------------------------------------------------------ the network
    def _hand(self, wk: Worker, data: bytes, arrived: float | None = None) -> None:
        """The worker's engine takes a datagram that arrived at `arrived` (default: now); a
        RESULT it drops as a duplicate of none it applied is noted (a result lost to the
        replica unless it is flagged)."""
        e = wk.engine
        arrived = self.now if arrived is None else arrived
        if data[_OFF_OP] != wire.Op.RESYNC or data[_OFF_REASON] != wire.ResyncReason.NOT_JOINED:
            wk.answers_heard.append(arrived)
        tag = self.state_of.get(id(data))
        if tag is None:
            if data[_OFF_OP] == wire.Op.RESYNC and \
                    data[_OFF_REASON] == wire.ResyncReason.CHUNK_MISMATCH:
                flight = self._flight(wk, struct.unpack_from("!H", data, _OFF_SLOT)[0])
                if flight is None or not flight[_OFF_FLAGS] & wire.Flag.JOIN:
                    wk.mismatches_heard.append(self.now)
                if flight is not None and not flight[_OFF_FLAGS] & wire.Flag.JOIN and \
                        data[_OFF_MODE] == wire.Mode.PARTIAL:
                    wk.displaced.append((self.now, struct.unpack_from("!I", flight,
                                                                      _OFF_CHUNK)[0],
                                         struct.unpack_from("!I", data, _OFF_CHUNK)[0],
                                         _bitmap(data),
                                         (struct.unpack_from("!H", data, _OFF_SLOT)[0],
                                          struct.unpack_from("!I", data, _OFF_ROUND)[0]),
                                         wk.sent_at.get(
                                             (struct.unpack_from("!H", data, _OFF_SLOT)[0],
                                              data[_OFF_FLAGS] & wire.TX_MASK), self.now)))
            if data[_OFF_OP] == wire.Op.RESYNC and data[_OFF_REASON] in (
                    wire.ResyncReason.STALE_ROUND, wire.ResyncReason.STALE_COUNTED):
                flight = self._flight(wk, struct.unpack_from("!H", data, _OFF_SLOT)[0])
                if flight is not None and not flight[_OFF_FLAGS] & wire.Flag.JOIN and \
                        (flight[_OFF_FLAGS] ^ data[_OFF_FLAGS]) & wire.TX_MASK == 0:
                    wk.stales_heard.append(self.now)
                    emitted = self.stale_counted_of.get(id(data))
                    if emitted is not None:  # "counted" for the flight's round, on the TNA model
                        self._check_settled(wk, (emitted[0], struct.unpack_from(
                            "!H", data, _OFF_SLOT)[0], struct.unpack_from(
                            "!I", flight, _OFF_ROUND)[0]), flight)
            before = e.stats()
            self._take_results(wk, before, None)
            e.on_datagram(data, self.now, arrived)
            self._note_absorbed(wk)
            after = e.stats()
            self._take_results(wk, after, None)
            self._note_reset(wk, before, after)
            return
        wk.heard.add(tag[0])
        before = e.stats()
        self._take_results(wk, before, None)
        slot = struct.unpack_from("!H", data, _OFF_SLOT)[0]
        flight = self._flight(wk, slot)
        e.on_datagram(data, self.now, arrived)
        self._note_absorbed(wk)
        after = e.stats()
        self._take_results(wk, after, tag[0])
        rnd = struct.unpack_from("!I", data, _OFF_ROUND)[0]
        # An ACK echoes the contribution's round field - in async its sequence number, not
        # the round that counted it: the round is the one the switch counted the flight in.
        counted_in = (tag[0], slot, rnd)
        if data[_OFF_OP] == wire.Op.ACK and flight is not None:
            c = self.counted_as.get((wk.w, flight[_OFF_CHUNK:_OFF_CHUNK + 4] + flight[H:]))
            if c is not None and c[3] is not None and c[3][0] == tag[0]:
                counted_in = c[3]
        if (data[_OFF_OP] == wire.Op.ACK or (
                data[_OFF_OP] == wire.Op.RESULT and (_bitmap(data) >> wk.w) & 1)) and \
                after["stray_replies"] == before["stray_replies"]:  # (not dropped as stray)
            wk.acked.setdefault(counted_in, self.moment())
        # (after the acknowledgement: a reply that shows a new state and counts my flight
        # tells me its fate before the reset drops what I have in flight)
        self._note_reset(wk, before, after)
        if data[_OFF_OP] == wire.Op.ACK:
            if after["own_applied"] != before["own_applied"]:
                self.rec.applied.add(counted_in)  # (its lanes: _take_results)
            return
        if data[_OFF_OP] != wire.Op.RESULT:
            return
        wk.results_heard.append((self.now, _bitmap(data)))
        self._note_raced(wk, data, flight)
        key = (tag[0], slot, rnd)
        if flight is not None and (_bitmap(data) >> wk.w) & 1 and \
                data[_OFF_CHUNK:_OFF_CHUNK + 4] == flight[_OFF_CHUNK:_OFF_CHUNK + 4]:
            self._check_settled(wk, key, flight)
        if len(after["results"]):
            self.rec.applied.add(key)
        if after["duplicate_results"] == before["duplicate_results"]:
            wk.applied.add(key)  # applied now, or by the ACK of my own contribution before
            wk.got.append((self.now, struct.unpack_from("!I", data, _OFF_CHUNK)[0]))
        if len(after["results"]):  # applied now (not a result an ACK applied before)
            self._applied_lanes(wk, data)
        elif key not in wk.applied and not self._made_every_call(wk):  # (else unused)
            wk.dropped.append(key)

    def _note_raced(self, wk: Worker, data: bytes, flight: bytes | None) -> None:
        """A RESEND to my contribution (not a JOIN) of a partial round, of another chunk, that
        closed without me: the round was raced and lost."""
        if flight is None or flight[_OFF_FLAGS] & wire.Flag.JOIN:
            return
        (_v, _op, flags, mode, _job, w, _count, slot, _r, quorum, rnd, chunk,
         bitmap) = wire.HEADER_STRUCT.unpack_from(data)
        mine = struct.unpack_from("!I", flight, _OFF_CHUNK)[0]
        if flags & wire.Flag.RESEND and mode == wire.Mode.PARTIAL and w == wk.w and \
                not (bitmap >> wk.w) & 1 and chunk != mine and \
                rnd == struct.unpack_from("!I", flight, _OFF_ROUND)[0]:
            wk.raced.append((self.now, mine, chunk, quorum,
                             wk.sent_at.get((slot, flags & wire.TX_MASK), self.now)))

    def _note_reset(self, wk: Worker, before: dict[str, Any], after: dict[str, Any]) -> None:
        """The datagram showed the engine a new switch state (its stats `before` and `after`
        it): between calls it dropped what it had in flight then (a call under way aborts, and
        its end is noted as well)."""
        if after["state_resets"] != before["state_resets"]:
            wk.aborts.append(self.moment())

    def _check_settled(self, wk: Worker, key: tuple[int, int, int], flight: bytes) -> None:
        """A RESULT with my bit and my flight's chunk settles the flight as counted; on the TNA
        model, whose member_seq keeps no refusal mark, so may the STALE_COUNTED that answers
        its latest transmission once the round's RESULT is lost. Where the round counted
        another transmission of mine, with other lanes (one an abort forgot, relaunched with
        more gradient at the same round; on the TNA model also one of another chunk, which a
        probe of the flight's was refused beside), note the flight's chunk and lanes: the
        worker's books there are off by the difference (docs/protocol.md §10, the limit
        "A relaunch meets its forgotten copy")."""
        mine = [lanes for w, _c, lanes in self.rec.closed.get(key, ()) if w == wk.w]
        sent = self._lanes(flight)
        if mine and not any(np.array_equal(m, sent) for m in mine):
            chunk = struct.unpack_from("!I", flight, _OFF_CHUNK)[0]
            wk.missettled[chunk] = wk.missettled.get(chunk, 0) + np.abs(sent) + sum(
                np.abs(m) for m in mine)

    def _flight(self, wk: Worker, slot: int) -> bytes | None:
        """The datagram of the worker's flight on `slot` (absolute), if any."""
        for i, data, _amount in wk.engine.flights():
            if i == slot - self.plan.slot_base:
                return data
        return None

    def _lanes(self, data: bytes) -> np.ndarray:
        return np.frombuffer(data, ">i4", wire.LANES, H).astype(np.int64)

    def _applied_lanes(self, wk: Worker, data: bytes) -> None:
        """A result (or my own lanes, for an ACK) applied: note its non-finite lanes."""
        lanes = self._lanes(data)
        bad = np.flatnonzero(np.abs(lanes) > self.max_sum)
        if bad.size:
            chunk = struct.unpack_from("!I", data, _OFF_CHUNK)[0]
            wk.applied_nonfinite.append((self.now, chunk, frozenset(bad.tolist())))

    def _note_absorbed(self, wk: Worker) -> None:
        """Sentinels of the worker's the engine absorbed since the last look, with the time."""
        absorbed = wk.engine.absorbed()
        for cell in absorbed[wk.absorbed_seen:]:
            wk.absorbed.setdefault(divmod(cell, wire.LANES), []).append(self.now)
        wk.absorbed_seen = len(absorbed)

    def _made_every_call(self, wk: Worker) -> bool:
        p = self.plan
        return not wk.in_call and len(wk.calls) == p.calls * len(p.sizes)

    def _link(self, up: bool, who: int, data: bytes) -> None:
        link = self.plan.up if up else self.plan.down
        lossy = self.now < self.plan.lossy_until
        copies = 1
        lost = lossy and self.rng.random() < link.loss
        if up and data[_OFF_OP] == wire.Op.CONTRIB:
            self._count_up_loss(who, data, lost)
        if not up and (data[_OFF_OP] == wire.Op.RESULT and (_bitmap(data) >> who) & 1 or
                       data[_OFF_OP] == wire.Op.RESYNC and data[_OFF_REASON] in _STALE_REASONS):
            self._count_answer_loss(who, data, lost)
        if lost:
            if self.trace is not None:
                self._say(f"lost {'up' if up else 'down'} (w{who}): {self.describe(data)}")
            return
        if lossy and self.rng.random() < link.dup:
            copies = 2
        # Worker -> switch traffic stays in order wherever a slot can run async (the
        # protocol's fault model, docs/protocol.md §9 "Swap storms").
        fifo = link.fifo or (up and self.may_async and not self.plan.reorder_async)
        for _ in range(copies):
            t = self.now + link.delay + (self.rng.uniform(0, link.jitter) if lossy else 0.0)
            if up:
                t += self.plan.switch_delay  # a slow switch takes this long to see a packet
            if fifo:
                t = max(t, self.last_arrival.get((("up" if up else "down"), who), 0.0))
                self.last_arrival[("up" if up else "down", who)] = t
            if up:
                self.at(t, self._switch_receive, who, data)
            else:
                self.at(t, self._deliver, self.workers[who], data)

    def _count_up_loss(self, who: int, data: bytes, lost: bool) -> None:
        """Losses in a row of one contribution (rule lossy_straggler's evidence)."""
        slot = struct.unpack_from("!H", data, _OFF_SLOT)[0]
        which = data[_OFF_ROUND:_OFF_ROUND + 4] + data[_OFF_CHUNK:_OFF_CHUNK + 4]
        before, streak = self.up_losses.get((who, slot), (b"", 0))
        streak = (streak if before == which else 0) + 1 if lost else 0
        self.up_losses[(who, slot)] = (which, streak)
        if streak >= 2:
            self.rec.loss_streaks.append((self.now, who, slot))

    def _count_answer_loss(self, who: int, data: bytes, lost: bool) -> None:
        """Losses in a row of the answer to one round of who's (rule lossy_straggler's
        evidence: the round's RESULT lost, then the RESEND its retransmission met; or the
        STALE replies that name the slot's open round to a contribution sent to another,
        a first contact's probe above all, lost one after the other)."""
        slot = struct.unpack_from("!H", data, _OFF_SLOT)[0]
        which = data[_OFF_ROUND:_OFF_ROUND + 4]
        before, streak = self.down_losses.get((who, slot), (b"", 0))
        streak = (streak if before == which else 0) + 1 if lost else 0
        self.down_losses[(who, slot)] = (which, streak)
        if streak >= 2:
            self.rec.answer_loss_streaks.append((self.now, who, slot))

    def moment(self) -> tuple[float, int]:
        """Now, and the order of what happens at this simulated time: many events share an
        instant (a reply answered, then the call aborted, at one arrival time)."""
        self.moments += 1
        return self.now, self.moments

    def _note_parks(self, wk: Worker) -> None:
        """Note the flights the engine parked since the worker's last step (each flight by its
        slot, chunk and round, which its retransmissions keep)."""
        rounds = {i: struct.unpack_from("!I", d, _OFF_ROUND)[0]
                  for i, d, _a in wk.engine.flights()}
        now = frozenset((i, chunk, rounds[i]) for i, chunk in wk.engine.parked())
        for i, chunk, _round in now - wk.parked_now:
            wk.parks.append((self.now, self.plan.slot_base + i, chunk))
        wk.parked_now = now

    def _sent(self, wk: Worker) -> None:
        for d in wk.engine.take_sent():
            self.rec.packets += 1
            if d[_OFF_OP] == wire.Op.CONTRIB:
                self.rec.launched.setdefault((wk.w, d[_OFF_CHUNK:_OFF_CHUNK + 4] + d[H:]),
                                             self.moment())
                wk.sent_at[(struct.unpack_from("!H", d, _OFF_SLOT)[0],
                            d[_OFF_FLAGS] & wire.TX_MASK)] = self.now
                wk.sent.append((self.now, struct.unpack_from("!H", d, _OFF_SLOT)[0],
                                struct.unpack_from("!I", d, _OFF_CHUNK)[0]))
            if self.trace is not None:
                self._say(f"w{wk.w} -> {self.describe(d)}")
            self._link(True, wk.w, d)

    # ------------------------------------------------------------ the switch
    def _switch_receive(self, w: int, data: bytes) -> None:
        if self.now < self.switch_up_at:
            return  # restarting: nothing answers
        sw = self.switch
        before = sw.counted(w)
        m = self.workers[w].member
        out = sw.pipeline.process_datagram(m.ip, m.udp_port, data)
        if self.trace is not None:
            self._say(f"switch <- {self.describe(data)}"
                      f"{' (counted)' if sw.counted(w) != before else ''}"
                      f"{'' if out else ' (absorbed/dropped)'}")
        if sw.counted(w) != before:
            self._counted(w, data)
        else:
            self._note_copy_refused(w, data, out)
        closed = False
        for ip, port, reply in out:
            self.rec.packets += 1
            if reply[_OFF_OP] in (wire.Op.RESULT, wire.Op.ACK):  # they carry the install tag
                self.state_of[id(reply)] = (self.rec.state_resets, reply)  # (kept alive)
            if reply[_OFF_OP] == wire.Op.RESYNC and \
                    reply[_OFF_REASON] == wire.ResyncReason.STALE_COUNTED and \
                    isinstance(sw.pipeline, TnaModelPipeline):
                self.stale_counted_of[id(reply)] = (self.rec.state_resets, reply)
            if reply[_OFF_OP] == wire.Op.RESULT and not closed and not (
                    reply[_OFF_FLAGS] & wire.Flag.RESEND):
                closed = True
                self._closed(reply)
            if self.trace is not None:
                self._say(f"switch -> w{self.by_addr[(ip, port)]} {self.describe(reply)}")
            self._link(False, self.by_addr[(ip, port)], reply)

    def _counted(self, w: int, data: bytes) -> None:
        slot = struct.unpack_from("!H", data, _OFF_SLOT)[0]
        chunk = struct.unpack_from("!I", data, _OFF_CHUNK)[0]
        lanes = np.frombuffer(data, ">i4", wire.LANES, H).astype(np.int64)
        for j in np.flatnonzero(lanes == self.sentinel):
            self.rec.sentinels.setdefault((w, chunk, int(j)), []).append(self.now)
        acc = self.rec.counted.setdefault((w, chunk), np.zeros(wire.LANES, np.int64))
        acc += lanes
        self.rec.last_counted[(w, slot)] = data[_OFF_CHUNK:_OFF_CHUNK + 4] + data[H:]
        self.open.setdefault(slot, []).append((w, chunk, lanes))
        sent = self.rec.launched.get((w, data[_OFF_CHUNK:_OFF_CHUNK + 4] + data[H:]), (0.0, 0))
        crossed = any(sent[0] < t <= self.now for t, _kind in self.rec.resets)
        self.rec.contribs.append([w, chunk, lanes, None, crossed, sent])
        self.open_contribs.setdefault(slot, []).append(self.rec.contribs[-1])
        self.counted_as[(w, data[_OFF_CHUNK:_OFF_CHUNK + 4] + data[H:])] = self.rec.contribs[-1]

    def _note_copy_refused(self, w: int, data: bytes, out: list) -> None:
        """A copy of the contribution w has counted in the slot's open round, another round
        field of it (its first contact's sequence number), answered STALE_ROUND: the refusal
        mark replaces that count's record in w's member cell (docs/protocol.md §4 step 8), and a
        later question about the count is answered "not counted" (limit_stale_copy)."""
        slot = struct.unpack_from("!H", data, _OFF_SLOT)[0]
        chunk = struct.unpack_from("!I", data, _OFF_CHUNK)[0]
        lanes = np.frombuffer(data, ">i4", wire.LANES, H).astype(np.int64)
        if not any(c == chunk and who == w and np.array_equal(held, lanes)
                   for who, c, held in self.open.get(slot, [])):
            return
        if any(r[_OFF_OP] == wire.Op.RESYNC and r[_OFF_REASON] == wire.ResyncReason.STALE_ROUND
               and r[_OFF_MODE] != wire.Mode.ASYNC for _ip, _port, r in out):
            acc = self.rec.erased.setdefault((w, chunk), np.zeros(wire.LANES, np.int64))
            acc += np.abs(lanes)

    def _closed(self, result: bytes) -> None:
        """A round closed: its sum must be what the switch counted into it, bit for bit."""
        (_v, _op, _fl, mode, _job, _w, count, slot, _r, _q, rnd, chunk,
         bitmap) = wire.HEADER_STRUCT.unpack_from(result)
        state = self.rec.state_resets
        self.rec.emitted.add((state, slot, rnd, chunk, count, bitmap))
        parts = self.open.pop(slot, [])
        self.rec.closed[(state, slot, rnd)] = parts
        for c in self.open_contribs.pop(slot, []):
            c[3] = (state, slot, rnd)
        want = np.zeros(wire.LANES, np.int64)
        bits = 0
        for w, c, lanes in parts:
            want += lanes
            bits |= 1 << w
            if c != chunk:
                self.rec.violations.append(
                    f"exactly-once: slot {slot} round {rnd} (chunk {chunk}) closed with worker "
                    f"{w}'s contribution for chunk {c} in it")
        got = np.frombuffer(result, ">i4", wire.LANES, H).astype(np.int64)
        # A round's lane decodes non-finite exactly when a sentinel was counted into it.
        held = np.zeros(wire.LANES, bool)
        for _w, _c, lanes in parts:
            held |= lanes == self.sentinel
        decoded = np.abs((got + (1 << 31)) % (1 << 32) - (1 << 31)) > self.max_sum
        self.rec.nonfinite_rounds += bool(decoded.any())
        if not np.array_equal(held, decoded):
            j = int(np.flatnonzero(held != decoded)[0])
            self.rec.violations.append(
                f"non-finite: slot {slot} round {rnd} (chunk {chunk}) lane {j} decodes "
                f"{'non-finite' if decoded[j] else 'finite'}, but {'no' if not held[j] else 'a'}"
                f" sentinel was counted into it")
        if bits != bitmap or len(parts) != count or not np.array_equal(
                (want - got) % (1 << 32), np.zeros(wire.LANES, np.int64)):
            self.rec.violations.append(
                f"exactly-once: slot {slot} round {rnd} closed with bitmap {bitmap:#x} count "
                f"{count}, but the switch counted bitmap {bits:#x} ({len(parts)} contributions)"
                f"{'' if np.array_equal(want % (1 << 32), got % (1 << 32)) else ', other sums'}")

    def _wipe(self) -> None:
        """The switch's open rounds are gone: what they counted is in no sum."""
        for parts in self.open.values():
            for w, chunk, lanes in parts:
                self.rec.counted[(w, chunk)] -= lanes
        self.open.clear()
        self.open_contribs.clear()
        self.rec.last_counted.clear()
        self.rec.state_resets += 1

    # ------------------------------------------------------------ faults
    def _fault(self, f: Any) -> None:
        sw = self.switch
        self._say(f"fault {f.kind} mode {f.mode} quorum {f.quorum} worker {f.worker} "
                  f"length {f.length:g}{f' rank {f.rank}' if f.rank >= 0 else ''}")
        if f.kind == "swap":
            self.rec.swaps += 1
            self.plan_mode = (f.mode, f.quorum)
            self.rec.modes.append((self.now, f.mode, f.quorum))
            sw.swap(f.mode, f.quorum)
        elif f.kind == "pause":
            wk = self.workers[f.worker]
            wk.paused_until = max(wk.paused_until, self.now + f.length)
            self.at(wk.paused_until, self._resume, wk)
        elif f.kind == "rank_stall":  # the host's next reduce waits for the rank
            wk = self.workers[f.worker]
            wk.stalled_until = max(wk.stalled_until, self.now + f.length)
        elif f.kind == "death":  # a rank's death is its host's (hosts.py)
            wk = self.workers[f.worker]
            wk.dead = True
            wk.inbox.clear()
            if all(x.finished or x.dead for x in self.workers):
                self._quiesce_start()
        elif f.kind == "readd":
            self.rec.resets.append((self.now, f.kind))
            mode = getattr(self, "plan_mode", (self.plan.mode, self.plan.quorum))
            if sw.installed:
                sw.remove()
            self._wipe()
            self.at(self.now + f.length, self._reinstall, mode)
        elif f.kind in ("restart", "restart_bare"):
            self.rec.resets.append((self.now, f.kind))
            mode = getattr(self, "plan_mode", (self.plan.mode, self.plan.quorum))
            self.switch = Switch(self.make_pipeline, sw.job)
            self._wipe()
            self.switch_up_at = self.now + f.length
            if f.kind == "restart":
                self.at(self.now + f.length, self._reinstall, mode)

    def _reinstall(self, mode: tuple[int, int]) -> None:
        if not self.switch.installed:
            self.switch.install(self._epoch(), *mode)

    # ------------------------------------------------------------ the end
    def _quiesce_start(self) -> None:
        if getattr(self, "_quiescing", False):
            return
        self._quiescing = True
        end = max(self.now, self.plan.faults_end, self.plan.lossy_until) + QUIESCE
        self.at(self.now, self._quiesce_tick, end)

    def _quiesce_tick(self, end: float) -> None:
        """Between calls a worker's packets in flight keep retrying, and its suspected rounds
        are judged (poll_results: an ACKed contribution whose round's result never came flags
        the replica once missed_after has passed)."""
        for wk in self.workers:
            if wk.dead or self.now < wk.paused_until:
                continue
            e = wk.engine
            e.set_time(self.now)
            for d in wk.inbox:
                self._hand(wk, *d)
            wk.inbox.clear()
            e.tick(self.now)
            e.poll(0.0)  # what poll_results does after its wait: judge suspected rounds
            self._note_absorbed(wk)
            self._sent(wk)
        if self.now < end:
            self.at(self.now + 0.01, self._quiesce_tick, end)
        else:
            self.events.clear()
            for wk in self.workers:
                wk.in_call = False


def _bitmap(data: bytes) -> int:
    return wire.HEADER_STRUCT.unpack_from(data)[-1]


def simulate(plan: Plan, target: str, **options: Any) -> tuple[Record, Sim]:
    sim = Sim(plan, target, **options)
    return sim.run(), sim
