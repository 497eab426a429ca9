"""An executable model of the two-level protocol (docs/protocol.md §11), explored by seed.

Hosts, leaves and a spine exchange abstract packets over links that lose, duplicate and
reorder them, while each level's mode is swapped between sync and partial(q) at random
moments. It runs the rules of §11 on one slot with symbolic gradients: every gradient a host
makes is a unique token, a contribution carries the tokens of its gradient and its residual,
a sum is a multiset of tokens. That makes exactly-once an equation, checked at the end of
every run: every token is in exactly one spine result or in its host's residual.

It is the specification's model, written before the targets implement the rules: the hosts
are §9 reduced to one slot and one chunk per round, not the worker engine, and no switch
restart is drawn (§11 makes one a restart of the job, which §10's single-level runs cover).

    python -m tests.sim.two_level_model --seeds 20000 [--start 0] [--out FILE]
    python -m tests.sim.two_level_model --seed 123 --trace      # replay one seed, verbosely
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

SYNC, PARTIAL = "sync", "partial"
STALE_ROUND, STALE_COUNTED = "STALE_ROUND", "STALE_COUNTED"
SPINE = "spine"


def tokens(c: Counter) -> tuple:
    return tuple(sorted(c.elements()))


@dataclass(frozen=True)
class Packet:
    op: str  # CONTRIB, RESULT, RESYNC
    src: object  # ("host", leaf, host) | ("leaf", leaf) | SPINE
    dst: object
    round: int
    tx: int = 0
    payload: tuple = ()
    bitmap: frozenset = frozenset()
    count: int = 0  # CONTRIB: weight (hosts in a leaf's sum); RESULT: hosts in the sum
    reason: str = ""
    mode: str = SYNC
    resend: bool = False  # a RESULT sent to one member as the answer to its packet
    about: int = -1  # RESYNC: the round of the flight it answers (a host tells by its chunk)
    relayed: bool = False  # RESYNC: the spine's verdict, relayed by a leaf to its hosts


@dataclass
class Level:
    """§4's per-slot state of one switch, with the open round's members and sum."""

    members: int
    mutations: frozenset = frozenset()
    desired: tuple = (SYNC, 0)
    round: int = 0
    count: int = 0
    bitmap: set = field(default_factory=set)
    weight: int = 0
    mode: str = SYNC
    quorum: int = 0
    banks: list = field(default_factory=lambda: [Counter(), Counter()])
    res_valid: bool = False
    res_bitmap: frozenset = frozenset()
    res_count: int = 0
    res_mode: str = SYNC
    member_seq: dict = field(default_factory=dict)  # member -> (round, counted)

    def latch(self) -> None:
        if self.count == 0:
            self.mode, self.quorum = self.desired

    def q(self) -> int:
        return self.members if self.quorum == 0 else min(self.quorum, self.members)

    def mark_refused(self, member, r: int) -> None:
        # Never over a cell that says the member was counted in r or later: a late copy of
        # an older contribution must not erase that a newer one counted (its owner may ask).
        cell = self.member_seq.get(member)
        if cell is None or not (cell[1] and cell[0] >= r) or (
                "late_mark" in self.mutations and cell != (r, True)):
            self.member_seq[member] = (r, False)

    def stale_reason(self, member, r: int) -> str:
        return STALE_COUNTED if self.member_seq.get(member) == (r, True) else STALE_ROUND

    def accept(self, member, r: int, payload: tuple, weight: int) -> None:
        bank = self.banks[r & 1]
        if self.count == 0:
            bank.clear()
        bank.update(payload)
        self.member_seq[member] = (r, True)
        self.bitmap.add(member)
        self.count += 1
        self.weight += weight

    def move_to(self, r: int) -> set:
        """Go to round r with nothing open; returns the members of the abandoned round."""
        abandoned = set(self.bitmap)
        self.round, self.count, self.weight = r, 0, 0
        self.bitmap = set()
        return abandoned


# Each rule of §11 that the model can take out, to show that the checker notices (the test
# finds, for each, a seed that breaks an invariant without it).
MUTATIONS = {
    "refuse": "a leaf does not mark the hosts of a sum the spine refused",
    "hold": "a leaf closes a round while its previous sum is still at the spine",
    "keep_last": "a leaf stores a late verdict over the result of a later round",
    "verdict": "a leaf relays its hosts' bits in a result the spine took without it",
    "weight": "the spine's result counts leaves, not hosts",
    "late_mark": "a refusal mark for a late copy erases that a newer round counted the member",
    "backward": "a leaf moves back to the round of a spine RESYNC the network delayed",
}


class Spine:
    def __init__(self, leaves: int, mutations: frozenset = frozenset()):
        self.s = Level(leaves, mutations)
        self.mutations = mutations
        self.results: dict[int, tuple] = {}  # round -> sum, every result it closed

    def on_contrib(self, p: Packet, out: list) -> None:
        s, leaf, r = self.s, p.src[1], p.round
        s.latch()
        if r == s.round:
            if leaf in s.bitmap:
                return  # duplicate
            s.accept(leaf, r, p.payload, 1 if "weight" in self.mutations else p.count)
            if s.count >= s.q():
                self.close(out)
        elif r == s.round - 1 and s.res_valid:
            if leaf not in s.res_bitmap:
                s.mark_refused(leaf, r)
            out.append(Packet("RESULT", SPINE, p.src, r, p.tx, tokens(s.banks[r & 1]),
                              s.res_bitmap, s.res_count, mode=s.res_mode, resend=True))
        else:
            reason = s.stale_reason(leaf, r)
            if reason == STALE_ROUND:
                s.mark_refused(leaf, r)
            out.append(Packet("RESYNC", SPINE, p.src, s.round, p.tx, reason=reason,
                              mode=s.mode, about=r))

    def close(self, out: list) -> None:
        s = self.s
        r, bitmap, weight = s.round, frozenset(s.bitmap), s.weight
        payload = tokens(s.banks[r & 1])
        self.results[r] = payload
        s.res_valid, s.res_bitmap, s.res_count, s.res_mode = True, bitmap, weight, s.mode
        s.move_to(r + 1)
        for leaf in range(s.members):
            out.append(Packet("RESULT", SPINE, ("leaf", leaf), r, 0, payload, bitmap, weight,
                              mode=s.res_mode))


class Leaf:
    def __init__(self, index: int, hosts: int, mutations: frozenset = frozenset()):
        self.index = index
        self.mutations = mutations
        self.s = Level(hosts, mutations)
        self.up_pending = False
        self.up_round = -1
        self.up_bitmap: frozenset = frozenset()
        self.up_count = 0
        self.up_tx = 0
        self.refused_marks = 0

    def host(self, h: int) -> tuple:
        return ("host", self.index, h)

    # -- from hosts -------------------------------------------------------------------
    def on_contrib(self, p: Packet, out: list) -> None:
        s, h, r = self.s, p.src[2], p.round
        s.latch()
        if r == s.round:
            if h in s.bitmap:
                if s.count >= s.q() and self.may_close():
                    self.close_up(out)
                return
            s.accept(h, r, p.payload, 1)
            if s.count >= s.q() and self.may_close():
                self.close_up(out)
        elif self.up_pending and r == self.up_round:
            if h in self.up_bitmap:
                self.send_up(out)
            else:
                s.mark_refused(h, r)
                out.append(Packet("RESYNC", ("leaf", self.index), p.src, s.round, p.tx,
                                  reason=STALE_ROUND, mode=s.mode, about=r))
        elif r == s.round - 1 and s.res_valid:
            if h not in s.res_bitmap:
                s.mark_refused(h, r)
            out.append(Packet("RESULT", ("leaf", self.index), p.src, r, p.tx,
                              tokens(s.banks[r & 1]), s.res_bitmap, s.res_count,
                              mode=s.res_mode, resend=True))
        else:
            reason = s.stale_reason(h, r)
            if reason == STALE_ROUND:
                s.mark_refused(h, r)
            out.append(Packet("RESYNC", ("leaf", self.index), p.src, s.round, p.tx,
                              reason=reason, mode=s.mode, about=r))

    def may_close(self) -> bool:
        return not self.up_pending or "hold" in self.mutations

    def close_up(self, out: list) -> None:
        s = self.s
        self.up_round, self.up_bitmap, self.up_count = s.round, frozenset(s.bitmap), s.count
        self.up_pending = True
        s.res_valid = False
        s.move_to(s.round + 1)
        self.send_up(out)

    def send_up(self, out: list) -> None:
        self.up_tx += 1
        out.append(Packet("CONTRIB", ("leaf", self.index), SPINE, self.up_round, self.up_tx,
                          tokens(self.s.banks[self.up_round & 1]), count=self.up_count))

    # -- from the spine -----------------------------------------------------------------
    def refuse(self, members, r: int) -> None:
        """The spine did not count round r's sum: its hosts read "not counted" from now on,
        over the leaf's own "counted" (§11, marking hosts refused)."""
        if "refuse" in self.mutations:
            return
        for h in members:
            cell = self.s.member_seq.get(h)
            if cell is None or cell[0] <= r:
                self.s.member_seq[h] = (r, False)
                self.refused_marks += 1

    def relay(self, r: int, payload: tuple, bitmap: frozenset, count: int, mode: str,
              out: list) -> None:
        s = self.s
        # Only the last round is kept for RESENDs (§4); a late verdict is relayed, not kept.
        if r == s.round - 1 or "keep_last" in self.mutations:
            s.banks[r & 1] = Counter(payload)
            s.res_valid, s.res_bitmap, s.res_count, s.res_mode = True, bitmap, count, mode
        for h in range(s.members):
            out.append(Packet("RESULT", ("leaf", self.index), self.host(h), r, 0, payload,
                              bitmap, count, mode=mode))

    def on_result(self, p: Packet, out: list) -> None:
        s, r = self.s, p.round
        if self.up_pending and r == self.up_round:
            counted = self.index in p.bitmap
            self.up_pending = False
            if not counted:
                self.refuse(self.up_bitmap, r)
            verdict = counted or "verdict" in self.mutations
            self.relay(r, p.payload, self.up_bitmap if verdict else frozenset(), p.count,
                       p.mode, out)
        elif r >= s.round:
            opened = s.round
            self.refuse(s.move_to(r + 1), opened)
            self.relay(r, p.payload, frozenset(), p.count, p.mode, out)

    def on_resync(self, p: Packet, out: list) -> None:
        s = self.s
        # The echo is what ties a RESYNC to an uplink: one slot has one uplink pending, and
        # its transmission numbers run on from the previous uplink's.
        if not self.up_pending or p.tx != self.up_tx:
            return
        self.up_pending = False
        opened = s.round
        if p.reason == STALE_ROUND:
            self.refuse(self.up_bitmap, self.up_round)
            for h in self.up_bitmap:
                out.append(Packet("RESYNC", ("leaf", self.index), self.host(h), p.round,
                                  reason=STALE_ROUND, mode=p.mode, about=self.up_round,
                                  bitmap=self.up_bitmap, relayed=True))
        if p.round > opened or "backward" in self.mutations and p.round != opened:
            # Forward only: a RESYNC the network delayed behind later results must not take
            # the leaf back to a round its hosts are past (they would be ahead of it for ever).
            self.refuse(s.move_to(p.round), opened)
            s.res_valid = False


