"""The two-level model (tests/sim/two_level_model.py) with its switches replaced by real
pipelines: the model draws the same events (hosts, losses, duplicates, reordering, swaps at
either level, a slow rack or host) and checks the same invariants, while every packet a leaf
or the spine handles is a real datagram through the softswitch's reference pipeline
(softswitch/pipeline.py, target `python`) or its native one (native/dataplane/, `native`).

Gradients stay symbolic: a token (host, k) is one 4-bit field of the 2048 bits of a
packet's lanes, so the switches' int32 sums are multisets of tokens, decoded exactly.

    python -m tests.sim.two_level_pipeline --seeds 2000 [--start 0] [--targets python,native]
    python -m tests.sim.two_level_pipeline --seed 123 --trace [--targets native]  # replay one
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from hysync import wire
from hysync.wire import Flag, Mode, Op, ResyncReason
from tests.sim.seed_sweep import sweep_seeds
from tests.sim.two_level_model import PARTIAL, SPINE, SYNC, Packet, Run
from tests.softswitch.two_level_fabric import Fabric, contrib

_FIELD_BITS = 4  # a token's multiplicity, up to 15 (a sum holding one twice is a violation)
_TOKENS_PER_HOST = 32
_MAX_HOSTS = wire.LANES * 32 // _FIELD_BITS // _TOKENS_PER_HOST  # 16: the model's 4 x 4
_MODES = {SYNC: Mode.SYNC, PARTIAL: Mode.PARTIAL}
_NAMES = {Mode.SYNC: SYNC, Mode.PARTIAL: PARTIAL}
# What each target's sweep writes by default, and what its results say it ran.
RESULTS = {"python": Path("bench/results/simulate-two-level-pipeline.json"),
           "native": Path("bench/results/simulate-two-level-native.json")}
_TARGET_NAMES = {"python": "softswitch reference pipeline (softswitch/pipeline.py)",
                 "native": "softswitch native pipeline (native/dataplane/, softswitch/native.py)"}


class Tokens:
    """The symbolic gradients of one run as lanes and back."""

    def __init__(self, hosts_per_leaf: int) -> None:
        self.hosts = hosts_per_leaf

    def encode(self, tokens: tuple) -> np.ndarray:
        bits = np.zeros(wire.LANES, dtype=np.uint64)
        for _, leaf, host, k in tokens:
            if not 1 <= k <= _TOKENS_PER_HOST:
                raise ValueError(f"token {k} of host ({leaf}, {host}): the lanes hold "
                                 f"{_TOKENS_PER_HOST} per host")
            offset = ((leaf * self.hosts + host) * _TOKENS_PER_HOST + k - 1) * _FIELD_BITS
            bits[offset // 32] += 1 << offset % 32
        return (bits & 0xFFFFFFFF).astype(np.uint32).view(np.int32)

    def decode(self, datagram: bytes) -> tuple:
        lanes = np.frombuffer(datagram, ">u4", wire.LANES, wire.HEADER_BYTES)
        found = []
        for lane, value in enumerate(lanes.tolist()):
            for field in range(32 // _FIELD_BITS):
                n = value >> field * _FIELD_BITS & (1 << _FIELD_BITS) - 1
                if n:
                    index = (lane * 32 + field * _FIELD_BITS) // _FIELD_BITS
                    g, k = divmod(index, _TOKENS_PER_HOST)
                    found += [("host", g // self.hosts, g % self.hosts, k + 1)] * n
        return tuple(sorted(found))


class SwitchLevel:
    """Where the model's swaps write a level's desired mode: the switch's modes table."""

    def __init__(self, fabric: Fabric, label: object, members: int) -> None:
        self.fabric, self.label, self.members = fabric, label, members
        self._desired = (SYNC, 0)

    @property
    def desired(self) -> tuple:
        return self._desired

    @desired.setter
    def desired(self, value: tuple) -> None:
        self._desired = value
        self.fabric.set_mode(self.label, _MODES[value[0]], value[1])


class SpineSwitch:
    def __init__(self, fabric: Fabric, leaves: int) -> None:
        self.s = SwitchLevel(fabric, SPINE, leaves)
        self.results: dict[int, tuple] = {}  # round -> sum, every result the spine closed


class LeafSwitch:
    def __init__(self, fabric: Fabric, index: int, hosts: int) -> None:
        self.s = SwitchLevel(fabric, ("leaf", index), hosts)
        self.refused_marks = 0


