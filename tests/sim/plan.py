"""What one seed is: a job's shape, its network and its faults, drawn from the seed.

A Plan is plain data (JSON-able), so a failing run can be shrunk by dropping faults from
it and replayed exactly: the network's randomness comes from the seed, not from the plan.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field, replace

from hysync import wire
from hysync.controlplane.policy.policies import PolicyConfig

SYNC, PARTIAL, ASYNC = int(wire.Mode.SYNC), int(wire.Mode.PARTIAL), int(wire.Mode.ASYNC)

# Engine timing of the simulated workers (seconds). dead_after bounds every failure; the
# liveness bound of a call once faults stop is LIVENESS_BOUND simulated seconds. A plan with
# a slow switch fits rto_max and dead_after to it (Plan.rto_max, Plan.dead_after).
RTO_INITIAL, RTO_MIN, RTO_MAX = 0.02, 0.002, 0.5
DEAD_AFTER, STALL_AFTER, MISSED_AFTER, JOIN_AFTER = 3.0, 0.005, 0.25, 1.0
LIVENESS_BOUND = DEAD_AFTER + 2 * JOIN_AFTER + 2 * RTO_MAX
SCALE = float(1 << 20)

# The engine's schedule that demonstrations pinned before seed 9045913 were found on: the
# silent window's probe period read as a difference of two times, which rounded below the
# period when a probe's own retransmission fell due exactly one period after it and deferred
# it by rto_max. Tested as its timers are armed (native/worker/flights.cc, Flights::expire),
# every such retransmission goes out a period sooner, and those seeds and plans no longer meet
# their situations. They replay with the period read as before (Faults::
# probe_period_by_difference): the checker's rules and the protocol's marks they show do not
# depend on that timer.
PROBE_PERIOD_AS_FOUND = {"probe_period_by_difference": True}
# The engine's schedule that demonstrations pinned before seed 9009951 were found on: a partial
# RESULT that another member's contribution closed gave an RTT sample, the wait in a round held
# open for the others taken for a round trip (native/worker/replies.cc, Replies::on_full).
# Without those samples the RTO of a partial job learns round trips only, every partial
# schedule moves, and those seeds and plans no longer meet their situations (each still
# passes on the engine's own). They replay with such samples taken (Faults::
# held_result_samples_rtt): the checker's rules and the protocol's rules they show do not
# depend on what the RTO learned.
HELD_RESULT_AS_FOUND = {"held_result_samples_rtt": True}


@dataclass(frozen=True)
class Link:
    """One direction between the workers and the switch."""
    loss: float = 0.0
    dup: float = 0.0
    delay: float = 0.0005  # seconds, the least one-way delay
    jitter: float = 0.0    # up to this much more, drawn per packet
    fifo: bool = True      # False: a packet may overtake an earlier one (reordering)


@dataclass(frozen=True)
class Fault:
    at: float      # simulated seconds
    kind: str      # swap | pause | readd | restart | restart_bare | death | rank_stall
    mode: int = 0
    quorum: int = 0
    worker: int = 0
    length: float = 0.0  # pause, rank_stall: how long; readd: how long the job stays removed
    # death, rank_stall: the rank of host `worker` it strikes (-1: the host's leader process
    # itself, as one rank per host has it); a rank's death is its host's (tests/sim/hosts.py)
    rank: int = -1


@dataclass(frozen=True)
class Plan:
    seed: int
    workers: int
    slots: int
    slot_base: int
    sizes: tuple[int, ...]       # elements per key, every worker registers them in order
    calls: int                   # iterations; each calls allreduce once per key
    mode: int                    # the mode and quorum installed with the job
    quorum: int
    up: Link = Link()            # worker -> switch
    down: Link = Link()          # switch -> worker
    compute: float = 0.002       # seconds between two calls of a worker, at most
    faults: tuple[Fault, ...] = ()
    faults_end: float = 0.0      # no swap, pause or restart after this
    lossy_until: float = 0.0     # no loss, duplication or jitter after this
    slow_worker: int = -1        # this worker computes `slow_factor` times longer (a straggler)
    slow_factor: float = 1.0
    # Elements a worker's gradient holds that are not finite, or beyond the quantizer's range:
    # (worker, call index, element of that call's key, one of NONFINITE_VALUES).
    nonfinite: tuple[tuple[int, int, int, int], ...] = ()
    # A slow switch: every packet reaches the pipeline this much later (10-100x `compute`),
    # as on a software switch under load.
    switch_delay: float = 0.0
    # Worker -> switch datagrams may overtake each other on a link that is not FIFO even where
    # a slot runs async (otherwise such a job's up links keep their order).
    reorder_async: bool = False
    # A swap with the switch's state lost (a restart or a re-install) while it latches.
    latch_loss: bool = False
    # Every member (`workers`) is a host of this many ranks, reduced on the host first
    # (tests/sim/hosts.py); 1: each member is one rank.
    ranks_per_host: int = 1

    # The engine's timing fitted to the switch it talks to (docs/protocol.md §9, "Timing"): an
    # RTO capped below the switch's round trip retransmits before every answer comes back, so
    # every "not counted" answers an earlier transmission, which the echo rule ignores, and
    # the call fails by dead_after with the switch answering all along. The round trip of
    # the simulated network is the slow switch's delay (one way, to the pipeline) and at most
    # a few milliseconds of links.
    @property
    def rto_max(self) -> float:
        """The RTO's cap: at least twice the switch's round trip."""
        return max(RTO_MAX, 2 * self.switch_delay)

    @property
    def dead_after(self) -> float:
        """Silence before the switch counts as gone: two round trips more than on a fast
        switch (a packet then takes a round trip to meet the open round, another to close)."""
        return DEAD_AFTER + 2 * self.switch_delay

    @property
    def liveness_bound(self) -> float:
        """A call ends this long after the later of its start and the faults' end."""
        return LIVENESS_BOUND + (self.dead_after - DEAD_AFTER) + 2 * (self.rto_max - RTO_MAX)

    @property
    def fail_within(self) -> float:
        """The most a call may run past the later of its start and its cause, for the
        NoReplyError rules: the dead timer, started by the first packet sent after the last
        reply heard (at most one back-off after the cause), and the reply's way back."""
        return self.dead_after + 2 * self.rto_max

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @staticmethod
    def from_json(text: str) -> Plan:
        d = json.loads(text)
        d["sizes"] = tuple(d["sizes"])
        d["up"], d["down"] = Link(**d["up"]), Link(**d["down"])
        d["faults"] = tuple(Fault(**f) for f in d["faults"])
        d["nonfinite"] = tuple(tuple(x) for x in d.get("nonfinite", ()))
        return Plan(**d)

    def kinds(self) -> set[str]:
        extra = {"slow_switch": self.switch_delay > 0, "async_reorder": self.reorder_async,
                 "latch_loss": self.latch_loss, "hosts": self.ranks_per_host > 1}
        return ({"rank_death" if f.kind == "death" and f.rank >= 0 else f.kind
                 for f in self.faults} | {k for k, drawn in extra.items() if drawn})

    def without(self, index: int) -> Plan:
        return replace(self, faults=self.faults[:index] + self.faults[index + 1:])


