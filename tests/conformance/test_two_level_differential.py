"""The native data plane against the reference model at two levels (docs/protocol.md §11).

Two harnesses, byte for byte, like test_differential.py's:

* **one switch with roles**: test_differential.py's random switch states and events, with a
  random role per job (single, spine, or leaf of a spine at one of the hosts' addresses) and
  the packets a spine and leaves exchange: uplinks that carry a host count, the spine's
  RESULTs and RESYNCs (install tags, bitmaps, transmission numbers), forged ones from other
  addresses, role changes. Every event's outputs and, at the end, every counter agree.
* **a two-level topology**: 1-3 leaves of 1-3 hosts and a spine, once of reference pipelines
  and once of native ones, driven in lockstep by the same random schedule: hosts' packets
  (for their leaf's open round mostly, or one either side; their chunk or another; any
  transmission number), the switches' packets delivered in any order, lost or duplicated,
  mode swaps at either level; then what is still in flight, in order. Every switch's outputs
  for every delivery are compared, and at the end every counter of every switch.

Each harness runs on native, on BMv2 (where it is installed) and on the tna-model (the TNA
program's register plan, tna_model.py). The TNA program runs a job as its spine or at one
level, never as a leaf (docs/tofino.md, "Two levels"), in sync and partial only (no slot
enters async by a hot swap there): on the tna-model, a switch with roles is single or spine
in sync and partial, its roles set before the packets (docs/tofino.md, differences 5, 15 and
16 say what else it leaves out), and the two-level topology is native leaves under a
tna-model spine.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from hysync import p4names, wire
from hysync.softswitch.levels import JobRole, Level, Uplink, role_params
from hysync.wire import Flag, Mode, Op, ResyncReason
from tests.p4tools import skip_unless_available
from tests.softswitch.two_level_fabric import JOB, SPINE, Fabric, contrib

from .conftest import make_target
from .targets import SoftswitchTarget, Write, bmv2_unavailable
from .test_differential import (
    IPS,
    JOB_IDS,
    MACS,
    RAN,
    SMALL_SLOTS,
    SWITCH_IP,
    WORKERS,
    as_frame,
    assert_same_counters,
    assert_same_sent,
    counters_of,
    describe,
    events,
    group_both,
    groups,
    job_entry,
    lanes,
    member_entry,
    switch_state,
    udp_port,
    write_both,
)
from .tna_model import TnaModelPipeline
from .topology import PORTS

ONE_SWITCH = {"native": "native with roles", "bmv2": "bmv2 with roles",
              "tna-model": "tna-model with roles"}
TOPOLOGY = {"native": "native two-level topology", "bmv2": "bmv2 two-level topology",
            "mixed": "native leaves under a bmv2 spine",
            "tna-spine": "native leaves under a tna-model spine"}
# BMv2 restarts per sequence and waits for frames on veth ports; the in-process targets run
# as many sequences as native.
SEQUENCES = {ONE_SWITCH["native"]: 600, ONE_SWITCH["bmv2"]: 25, ONE_SWITCH["tna-model"]: 600,
             TOPOLOGY["native"]: 300, TOPOLOGY["bmv2"]: 12, TOPOLOGY["mixed"]: 8,
             TOPOLOGY["tna-spine"]: 300}
# The levels a target runs a job at: the TNA program runs no leaf.
RUNS_LEAVES = {"native": True, "bmv2": True, "tna-model": False}

# ------------------------------------------------------------------ one switch with roles
# A job whose members, slots and group the random state cannot take away (its writes come
# first; a random write that collides is refused by both), so that uplinks and verdicts
# meet admitted members and slots of their job: workers 0-2, slots 0-3, group 1, epoch 1.
LEVEL_JOB, LEVEL_WORKERS, LEVEL_SLOTS = JOB_IDS[0], range(3), 4


def level_job_writes() -> list[tuple[str, Write]]:
    writes = [member_entry(LEVEL_JOB, w) for w in LEVEL_WORKERS]
    writes.append(job_entry(LEVEL_JOB, (0, LEVEL_SLOTS, len(LEVEL_WORKERS), 1, 1)))
    writes += [Write(p4names.REPLICATION_REWRITE, (wire.member_rid(LEVEL_JOB, w),),
                     p4names.REPLICATION_REWRITE_DST,
                     (0x020000000000 + w, IPS[w % 2], udp_port(w))) for w in LEVEL_WORKERS]
    writes.append(Write(p4names.FORWARDING_L2, (MACS[0],), p4names.FORWARDING_SET_EGRESS_PORT,
                        (PORTS[1],)))
    return [("INSERT", w) for w in writes]

role = st.one_of(
    st.none(),
    st.just(JobRole(Level.SPINE)),
    st.builds(lambda spine, mac, uplink_id: JobRole(Level.LEAF, Uplink(
        IPS[spine], MACS[mac], uplink_id, SWITCH_IP)),
        st.integers(0, 1), st.integers(0, 2), st.sampled_from((*WORKERS, 31))))
roles = st.dictionaries(st.sampled_from(JOB_IDS), role, max_size=3)
level_job_role = st.sampled_from((Level.LEAF, Level.LEAF, Level.SPINE)).flatmap(
    lambda level: st.just(JobRole(Level.SPINE)) if level == Level.SPINE else st.builds(
        lambda spine, uplink_id: JobRole(Level.LEAF, Uplink(IPS[spine], MACS[0], uplink_id,
                                                             SWITCH_IP)),
        st.integers(0, 1), st.sampled_from((0, 0, 1, 31))))
# Without leaves: single or spine.
role_without_leaves = st.one_of(st.none(), st.just(JobRole(Level.SPINE)))
roles_without_leaves = st.dictionaries(st.sampled_from(JOB_IDS), role_without_leaves,
                                       max_size=3)

@st.composite
def level_datagram(draw: st.DrawFn, other_chunks: bool = True) -> tuple[int, int, bytes]:
    """What leaves and a spine send each other: an uplink (a CONTRIB with a host count), or
    the spine's RESULT or RESYNC, from one of the addresses a role may name as the spine's.
    Without `other_chunks` an uplink's chunk is its round (docs/tofino.md, difference 5: the
    TNA program answers a counted member's copy with another chunk CHUNK_MISMATCH)."""
    op = draw(st.sampled_from((Op.CONTRIB, Op.CONTRIB, Op.CONTRIB, Op.RESULT, Op.RESYNC)))
    worker = draw(st.sampled_from((*LEVEL_WORKERS, *LEVEL_WORKERS, *WORKERS, 31)))
    reason = (0 if op == Op.CONTRIB else draw(st.sampled_from((0, 1, 1, 1, 2, 2, 3))))
    r = draw(st.sampled_from((0, 0, 1, 1, 2, 3, 0xFFFFFFFF)))
    head = wire.Header(
        op=op, job_id=draw(st.sampled_from((LEVEL_JOB,) * 6 + JOB_IDS)), worker_id=worker,
        slot=draw(st.sampled_from((0, 0, 0, 1, 3, 4, 30))), round=r,
        chunk=draw(st.sampled_from((r, r, r, 0, 5) if other_chunks or op != Op.CONTRIB
                                   else (r,))), reason=reason,
        count=draw(st.sampled_from((0, 1, 3, 255))), mode=draw(st.sampled_from((0, 1))),
        quorum=draw(st.integers(0, 3)), bitmap=draw(st.sampled_from((0, 1, 0b11, 0b10110, -1)))
        & 0xFFFFFFFF,
        flags=draw(st.sampled_from((0, 0x01, 0x08, 0x09, 0x10, 0x18, 0xF8))))
    payload = head.pack() + (draw(lanes) if op != Op.RESYNC else b"")
    if draw(st.integers(0, 9)) == 0:
        payload = payload[:draw(st.integers(0, len(payload) - 1))]
    if op == Op.CONTRIB:  # a leaf's uplink comes from its own port, as a worker's does
        return IPS[worker % 2], udp_port(worker), payload
    return IPS[draw(st.integers(0, 1))], wire.HYSYNC_UDP_PORT, payload