@dataclass
class Flight:
    round: int
    tx: int
    payload: Counter


class Host:
    def __init__(self, leaf: int, index: int, rounds: int):
        self.addr = ("host", leaf, index)
        self.last_round = rounds  # the job ends there: what is not in a round stays carried
        self.index = index
        self.next_round = 0
        self.flight: Flight | None = None
        self.residual: Counter = Counter()
        self.made = 0
        self.applied: dict[int, tuple] = {}
        self.weights: dict[int, int] = {}
        self.missed = 0  # results it learned were gone (STALE_COUNTED): resync

    def start(self, out: list) -> None:
        self.made += 1
        payload = self.residual + Counter([self.addr + (self.made,)])
        self.residual = Counter()
        self.flight = Flight(self.next_round, 1, payload)
        self.send(out)

    def send(self, out: list) -> None:
        f = self.flight
        out.append(Packet("CONTRIB", self.addr, ("leaf", self.addr[1]), f.round, f.tx,
                          tokens(f.payload)))

    def retransmit(self, out: list) -> None:
        self.flight.tx += 1
        self.send(out)

    def carry(self) -> None:
        self.residual += self.flight.payload
        self.flight = None

    def relaunch(self, r: int, out: list) -> None:
        self.flight.round, self.flight.tx = r, self.flight.tx + 1
        self.send(out)

    def on_result(self, p: Packet, out: list) -> None:
        if p.round not in self.applied:
            self.applied[p.round] = p.payload
            self.weights[p.round] = p.count
        self.next_round = max(self.next_round, p.round + 1)
        f = self.flight
        if f is None or f.round != p.round:
            return
        if self.index in p.bitmap:
            self.flight = None
        elif p.resend and p.tx == f.tx or p.mode == PARTIAL:
            # (In partial, a result of my round without my bit is my leaf's relay of the
            # spine's verdict: the leaf is past my round for good, so it is carried at once.)
            self.carry()

    def on_resync(self, p: Packet, out: list) -> None:
        f = self.flight
        self.next_round = max(self.next_round, p.round)
        if f is None or p.about != f.round:
            return
        if p.relayed:
            if self.index not in p.bitmap:
                return
        elif p.tx != f.tx:
            return
        if p.reason == STALE_COUNTED:
            self.missed += 1
            self.flight = None
        elif p.mode == SYNC and f.round < p.round < self.last_round:
            self.relaunch(p.round, out)
        else:
            self.carry()