# What an injected element is (docs/protocol.md §9, "Non-finite values"): NaN, an infinity,
# or a finite value far beyond the quantizer's range (an overflow).
NONFINITE_VALUES = (float("nan"), float("inf"), float("-inf"), 1e30)


def _with_nonfinite(plan: Plan) -> Plan:
    """Half the seeds give members' gradients 1-4 non-finite elements: at one member, or at
    every member in the same call and element (an overflow that hits the whole job, as a
    loss scale too high does; a round then holds several sentinels, and a member it closed
    without has its own absorbed there). Drawn from a stream of their own, after the rest
    of the plan: every other field of a seed's plan is what it was before these were drawn,
    so earlier seeds replay as they did."""
    rng = random.Random(plan.seed * 1_000_033 + 5)
    if rng.random() < 0.5:
        return plan
    calls = plan.calls * len(plan.sizes)
    out = set()
    for _ in range(rng.randint(1, 4)):
        call = rng.randrange(calls)
        element = rng.randrange(plan.sizes[call % len(plan.sizes)])
        kind = rng.randrange(len(NONFINITE_VALUES))
        every = rng.random() < 0.5
        for w in range(plan.workers) if every else (rng.randrange(plan.workers),):
            out.add((w, call, element, kind))
    return replace(plan, nonfinite=tuple(sorted(out)))