def role_events(shortest_frame: int, leaves: bool = True, allow_async: bool = True,
                other_chunks: bool = True, empty_jobs: bool = True,
                role_changes: bool = True) -> st.SearchStrategy:
    # ("rack", (slot, round)): every member of LEVEL_JOB contributes, so its rounds close.
    rack = st.tuples(st.just("rack"), st.tuples(st.sampled_from((0, 0, 1)),
                                                 st.sampled_from((0, 0, 1, 2))))
    return st.lists(st.one_of(
        events(allow_async, shortest_frame).map(
            lambda seq: seq[0] if empty_jobs else without_empty_jobs(seq[0])),
        rack, rack,
        st.tuples(st.just("datagram"), level_datagram(other_chunks)),
        st.tuples(st.just("datagram"), level_datagram(other_chunks)),
        st.tuples(st.just("datagram"), level_datagram(other_chunks)),
        *([st.tuples(st.just("role"), st.tuples(st.sampled_from(JOB_IDS),
                                                role if leaves else role_without_leaves))]
          if role_changes else []),
    ), min_size=1, max_size=40)


def with_a_member(writes: list[tuple[str, Write]]) -> list[tuple[str, Write]]:
    """`writes` with every jobs entry of no active member given one. The controller never
    writes one (it refuses to exclude a job's last active member); the TNA program's Count
    closes a round of quorum 0 on its second contribution, not its first as v1model does
    (docs/tofino.md, difference 15)."""
    out = []
    for update, w in writes:
        if w.table == p4names.ADMISSION_JOBS and w.params and w.params[2] == 0:
            w = dataclasses.replace(w, params=(*w.params[:2], 1, *w.params[3:]))
        out.append((update, w))
    return out