@dataclass
class Draw:
    leaves: int
    hosts: int
    rounds: int
    loss: float
    dup: float
    swaps: int
    slow_leaf: int  # -1: none
    slow_host: tuple  # (leaf, host) or ()


def draw(seed: int) -> Draw:
    rng = random.Random(seed)
    leaves = rng.randint(2, 4)
    return Draw(
        leaves=leaves,
        hosts=rng.randint(1, 4),
        rounds=rng.randint(3, 12),
        loss=rng.choice([0.0, 0.0, 0.02, 0.1, 0.25]),
        dup=rng.choice([0.0, 0.0, 0.02, 0.1]),
        swaps=rng.randint(0, 8),
        slow_leaf=rng.choice([-1, -1, rng.randrange(leaves)]),
        slow_host=rng.choice([(), (rng.randrange(leaves), 0)]),
    )


class Run:
    def __init__(self, seed: int, trace: bool = False, mutations: frozenset = frozenset()):
        self.seed, self.trace = seed, trace
        self.d = draw(seed)
        self.rng = random.Random(seed ^ 0x5EED)
        self.spine = Spine(self.d.leaves, mutations)
        self.leaves = [Leaf(i, self.d.hosts, mutations) for i in range(self.d.leaves)]
        self.hosts = [Host(li, h, self.d.rounds)
                      for li in range(self.d.leaves) for h in range(self.d.hosts)]
        self.wire: list[Packet] = []
        self.swaps_left = self.d.swaps
        self.stats = Counter()

    def host(self, addr) -> Host:
        return self.hosts[addr[1] * self.d.hosts + addr[2]]

    def slowness(self, h: Host) -> float:
        slow = 1.0
        if self.d.slow_leaf == h.addr[1]:
            slow *= 6
        if self.d.slow_host == (h.addr[1], h.addr[2]):
            slow *= 6
        return slow

    def deliver(self, p: Packet) -> None:
        out: list[Packet] = []
        if p.dst == SPINE:
            self.spine.on_contrib(p, out)
        elif p.dst[0] == "leaf":
            leaf = self.leaves[p.dst[1]]
            {"CONTRIB": leaf.on_contrib, "RESULT": leaf.on_result,
             "RESYNC": leaf.on_resync}[p.op](p, out)
        else:
            h = self.host(p.dst)
            {"RESULT": h.on_result, "RESYNC": h.on_resync}[p.op](p, out)
        if self.trace:
            print(f"  {p}\n    -> {out}")
        self.wire.extend(out)
        self.stats["packets"] += 1

    def step(self) -> bool:
        """One event; False once the run is over."""
        rng = self.rng
        idle = [h for h in self.hosts if h.flight is None and h.next_round < self.d.rounds]
        waiting = [h for h in self.hosts if h.flight is not None]
        if not self.wire and not idle and not waiting:
            return False
        choices = []
        if self.wire:
            choices.append(("wire", 8.0))
        for h in idle:
            choices.append((("start", h), 1.0 / self.slowness(h)))
        if waiting and (not self.wire or rng.random() < 0.05):
            choices.append(("timeout", 1.0))
        if self.swaps_left:
            choices.append(("swap", 0.2))
        kind = rng.choices([c for c, _ in choices], [w for _, w in choices])[0]
        if kind == "wire":
            p = self.wire.pop(rng.randrange(len(self.wire)))  # any order: reordering
            if rng.random() < self.d.loss:
                self.stats["lost"] += 1
                return True
            if rng.random() < self.d.dup:
                self.wire.append(p)
                self.stats["duplicated"] += 1
            self.deliver(p)
        elif kind == "timeout":
            h = rng.choice(waiting)
            out: list[Packet] = []
            h.retransmit(out)
            self.wire.extend(out)
            self.stats["retransmissions"] += 1
        elif kind == "swap":
            self.swaps_left -= 1
            level = rng.choice([self.spine.s] + [lf.s for lf in self.leaves])
            mode = rng.choice([SYNC, PARTIAL])
            level.desired = (mode, 0 if mode == SYNC else rng.randint(1, level.members))
            self.stats["swaps"] += 1
        else:
            out = []
            kind[1].start(out)
            self.wire.extend(out)
        return True

    def run(self, budget: int = 200_000) -> list[str]:
        for _ in range(budget):
            if not self.step():
                return self.check()
        return self.check() + [f"not live: {budget} events without every host reaching round "
                               f"{self.d.rounds} (flights: "
                               f"{[h.flight for h in self.hosts if h.flight]})"]

    def check(self) -> list[str]:
        problems = []
        in_results = Counter()
        for payload in self.spine.results.values():
            in_results.update(payload)
        carried = Counter()
        for h in self.hosts:
            carried.update(h.residual)
        made = [h.addr + (k,) for h in self.hosts for k in range(1, h.made + 1)]
        for t in made:
            n = in_results[t] + carried[t]
            if n != 1:
                problems.append(f"exactly-once: gradient {t} is in {in_results[t]} results "
                                f"and carried {carried[t]} times")
        for h in self.hosts:
            for r, got in h.applied.items():
                if got != self.spine.results.get(r):
                    problems.append(f"agreement: host {h.addr} applied round {r} as {got}, "
                                    f"the spine closed {self.spine.results.get(r)}")
        for h in self.hosts:
            for r, count in h.weights.items():
                contributors = {t[:3] for t in self.spine.results.get(r, ())}
                if count != len(contributors):
                    problems.append(f"divisor: host {h.addr} divided round {r} by {count}, "
                                    f"{len(contributors)} hosts are in it")
        self.stats["results"] = len(self.spine.results)
        self.stats["refused_marks"] = sum(lf.refused_marks for lf in self.leaves)
        self.stats["missed"] = sum(h.missed for h in self.hosts)
        return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=2000)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--seed", type=int, help="replay one seed")
    ap.add_argument("--trace", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("bench/results/simulate-two-level-model.json"))
    args = ap.parse_args(argv)
    if args.seed is not None:
        problems = Run(args.seed, trace=args.trace).run()
        print("\n".join(problems) or f"seed {args.seed}: no violation")
        return 1 if problems else 0
    t0, cpu0 = time.time(), time.process_time()
    totals, failures = Counter(), []
    for seed in range(args.start, args.start + args.seeds):
        run = Run(seed)
        problems = run.run()
        totals.update(run.stats)
        if problems:
            failures.append({"seed": seed, "violations": problems[:5],
                             "replay": f"python -m tests.sim.two_level_model --seed {seed}"})
        if (seed - args.start + 1) % 1000 == 0:
            print(f"{seed - args.start + 1}/{args.seeds} seeds, {len(failures)} failing",
                  file=sys.stderr)
    report = {"seeds": args.seeds, "first_seed": args.start, **totals,
              "violations": sum(len(f["violations"]) for f in failures),
              "failing_seeds": len(failures), "failures": failures[:20],
              "cpu_seconds": round(time.process_time() - cpu0, 1),
              "wall_seconds": round(time.time() - t0, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "failures"}))
    for f in failures[:5]:
        print(f["replay"], "->", f["violations"][0])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