BASE_KINDS = ("swap", "storm", "pause", "readd", "restart", "restart_bare", "death")
# Drawn from a stream of their own (_with_extra_faults), after the rest of the plan: a seed's
# other fields are what they were before these existed.
EXTRA_KINDS = ("slow_switch", "async_reorder", "latch_loss")
FAULT_KINDS = BASE_KINDS + EXTRA_KINDS
# Faults inside a host, drawn only where the plan draws a host layout (`hosts`, below): a rank
# that stalls (its host computes late: a straggler for a while) and a rank that dies (its
# host's collective fails and the host's leader leaves the job: tests/sim/hosts.py).
HOST_KINDS = ("rank_stall", "rank_death")
# `hosts` of draw(): "drawn" gives each seed 1-8 ranks per host, and BIG_JOB_SHARE of the
# seeds the largest job one switch takes, BIG_JOB (hosts, ranks per host): 128 ranks on 32
# hosts; "HxR" fixes H hosts of R.
HOSTS_DRAWN = "drawn"
MAX_RANKS_PER_HOST = 8
BIG_JOB, BIG_JOB_SHARE = (wire.MAX_WORKERS, 4), 0.02
# Not a fault kind: `--kinds straggler` draws the straggler plans (draw_straggler) instead.
STRAGGLER = "straggler"


# Fault models (docs/protocol.md §10, "The fault model per target"): which plans a seed
# draws for a switch target. FULL is every fault of §10 (the v1model program, the native
# data plane, the softswitch). TOFINO is the Tofino program's (the `tna-model` target): no
# slot enters or leaves async by a swap, since the controller refuses such a swap on that
# program (docs/tofino.md, difference 3), and the network never duplicates a worker's
# datagram (difference 14: the program has no refusal mark and no JOIN mark).
FULL, TOFINO = "full", "tofino"
FAULT_MODELS = (FULL, TOFINO)
# The fault model of the program each simulation target stands for (run.py's targets).
TARGET_FAULT_MODEL = {"native": FULL, "python": FULL, "tna-model": TOFINO}


@dataclass
class Draw:
    """Which fault kinds a batch of seeds may draw (all by default)."""
    kinds: tuple[str, ...] = FAULT_KINDS
    targets: tuple[str, ...] = field(default_factory=tuple)


def _mode(rng: random.Random, workers: int) -> tuple[int, int]:
    mode = rng.choice((SYNC, PARTIAL, ASYNC))
    quorum = 0 if mode == SYNC or rng.random() < 0.3 else rng.randint(1, workers)
    return mode, quorum


def _swap_mode(rng: random.Random, workers: int, installed: tuple[int, int],
               model: str) -> tuple[int, int]:
    """The mode and quorum a swap sets: drawn as FULL draws it (the same draws of `rng`, so
    a seed's plans under either model hold the same faults at the same times), then, under
    TOFINO, kept on the `installed` mode's side of async. A job installed async keeps its
    mode and quorum (the controller allows setting async on async slots, and writes
    nothing); for one installed sync or partial, a swap into async becomes partial with the
    quorum drawn, or sync where that is 0."""
    mode, quorum = _mode(rng, workers)
    if model == FULL or (installed[0] != ASYNC and mode != ASYNC):
        return mode, quorum
    if installed[0] == ASYNC:
        return installed
    return (PARTIAL, quorum) if quorum else (SYNC, 0)


def host_layout(hosts: str) -> tuple[int, int] | None:
    """`hosts` of draw(): None for "drawn", else (hosts, ranks per host) of "HxR"."""
    if hosts == HOSTS_DRAWN:
        return None
    try:
        h, r = (int(x) for x in hosts.lower().split("x"))
    except ValueError:
        h = r = 0
    if not (2 <= h <= wire.MAX_WORKERS and 1 <= r <= MAX_RANKS_PER_HOST):
        raise ValueError(f"hosts {hosts!r}: '{HOSTS_DRAWN}' (1-{MAX_RANKS_PER_HOST} ranks per "
                         f"host, drawn per seed) or HxR, 2-{wire.MAX_WORKERS} hosts of "
                         f"1-{MAX_RANKS_PER_HOST} ranks (e.g. 32x4: 128 ranks)")
    return h, r