def without_empty_jobs(event: tuple) -> tuple:
    return ("writes", with_a_member(event[1])) if event[0] == "writes" else event


def role_write(reference: SoftswitchTarget, job: int, job_role) -> list[tuple[str, Write]]:
    """The roles table update that gives `job` its role (none for single), as a controller
    writes it: INSERT, MODIFY, or DELETE of the job's entry as the reference holds it now."""
    exists = ((job,), 0) in reference.pipeline.tables[p4names.ADMISSION_ROLES].entries
    if job_role is None or job_role.level == Level.SINGLE:
        return [("DELETE", Write(p4names.ADMISSION_ROLES, (job,), p4names.NO_ACTION))] \
            if exists else []
    return [("MODIFY" if exists else "INSERT",
             Write(p4names.ADMISSION_ROLES, (job,), p4names.ADMISSION_SET_ROLE,
                   role_params(job_role)))]


def run_role_sequence(kind: str, state, group_state, job_roles, sequence) -> dict[int, list]:
    """Drive the reference and a `kind` target alike; what each packet event sent."""
    in_process = kind != "bmv2"
    num_slots = SMALL_SLOTS if in_process else wire.NUM_SLOTS
    reference, target = SoftswitchTarget(num_slots), make_target(kind, num_slots)

    def datagram(d: tuple[int, int, bytes]) -> tuple[list, list]:
        if in_process:
            return reference.pipeline.process_datagram(*d), target.pipeline.process_datagram(*d)
        frame = as_frame(*d)
        return reference.send(*frame), target.send(*frame)

    sent_by: dict[int, list] = {}
    try:
        write_both(reference, target, level_job_writes() + state)
        group_both(reference, target, 1, [(PORTS[0], wire.member_rid(LEVEL_JOB, w))
                                          for w in LEVEL_WORKERS])
        for gid, reps in group_state.items():
            group_both(reference, target, gid, reps)
        for job, job_role in job_roles.items():
            write_both(reference, target, role_write(reference, job, job_role))
        for i, (event_kind, arg) in enumerate(sequence):
            if event_kind == "rack":
                slot, r = arg
                sent = [(IPS[w % 2], udp_port(w), wire.Header(
                    op=Op.CONTRIB, job_id=LEVEL_JOB, worker_id=w, slot=slot, round=r, chunk=r,
                    count=w + 1, flags=1 << wire.TX_SHIFT).pack()
                    + np.full(wire.LANES, w + 1, dtype=">i4").tobytes())
                    for w in LEVEL_WORKERS]
                want, got = [], []
                for d in sent:  # in order, each answer after the last
                    answers = datagram(d)
                    want, got = want + answers[0], got + answers[1]
            elif event_kind == "datagram":
                want, got = datagram(arg)
            elif event_kind == "frame":
                want, got = reference.send(*arg), target.send(*arg)
            elif event_kind == "writes":
                write_both(reference, target, arg)
                continue
            elif event_kind == "role":
                write_both(reference, target, role_write(reference, *arg))
                continue
            else:
                group_both(reference, target, *arg)
                continue
            assert_same_sent(kind, i, event_kind, got, want)
            sent_by[i] = want
        assert_same_counters(reference, target)
    finally:
        target.close()
    RAN[ONE_SWITCH[kind]] += 1
    return sent_by