class PipelineRun(Run):
    def __init__(self, seed: int, trace: bool = False, target: str = "python") -> None:
        super().__init__(seed, trace)
        if self.d.leaves * self.d.hosts > _MAX_HOSTS:
            raise ValueError(f"{self.d.leaves} x {self.d.hosts} hosts: the lanes hold "
                             f"{_MAX_HOSTS} hosts' tokens")
        self.fabric = Fabric(self.d.leaves, self.d.hosts, engine=target)
        self.tokens = Tokens(self.d.hosts)
        self.spine = SpineSwitch(self.fabric, self.d.leaves)
        self.leaves = [LeafSwitch(self.fabric, i, self.d.hosts) for i in range(self.d.leaves)]

    def deliver(self, p: Packet) -> None:
        if p.dst[0] == "host":
            return super().deliver(p)
        if p.src[0] == "host":
            datagram = contrib(p.src[2], p.round, self.tokens.encode(p.payload), tx=p.tx)
        else:
            datagram = p.payload
        out = [self.packet(p, dst, d) for dst, d in self.fabric.deliver(p.src, p.dst, datagram)]
        if self.trace:
            print(f"  {p.op} {p.src} -> {p.dst} r{p.round}\n    -> {out}")
        self.wire.extend(out)
        self.stats["packets"] += 1

    def packet(self, trigger: Packet, dst: object, datagram: bytes) -> Packet:
        """What a switch sent, as the model's packet (switch to switch: the datagram)."""
        h = wire.Header.unpack(datagram)
        src = trigger.dst
        if dst == SPINE or dst[0] == "leaf":
            if src == SPINE and h.op == Op.RESULT and not h.flags & Flag.RESEND:
                self.spine.results.setdefault(h.round, self.tokens.decode(datagram))
            return Packet(Op(h.op).name, src, dst, h.round, payload=datagram)
        reply = trigger.src == dst  # an answer to the host's own packet echoes it
        bitmap = frozenset(b for b in range(wire.MAX_WORKERS) if h.bitmap >> b & 1)
        if h.op == Op.RESULT:
            return Packet("RESULT", src, dst, h.round, trigger.tx if reply else 0,
                          self.tokens.decode(datagram), bitmap, h.count, mode=_NAMES[h.mode],
                          resend=bool(h.flags & Flag.RESEND))
        if h.op == Op.RESYNC:
            relayed = not reply and bool(h.flags & Flag.RELAYED)
            # A relayed RESYNC names the flight it settles by its chunk (a chunk is its round
            # here), except a CHUNK_MISMATCH: it answers the round of the sum, and its chunk
            # is the one that round aggregates at the spine.
            about = (h.round if h.reason == ResyncReason.CHUNK_MISMATCH else h.chunk) \
                if relayed else trigger.round
            return Packet("RESYNC", src, dst, h.round, trigger.tx if reply else 0,
                          bitmap=bitmap, reason=ResyncReason(h.reason).name,
                          mode=_NAMES[h.mode], about=about, relayed=relayed)
        raise AssertionError(f"a switch sent {Op(h.op).name} to host {dst}: {h}")


def targets_of(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in names if t not in RESULTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"targets {text!r}: name one or more of {','.join(RESULTS)}, comma-separated")
    return names


def _seed(seed: int, target: str) -> tuple[list[str], dict[str, int]]:
    run = PipelineRun(seed, target=target)
    problems = run.run()
    run.stats.pop("refused_marks", None)  # the model's leaves count them; these are real
    return problems, run.stats


def sweep(target: str, start: int, seeds: int, out: Path) -> int:
    """Seeds start.. on one target, results to `out` (every 100 seeds, and at the end);
    the number of failing seeds."""
    return sweep_seeds(
        lambda seed: _seed(seed, target), label=target, start=start, seeds=seeds, out=out,
        about={"target": _TARGET_NAMES[target]},
        replay=f"python -m tests.sim.two_level_pipeline --seed {{seed}} --targets {target}",
        every=100)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=500)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--seed", type=int, help="replay one seed")
    ap.add_argument("--trace", action="store_true")
    ap.add_argument("--targets", type=targets_of, default=["python"],
                    help="pipelines to run the seeds on, comma-separated: python,native")
    ap.add_argument("--out", type=Path,
                    help="results file (one target only; default: " + ", ".join(
                        f"{t}: {p}" for t, p in RESULTS.items()) + ")")
    args = ap.parse_args(argv)
    if args.out is not None and len(args.targets) > 1:
        ap.error("--out names one file: give one target, or leave --out to write each "
                 "target's default")
    if args.seed is not None:
        failing = 0
        for target in args.targets:
            problems = PipelineRun(args.seed, trace=args.trace, target=target).run()
            print("\n".join(problems) or f"seed {args.seed} on {target}: no violation")
            failing += bool(problems)
        return 1 if failing else 0
    failing = sum(sweep(t, args.start, args.seeds, args.out or RESULTS[t]) for t in args.targets)
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