def draw(seed: int, kinds: tuple[str, ...] = FAULT_KINDS, hosts: str = "",
         model: str = FULL) -> Plan:
    """The plan of `seed`: 2-8 workers, 1-8 slots, 1-3 keys, 2-12 calls, a lossy,
    duplicating, jittery network per direction, 0-12 faults of `kinds` and, in half the
    seeds, non-finite gradient elements (_with_nonfinite); or, with kinds
    `("straggler",)`, the straggler plan of `seed` (draw_straggler). With `hosts`
    (host_layout), every worker is a host of several ranks (_with_hosts); "HxR" also fixes
    the number of workers to H, as "drawn" does (to BIG_JOB) in BIG_JOB_SHARE of the seeds.
    Without, every worker is one rank, as it always was.

    `model` is the fault model drawn within (FULL, TOFINO). Under FULL a seed's plan is what
    it always was. Under TOFINO it is FULL's plan of the seed (the same job, network and
    faults at the same times) but that the uplink never duplicates and every swap stays on
    the installed mode's side of async (_swap_mode)."""
    if model not in FAULT_MODELS:
        raise ValueError(f"fault model {model!r}: one of {', '.join(FAULT_MODELS)}")
    if kinds == (STRAGGLER,):
        if hosts:
            raise ValueError("the straggler plans draw no host layout: leave hosts out")
        return draw_straggler(seed, model)
    layout = host_layout(hosts) if hosts else None
    if hosts == HOSTS_DRAWN and random.Random(seed * 1_000_039 + 7).random() < BIG_JOB_SHARE:
        layout = BIG_JOB
    rng = random.Random(seed)
    workers = rng.randint(2, 8)
    if layout is not None:
        workers = layout[0]
    slots = rng.randint(1, 8)
    slot_base = rng.randrange(0, 64)
    sizes = tuple(rng.choice((1, 63, 64, 65, rng.randint(1, 64 * 3 * slots)))
                  for _ in range(rng.randint(1, 3)))
    calls = rng.randint(2, 12)
    mode, quorum = _mode(rng, workers)

    def link() -> Link:
        lossy = rng.random() < 0.7
        return Link(loss=rng.uniform(0, 0.2) if lossy else 0.0,
                    dup=rng.uniform(0, 0.1) if lossy else 0.0,
                    delay=rng.uniform(0.0001, 0.002), jitter=rng.choice((0.0, 0.0005, 0.005)),
                    fifo=rng.random() < 0.5)

    up, down = link(), link()
    if model == TOFINO:  # drawn as FULL draws it: the rest of the plan is FULL's
        up = replace(up, dup=0.0)
    faults: list[Fault] = []
    horizon = calls * (0.01 + 0.02 * workers)  # roughly the fault-free run's length
    allowed = [k for k in kinds if k in BASE_KINDS]
    for _ in range(rng.randint(0, 12) if allowed else 0):
        kind = rng.choice(allowed)
        at = rng.uniform(0, horizon)
        if kind == "swap":
            m, q = _swap_mode(rng, workers, (mode, quorum), model)
            faults.append(Fault(at, "swap", m, q))
        elif kind == "storm":  # swaps a packet apart, between any modes
            gap = rng.choice((0.0002, 0.001, 0.003))
            for j in range(rng.randint(5, 40)):
                m, q = _swap_mode(rng, workers, (mode, quorum), model)
                faults.append(Fault(at + j * gap, "swap", m, q))
        elif kind == "pause":
            faults.append(Fault(at, "pause", worker=rng.randrange(workers),
                                length=rng.uniform(0.05, DEAD_AFTER / 3)))
        elif kind == "readd":
            faults.append(Fault(at, "readd", length=rng.choice((0.0, 0.01, 0.2))))
        elif kind in ("restart", "restart_bare"):
            faults.append(Fault(at, kind, length=rng.choice((0.0, 0.01, 0.2))))
        elif kind == "death" and workers > 2:
            faults.append(Fault(at, "death", worker=rng.randrange(workers)))
    faults.sort(key=lambda f: f.at)
    end = max((f.at + f.length for f in faults), default=0.0)
    plan = _with_nonfinite(Plan(seed, workers, slots, slot_base, sizes, calls, mode, quorum,
                                up, down, rng.choice((0.0005, 0.002, 0.01)), tuple(faults),
                                end, rng.uniform(0, 2 * horizon)))
    plan = _with_extra_faults(plan, kinds, horizon, model)
    return _with_hosts(plan, kinds, horizon, layout[1] if layout else 0) if hosts else plan