@pytest.mark.parametrize("kind", list(ONE_SWITCH))
def test_one_switch_with_roles_matches_reference_byte_for_byte(kind: str) -> None:
    if kind == "bmv2":
        skip_unless_available(bmv2_unavailable())
    # BMv2 gets whole Ethernet headers: the kernel pads a shorter frame on a veth.
    shortest = 0 if kind != "bmv2" else wire.ETH_BYTES
    # On the TNA program a job is single or spine, no slot enters async by a hot swap, a
    # counted uplink's copy with another chunk is answered otherwise (difference 5), a job
    # of no active member closes otherwise (difference 15), and a role changed under an open
    # round weighs it otherwise (difference 16): roles are set once, before the packets.
    leaves = allow_async = other_chunks = empty_jobs = role_changes = RUNS_LEAVES[kind]
    job_role = (level_job_role if leaves
                else st.sampled_from((None, JobRole(Level.SPINE), JobRole(Level.SPINE))))

    # A failing BMv2 sequence is reported as drawn: shrinking it would restart BMv2 for
    # every candidate, for many minutes.
    phases = tuple(Phase) if kind != "bmv2" else (Phase.explicit, Phase.reuse, Phase.generate)

    @settings(max_examples=SEQUENCES[ONE_SWITCH[kind]], deadline=None, derandomize=True,
              phases=phases,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(state=switch_state(allow_async).map(
               lambda writes: writes if empty_jobs else with_a_member(writes)),
           group_state=groups,
           job_roles=st.tuples(roles if leaves else roles_without_leaves, job_role).map(
               lambda drawn: {**drawn[0], LEVEL_JOB: drawn[1]}),
           sequence=role_events(shortest, leaves, allow_async, other_chunks, empty_jobs,
                                role_changes))
    def check(state, group_state, job_roles, sequence) -> None:
        run_role_sequence(kind, state, group_state, job_roles, sequence)

    check()


def spine_verdict(op: int, r: int, bitmap: int = 0, reason: int = 1, tx: int = 0,
                  chunk: int | None = None) -> tuple[str, tuple[int, int, bytes]]:
    """A RESULT (reason: the install tag of epoch 1) or a RESYNC (reason: why) of the spine
    at IPS[0] for LEVEL_JOB's slot 0, echoing transmission number `tx`."""
    head = wire.Header(op=op, job_id=LEVEL_JOB, worker_id=0, slot=0, round=r,
                       chunk=r if chunk is None else chunk, reason=reason, count=5,
                       bitmap=bitmap, flags=tx << wire.TX_SHIFT).pack()
    lanes_ = np.arange(wire.LANES, dtype=">i4").tobytes() if op == Op.RESULT else b""
    return "datagram", (IPS[0], wire.HYSYNC_UDP_PORT, head + lanes_)


def host_again(w: int, r: int) -> tuple[str, tuple[int, int, bytes]]:
    head = wire.Header(op=Op.CONTRIB, job_id=LEVEL_JOB, worker_id=w, slot=0, round=r, chunk=r,
                       flags=2 << wire.TX_SHIFT | Flag.RETRANSMIT).pack()
    return "datagram", (IPS[w % 2], udp_port(w), head + np.ones(wire.LANES, ">i4").tobytes())


def host_first(w: int, r: int) -> tuple[str, tuple[int, int, bytes]]:
    """Host w's first transmission of round r (chunk r) to the leaf, slot 0."""
    head = wire.Header(op=Op.CONTRIB, job_id=LEVEL_JOB, worker_id=w, slot=0, round=r, chunk=r,
                       count=1, flags=1 << wire.TX_SHIFT).pack()
    return "datagram", (IPS[w % 2], udp_port(w), head + np.full(wire.LANES, w + 1, ">i4")
                        .tobytes())


# A leaf's sums refused by the spine, each way (§11 leaf steps 4-6): their hosts marked
# refused one cell at a time, the verdicts relayed, and the hosts asking again afterwards.
REFUSALS = [
    ("rack", (0, 0)),                                    # round 0 goes up (tx 1)
    spine_verdict(Op.RESULT, 0, bitmap=0b10),            # ...and is not counted
    host_again(1, 0),
    ("rack", (0, 1)),                                    # round 1 goes up (tx 2)
    host_again(2, 1),                                    # asked again: the uplink again (tx 3)
    spine_verdict(Op.RESYNC, 1, reason=ResyncReason.STALE_ROUND, tx=2),   # not the latest
    spine_verdict(Op.RESYNC, 3, reason=ResyncReason.STALE_ROUND, tx=3),   # stale, ahead
    host_again(0, 1),
    host_again(0, 3),
    ("rack", (0, 3)),                                    # round 3 goes up (tx 4)
    spine_verdict(Op.RESYNC, 3, reason=ResyncReason.CHUNK_MISMATCH, tx=4, chunk=9),  # back to 3
    ("rack", (0, 3)),                                    # round 3 goes up again (tx 5)
    spine_verdict(Op.RESULT, 3, bitmap=0b1),             # counted
    spine_verdict(Op.RESULT, 3, bitmap=0b1),             # its duplicate
    spine_verdict(Op.RESULT, 6),                         # a round without this rack
    host_again(1, 3),
]


@pytest.mark.parametrize("kind", [kind for kind in ONE_SWITCH if RUNS_LEAVES[kind]])
def test_a_leaf_marks_the_hosts_of_a_refused_sum_as_the_reference_does(kind: str) -> None:
    if kind == "bmv2":
        skip_unless_available(bmv2_unavailable())
    leaf = JobRole(Level.LEAF, Uplink(IPS[0], MACS[0], 0, SWITCH_IP))
    sent = run_role_sequence(kind, [], {}, {LEVEL_JOB: leaf}, REFUSALS)

    def headers(i: int) -> list[wire.Header]:
        """Event i's packets: frames (port, frame) on BMv2, datagrams (ip, port, payload)."""
        return [wire.Header.unpack(out[-1], wire.HYSYNC_OFFSET if len(out) == 2 else 0)
                for out in sent[i]]

    # What the reference (and so the target) did: the refused round 0 relayed with no bit
    # to all three hosts, the stale RESYNC relayed RELAYED to the three hosts of its sum,
    # round 3, taken back open on the spine's CHUNK_MISMATCH and counted, with theirs.
    assert [(h.op, h.bitmap) for h in headers(1)] == [(Op.RESULT, 0)] * 3
    assert [(h.op, h.flags, h.bitmap) for h in headers(6)] == [
        (Op.RESYNC, Flag.RELAYED, 0b111)] * 3
    assert [(h.op, h.bitmap) for h in headers(12)] == [(Op.RESULT, 0b111)] * 3
    assert headers(13) == []


# The leaf's step back (§11 leaf step 5): round 0's sum is at the spine while hosts 0 and 1
# are counted in round 1; the spine answers the sum CHUNK_MISMATCH, so round 0 opens again.
# Host 2 is marked refused in round 0 (the sum's), hosts 0 and 1 in round 1 (what the leaf
# held open, over their mark of round 0), and each host's next packets show its mark.
STEP_BACK = [
    ("rack", (0, 0)),                                    # round 0 goes up (tx 1)
    host_first(0, 1),                                    # round 1 absorbs: the sum is pending
    host_first(1, 1),
    spine_verdict(Op.RESYNC, 0, reason=ResyncReason.CHUNK_MISMATCH, tx=1, chunk=7),  # back
    host_again(2, 0),                                    # refused in round 0
    host_again(1, 1),                                    # refused in round 1
    host_again(0, 0),                                    # round 0 is open to it again
    host_again(1, 0),
    host_again(2, 0),
    spine_verdict(Op.RESULT, 0, bitmap=0b1),             # round 0 counted at last
    host_again(0, 1),                                    # round 1 opens afresh
]


@pytest.mark.parametrize("kind", [kind for kind in ONE_SWITCH if RUNS_LEAVES[kind]])
def test_a_leaf_takes_its_round_back_open_as_the_reference_does(kind: str) -> None:
    if kind == "bmv2":
        skip_unless_available(bmv2_unavailable())
    leaf = JobRole(Level.LEAF, Uplink(IPS[0], MACS[0], 0, SWITCH_IP))
    sent = run_role_sequence(kind, [], {}, {LEVEL_JOB: leaf}, STEP_BACK)

    def headers(i: int) -> list[wire.Header]:
        return [wire.Header.unpack(out[-1], wire.HYSYNC_OFFSET if len(out) == 2 else 0)
                for out in sent[i]]

    # The CHUNK_MISMATCH reaches the three hosts of the sum, with the spine's chunk.
    assert [(h.op, h.flags, h.reason, h.round, h.chunk, h.bitmap) for h in headers(3)] == [
        (Op.RESYNC, Flag.RELAYED, ResyncReason.CHUNK_MISMATCH, 0, 7, 0b111)] * 3
    # Round 0 is open again: host 2 is counted in it afresh, host 1's round 1 (marked, not
    # counted) is told the leaf's round is 0, and host 1's round 0 closes it again.
    assert headers(4) == []
    assert [(h.op, h.reason, h.round, h.bitmap) for h in headers(5)] == [
        (Op.RESYNC, ResyncReason.STALE_ROUND, 0, 0b100)]
    assert [(h.op, h.round, h.count, h.flags >> wire.TX_SHIFT) for h in headers(7)] == [
        (Op.CONTRIB, 0, 3, 2)]
    assert [(h.op, h.round, h.bitmap) for h in headers(9)] == [(Op.RESULT, 0, 0b111)] * 3
    assert headers(10) == []

# ------------------------------------------------------------------ a two-level topology
def host_packet(leaves: int, hosts: int) -> st.SearchStrategy:
    """A host's CONTRIB to its leaf: for the leaf's open round mostly, else one round either
    side; its chunk (the round) or another; any transmission number."""
    return st.tuples(st.just("host"), st.tuples(
        st.integers(0, leaves - 1), st.integers(0, hosts - 1),
        st.sampled_from((0, 0, 0, 0, -1, 1)), st.sampled_from((False,) * 5 + (True,)),
        st.integers(1, 4), st.booleans()))


def topology_events(leaves: int, hosts: int) -> st.SearchStrategy:
    level = st.sampled_from([SPINE] + [("leaf", i) for i in range(leaves)])
    mode = st.tuples(st.sampled_from((Mode.SYNC, Mode.PARTIAL)), st.integers(0, max(leaves,
                                                                                   hosts)))
    in_flight = st.integers(0, 1 << 16)  # which packet on the wire, modulo how many there are
    deliver = st.tuples(st.just("deliver"), in_flight)
    return st.lists(st.one_of(
        host_packet(leaves, hosts), host_packet(leaves, hosts),
        st.tuples(st.just("rack"), st.integers(0, leaves - 1)),  # every host of a leaf, at once
        deliver, deliver, deliver, deliver, deliver,
        st.tuples(st.just("lose"), in_flight), st.tuples(st.just("duplicate"), in_flight),
        st.tuples(st.just("swap"), st.tuples(level, mode)),
    ), min_size=1, max_size=120)


def switches(fabric: Fabric) -> dict:
    return {SPINE: fabric.spine, **{("leaf", i): p for i, p in enumerate(fabric.leaf)}}


def run_topology(leaves: int, hosts: int, sequence, bmv2: list | None = None,
                 native_leaves: bool = False, tna_spine: bool = False) -> None:
    """The schedule on a fabric of reference pipelines and one of native pipelines (with
    `tna_spine`, under a tna-model spine), or of the BMv2 switches `bmv2` (the spine and the
    leaves, in order; with `native_leaves`, the spine only, the leaves native)."""
    reference = Fabric(leaves, hosts, engine="python")
    if bmv2 is None:
        other = Fabric(leaves, hosts, engine="native",
                       spine_pipeline=TnaModelPipeline if tna_spine else None)
        kind = "tna-spine" if tna_spine else "native"
    else:
        from .bmv2_fabric import Bmv2Fabric  # only importable where BMv2 runs

        other = Bmv2Fabric(leaves, hosts, bmv2, native_leaves=native_leaves)
        kind = "mixed" if native_leaves else "bmv2"
    wire_: list[tuple[object, object, bytes]] = []  # switch-sent packets not yet delivered

    def deliver(i: int, src: object, dst: object, datagram: bytes) -> None:
        want = reference.deliver(src, dst, datagram)
        got = other.deliver(src, dst, datagram)
        if bmv2 is not None:  # frames come out of several ports: in no order between them
            got, want_sorted = sorted(got, key=repr), sorted(want, key=repr)
        else:
            want_sorted = want
        assert got == want_sorted, (f"event {i}: {dst} sent {describe(got)} on {kind}, "
                                    f"{describe(want_sorted)} on the reference pipeline")
        wire_.extend((dst, to, out) for to, out in want if to[0] != "host")  # type: ignore[index]

    def send(i: int, leaf: int, host: int, dr: int = 0, other_chunk: bool = False, tx: int = 1,
             retransmit: bool = False) -> None:
        r = max(0, reference.leaf[leaf].round[0] + dr)
        grad = np.full(wire.LANES, 1 << (3 * leaf + host), dtype=np.int64)
        deliver(i, ("host", leaf, host), ("leaf", leaf),
                contrib(host, r, grad, tx=tx, chunk=r + 100 if other_chunk else r,
                        retransmit=retransmit))

    for i, (event, arg) in enumerate(sequence):
        if event == "host":
            send(i, *arg)
        elif event == "rack":
            for host in range(hosts):
                send(i, arg, host)
        elif event == "swap":
            label, (mode, quorum) = arg
            reference.set_mode(label, mode, quorum)
            other.set_mode(label, mode, quorum)
        elif wire_:
            k = arg % len(wire_)
            if event == "deliver":
                deliver(i, *wire_.pop(k))
            elif event == "lose":
                wire_.pop(k)
            else:
                wire_.append(wire_[k])
    # Then the wire drains, oldest first: every uplink and verdict in flight is answered.
    for i in range(len(sequence), len(sequence) + 1000):
        if not wire_:
            break
        deliver(i, *wire_.pop(0))
    if bmv2 is None:
        for label, pipeline in switches(other).items():
            assert counters_of(SimpleNamespace(pipeline=pipeline)) == counters_of(
                SimpleNamespace(pipeline=switches(reference)[label])), f"{label}'s counters differ"
    else:
        for label, pipeline in switches(reference).items():
            cells = fabric_counter_cells(max(leaves, hosts))
            assert {cell: other.counter(label, *cell) for cell in cells} == {
                (name, index): pipeline.counters[name].packets[index] for name, index in cells
            }, f"{label}'s counters differ"
    RAN[TOPOLOGY[kind]] += 1


def fabric_counter_cells(members: int) -> list[tuple[str, int]]:
    """The counter cells a two-level schedule touches: the job's members, its drops."""
    cells = [(name, wire.member_index(JOB, w)) for w in range(members)
             for name in (p4names.STATS_CONTRIBUTIONS, p4names.STATS_LATE,
                          p4names.STATS_DUPLICATES, p4names.STATS_STALE, p4names.STATS_CLOSES,
                          p4names.REPLICATION_RESULTS)]
    return cells + [(p4names.STATS_DROPS, JOB * wire.NUM_DROP_REASONS + r)
                    for r in wire.DropReason]


def test_native_two_level_topology_matches_reference_byte_for_byte() -> None:
    @settings(max_examples=SEQUENCES[TOPOLOGY["native"]], deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=st.data(), leaves=st.integers(1, 3), hosts=st.integers(1, 3))
    def check(data, leaves, hosts) -> None:
        run_topology(leaves, hosts, data.draw(topology_events(leaves, hosts)))

    check()


def test_native_leaves_under_a_tna_model_spine_match_reference_byte_for_byte() -> None:
    """The native topology's schedules with the spine the TNA program's register plan: the
    spine weighs each leaf's uplink by the hosts in it (Weight), in sync and partial."""

    @settings(max_examples=SEQUENCES[TOPOLOGY["tna-spine"]], deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=st.data(), leaves=st.integers(1, 3), hosts=st.integers(1, 3))
    def check(data, leaves, hosts) -> None:
        run_topology(leaves, hosts, data.draw(topology_events(leaves, hosts)), tna_spine=True)

    check()


@pytest.fixture(scope="module")
def bmv2_switches():
    """A spine and two leaves of BMv2 for the module (each schedule restarts them)."""
    skip_unless_available(bmv2_unavailable())
    from .bmv2_fabric import Bmv2Switch

    switches = [Bmv2Switch() for _ in range(3)]
    yield switches
    for switch in switches:
        switch.shutdown()


def test_bmv2_two_level_topology_matches_reference_byte_for_byte(bmv2_switches) -> None:
    """A spine and 1-2 leaves of 1-3 hosts on BMv2, one simple_switch_grpc each, driven by
    the same random schedules as the native topology: every delivery's datagrams and, at the
    end, the job's counters on every switch agree with the reference pipelines'."""

    @settings(max_examples=SEQUENCES[TOPOLOGY["bmv2"]], deadline=None, derandomize=True,
              phases=(Phase.explicit, Phase.reuse, Phase.generate),
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=st.data(), leaves=st.integers(1, 2), hosts=st.integers(1, 3))
    def check(data, leaves, hosts) -> None:
        run_topology(leaves, hosts, data.draw(topology_events(leaves, hosts)), bmv2_switches)

    check()


def test_native_leaves_under_a_bmv2_spine_match_reference_byte_for_byte(bmv2_switches) -> None:
    """Targets mixed: the leaves the softswitch's native pipelines, the spine BMv2, the same
    schedules; the uplinks and verdicts between them cross as datagrams and frames."""

    @settings(max_examples=SEQUENCES[TOPOLOGY["mixed"]], deadline=None, derandomize=True,
              phases=(Phase.explicit, Phase.reuse, Phase.generate),
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=st.data(), leaves=st.integers(1, 3), hosts=st.integers(1, 3))
    def check(data, leaves, hosts) -> None:
        run_topology(leaves, hosts, data.draw(topology_events(leaves, hosts)), bmv2_switches,
                     native_leaves=True)

    check()