def _with_hosts(plan: Plan, kinds: tuple[str, ...], horizon: float, ranks: int) -> Plan:
    """Hosts of `ranks` ranks each (0: 1-8, drawn) and 0-3 faults of HOST_KINDS in `kinds`:
    a rank that stalls for 0.05 s to dead_after / 3 (as a pause is bounded: a host slower
    than dead_after is declared dead), a rank that dies. Drawn from a stream of their own,
    after the rest of the plan: the other fields are the seed's plan without hosts."""
    rng = random.Random(plan.seed * 1_000_039 + 13)
    drawn = rng.randint(1, MAX_RANKS_PER_HOST)
    ranks = ranks or drawn
    allowed = [k for k in HOST_KINDS if k in kinds]
    faults = list(plan.faults)
    end = plan.faults_end
    for _ in range(rng.randint(0, 3) if allowed else 0):
        kind, at = rng.choice(allowed), rng.uniform(0, horizon)
        host, rank = rng.randrange(plan.workers), rng.randrange(ranks)
        if kind == "rank_stall":
            length = rng.uniform(0.05, DEAD_AFTER / 3)
            faults.append(Fault(at, "rank_stall", worker=host, length=length, rank=rank))
            end = max(end, at + length)
        elif plan.workers > 2:  # (as a host's death is drawn)
            faults.append(Fault(at, "death", worker=host, rank=rank))
    return replace(plan, ranks_per_host=ranks, faults=tuple(sorted(faults, key=lambda f: f.at)),
                   faults_end=end)


def _with_extra_faults(plan: Plan, kinds: tuple[str, ...], horizon: float,
                       model: str) -> Plan:
    """The fault kinds of EXTRA_KINDS, each in 20% of the seeds that may draw it (in every
    seed of a batch of that kind alone): a slow switch (10-100x the compute step), worker ->
    switch reordering where slots run async, and a swap whose switch loses its state
    (restart, bare restart or re-install) 0-1 ms after the swap, while rounds latch the
    new mode (a swap of the fault model's, _swap_mode)."""
    rng = random.Random(plan.seed * 1_000_037 + 11)
    chance = 1.0 if len(kinds) == 1 else 0.2
    drawn = [rng.random() < chance and k in kinds for k in EXTRA_KINDS]
    if drawn[0]:
        plan = replace(plan, switch_delay=plan.compute * rng.uniform(10, 100))
    if drawn[1]:
        plan = replace(plan, reorder_async=True)
    if drawn[2]:
        at = rng.uniform(0, horizon)
        m, q = _swap_mode(rng, plan.workers, (plan.mode, plan.quorum), model)
        loss = Fault(at + rng.choice((0.0, 0.0002, 0.001)),
                     rng.choice(("restart", "readd", "restart_bare")),
                     length=rng.choice((0.0, 0.01, 0.2)))
        faults = tuple(sorted((*plan.faults, Fault(at, "swap", m, q), loss),
                              key=lambda f: f.at))
        plan = replace(plan, faults=faults, latch_loss=True,
                       faults_end=max(plan.faults_end, loss.at + loss.length))
    return plan


def draw_straggler(seed: int, model: str = FULL) -> Plan:
    """The plan of straggler seed `seed`: 3-6 workers, one 4-10x slower than the others,
    1-8 slots, a key of 2-6 chunks per slot (and sometimes a second, smaller key), 30-40
    calls, and the adaptive policy's swaps: async, partial without the straggler, then sync
    for good. The partial and async phases let the fast members' calls run ahead of the
    straggler's; back in sync, their rounds on a slot pair different calls. Under TOFINO
    the policy runs without async (controlplane/policy/runner.py): its probe is partial
    with the smallest quorum it allows, and nothing else of the plan changes."""
    rng = random.Random(seed)
    workers = rng.randint(3, 6)
    slots = rng.randint(1, 8)
    sizes = (wire.LANES * slots * rng.randint(2, 6) - rng.randrange(wire.LANES),)
    if rng.random() < 0.3:
        sizes += (rng.randint(1, wire.LANES * slots),)
    calls = rng.randint(30, 40)
    compute = rng.choice((0.002, 0.005, 0.01))
    horizon = calls * compute * 3
    t_async = rng.uniform(0.05, 0.3) * horizon
    t_partial = t_async + rng.uniform(0.0, 0.2) * horizon
    t_sync = t_partial + rng.uniform(0.05, 0.3) * horizon
    probe = (ASYNC, 0) if model == FULL else (PARTIAL, PolicyConfig().quorum_floor(workers))
    faults = (Fault(t_async, "swap", *probe), Fault(t_partial, "swap", PARTIAL, workers - 1),
              Fault(t_sync, "swap", SYNC))
    lossy = rng.random() < 0.5
    link = Link(loss=0.02 if lossy else 0.0, delay=rng.uniform(0.0001, 0.001),
                jitter=rng.choice((0.0, 0.0005)))
    return _with_nonfinite(Plan(seed, workers, slots, rng.randrange(0, 64), sizes, calls, SYNC,
                                0, link, link, compute, faults, t_sync,
                                t_sync if lossy else 0.0, slow_worker=rng.randrange(workers),
                                slow_factor=rng.uniform(4.0, 10.0)))
