"""The native data plane against the reference model: random tables, packets and swaps.

Each example builds one random switch state (jobs, members, modes, multicast groups,
rewrites, L2 entries) in both the reference `Pipeline` (softswitch/pipeline.py) and the
`NativePipeline` (native/dataplane/), then drives both with the same random sequence of
events: contributions that are valid, duplicate, stale, out of range, from non-members,
malformed, truncated or oversized, as datagrams and as Ethernet frames (some with broken
IPv4/UDP layers), plus mode swaps and membership changes written in P4Runtime-like batches.
Every event's outputs must be byte-identical, and at the end every counter cell must agree.
"""

from __future__ import annotations

import contextlib

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hysync import p4names, wire
from hysync.softswitch.native import NativePipeline
from hysync.softswitch.pipeline import Pipeline
from hysync.softswitch.tables import Entry, EntryError, Replica

NUM_SLOTS = 24  # small: slot ranges reach past it, so the `slot >= num_slots` check runs too
JOB_IDS = (1, 2, 7)
WORKERS = range(5)
IPS = (wire.ip_to_int("10.0.0.1"), wire.ip_to_int("10.0.0.2"))
SWITCH_IP = wire.ip_to_int("10.0.0.100")
PORTS = (1, 2, 3)
MACS = (0x0A0000000001, 0x0A0000000002, 0xFFFFFFFFFFFF)


def udp_port(worker: int) -> int:
    return 5000 + worker


def member_entry(job: int, w: int) -> Entry:
    return Entry(p4names.ADMISSION_MEMBERS, (job, w, IPS[w % 2], udp_port(w)),
                 p4names.ADMISSION_ADMIT)


def job_entry(job: int, config: tuple[int, int, int, int, int]) -> Entry:
    return Entry(p4names.ADMISSION_JOBS, (job,), p4names.ADMISSION_SET_JOB, config)


def mode_entry(job: int, lo: int, hi: int, params: tuple[int, int], priority: int) -> Entry:
    return Entry(p4names.SYNC_MODE_MODES, (job, (lo, hi)), p4names.SYNC_MODE_SET_MODE, params,
                 priority)


# ------------------------------------------------------------------ tables
members = st.sets(st.tuples(st.sampled_from(JOB_IDS), st.sampled_from(WORKERS)), max_size=12)
# slot base, slot count, members, multicast group, install epoch (a new one: slots start afresh)
job_config = st.tuples(st.integers(0, 12), st.integers(0, 20), st.integers(0, 6),
                       st.sampled_from((0, 1, 2, 7, 99)), st.sampled_from((1, 1, 2)))
jobs = st.dictionaries(st.sampled_from(JOB_IDS), job_config, max_size=3)
mode_params = st.tuples(st.sampled_from((0, 0, 1, 2)), st.integers(0, 6))
modes = st.lists(st.tuples(st.sampled_from(JOB_IDS), st.integers(0, 30), st.integers(0, 30),
                           st.integers(-3, 3), mode_params), max_size=5)
replicas = st.lists(st.tuples(st.sampled_from(PORTS),
                              st.sampled_from([0] + [wire.member_rid(j, w) for j in JOB_IDS
                                                     for w in WORKERS])),
                    max_size=6, unique=True)
groups = st.dictionaries(st.sampled_from((1, 2, 7, wire.FLOOD_MCAST_GROUP)), replicas,
                         max_size=4)
rewrites = st.sets(st.tuples(st.sampled_from(JOB_IDS), st.sampled_from(WORKERS)), max_size=12)
l2 = st.dictionaries(st.sampled_from(MACS), st.sampled_from(PORTS), max_size=2)


@st.composite
def switch_state(draw: st.DrawFn) -> list[tuple[str, Entry]]:
    writes = [member_entry(j, w) for j, w in draw(members)]
    writes += [job_entry(j, cfg) for j, cfg in draw(jobs).items()]
    seen = set()
    for job, lo, hi, priority, params in draw(modes):
        if (job, lo, priority) not in seen:
            seen.add((job, lo, priority))
            writes.append(mode_entry(job, lo, max(lo, hi), params, priority))
    writes += [Entry(p4names.REPLICATION_REWRITE, (wire.member_rid(j, w),),
                     p4names.REPLICATION_REWRITE_DST, (0x020000000000 + w, IPS[w % 2], udp_port(w)))
               for j, w in draw(rewrites)]
    writes += [Entry(p4names.FORWARDING_L2, (mac,), p4names.FORWARDING_SET_EGRESS_PORT, (port,))
               for mac, port in draw(l2).items()]
    return [("INSERT", e) for e in writes]


# ------------------------------------------------------------------ packets
lanes = st.one_of(
    st.just(np.arange(wire.LANES, dtype=">i4").tobytes()),
    st.binary(min_size=wire.PAYLOAD_BYTES, max_size=wire.PAYLOAD_BYTES),  # wrapping adds too
)
header = st.fixed_dictionaries({
    "version": st.sampled_from((1, 1, 1, 1, 0, 2)),
    "op": st.sampled_from((1, 1, 1, 1, 1, 2, 3, 4, 0, 9)),
    # RETRANSMIT, JOIN and the transmission number that every reply echoes (bits 3-7)
    "flags": st.sampled_from((0, 1, 0x04, 0x05, 0x0C, 0xF9, 0xFC)),
    "job": st.sampled_from(JOB_IDS + (0, 3, 300)),
    "worker": st.sampled_from(tuple(WORKERS) + (31,)),
    "slot": st.integers(0, 30),
    "round": st.sampled_from((0, 1, 2, 3, 4, 0xFFFFFFFF, 77)),
    "chunk": st.sampled_from((0, 0, 1, 5)),
})
# How the datagram is cut or padded: most are whole.
shape = st.sampled_from(("whole",) * 8 + ("truncated", "oversized", "header_only", "empty"))


@st.composite
def datagram(draw: st.DrawFn) -> tuple[int, int, bytes]:
    h = draw(header)
    payload = wire.Header(op=h["op"], job_id=h["job"], worker_id=h["worker"], slot=h["slot"],
                          round=h["round"], chunk=h["chunk"], flags=h["flags"],
                          version=h["version"]).pack() + draw(lanes)
    cut = draw(shape)
    if cut == "truncated":
        payload = payload[:draw(st.integers(0, len(payload) - 1))]
    elif cut == "oversized":
        payload += bytes(draw(st.integers(1, 40)))
    elif cut == "header_only":
        payload = payload[:wire.HEADER_BYTES]
    elif cut == "empty":
        payload = b""
    if draw(st.integers(0, 9)) == 0:  # a stranger's address
        return draw(st.sampled_from(IPS)), 9999, payload
    return IPS[h["worker"] % 2], udp_port(h["worker"]), payload


# What may go wrong below the HySync header of a frame.
frame_fault = st.sampled_from((None,) * 10 + ("ethertype", "ip_version", "proto", "dst_port",
                                              "ip_len", "udp_len", "trailer", "cut"))


@st.composite
def frame(draw: st.DrawFn) -> tuple[int, bytes]:
    src_ip, src_port, payload = draw(datagram())
    src_mac, dst_mac = (draw(st.sampled_from(MACS)).to_bytes(6, "big") for _ in range(2))
    addr = wire.FrameAddress(src_mac=src_mac, dst_mac=dst_mac, src_ip=src_ip,
                             dst_ip=SWITCH_IP, src_port=src_port)
    raw = bytearray(wire.build_frame(addr, payload, ttl=draw(st.integers(1, 255)),
                                     ident=draw(st.integers(0, 0xFFFF))))
    fault = draw(frame_fault)
    if fault == "ethertype":
        raw[12:14] = b"\x86\xdd"
    elif fault == "ip_version":
        raw[14] = 0x46
    elif fault == "proto":
        raw[23] = 6
    elif fault == "dst_port":
        raw[36:38] = (80).to_bytes(2, "big")
    elif fault == "ip_len":
        raw[16:18] = (len(raw) - 13).to_bytes(2, "big")
    elif fault == "udp_len":
        raw[38:40] = (7).to_bytes(2, "big")
    elif fault == "trailer":
        raw += bytes(draw(st.integers(1, 30)))
    elif fault == "cut":
        raw = raw[:draw(st.integers(0, min(len(raw), 60)))]
    return draw(st.sampled_from(PORTS)), bytes(raw)


# ------------------------------------------------------------------ control-plane events
@st.composite
def swap(draw: st.DrawFn) -> list[tuple[str, Entry]]:
    """A hot swap: a new modes entry for a job's whole range, or one removed."""
    job = draw(st.sampled_from(JOB_IDS))
    entry = mode_entry(job, 0, 30, draw(mode_params), 10)
    return [(draw(st.sampled_from(("INSERT", "MODIFY", "DELETE"))), entry)]


@st.composite
def membership(draw: st.DrawFn) -> list[tuple[str, Entry]]:
    """An exclusion or readmission: a job's member count and one admission entry."""
    job, w = draw(st.sampled_from(JOB_IDS)), draw(st.sampled_from(WORKERS))
    return [("MODIFY", job_entry(job, draw(job_config))),
            (draw(st.sampled_from(("INSERT", "DELETE"))), member_entry(job, w))]


event = st.one_of(
    st.tuples(st.just("datagram"), datagram()),
    st.tuples(st.just("datagram"), datagram()),
    st.tuples(st.just("datagram"), datagram()),
    st.tuples(st.just("frame"), frame()),
    st.tuples(st.just("writes"), st.one_of(swap(), membership())),
    st.tuples(st.just("group"), st.tuples(st.sampled_from((1, 2, 7)), replicas)),
)


def apply_writes(pipeline: Pipeline, writes: list[tuple[str, Entry]]) -> None:
    """One P4Runtime write batch; updates the model refuses (NOT_FOUND...) are skipped alike."""
    with pipeline.batch():
        for update, entry in writes:
            with contextlib.suppress(EntryError):
                pipeline.write_entry(update, entry)


def counters_of(pipeline: Pipeline) -> dict[str, tuple[list[int], list[int]]]:
    return {name: (list(c.packets[:]), list(c.bytes[:])) for name, c in pipeline.counters.items()}


@settings(max_examples=2000, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(state=switch_state(), group_state=groups, events=st.lists(event, min_size=1, max_size=30))
def test_native_matches_reference_byte_for_byte(state, group_state, events) -> None:
    model, native = Pipeline(NUM_SLOTS), NativePipeline(NUM_SLOTS)
    for p in (model, native):
        apply_writes(p, state)
        for gid, reps in group_state.items():
            p.write_group("INSERT", gid, [Replica(port, rid) for port, rid in reps])
    for i, (kind, arg) in enumerate(events):
        if kind == "datagram":
            got, want = native.process_datagram(*arg), model.process_datagram(*arg)
        elif kind == "frame":
            got, want = native.process_frame(*arg), model.process_frame(*arg)
        elif kind == "writes":
            apply_writes(model, arg)
            apply_writes(native, arg)
            continue
        else:
            gid, reps = arg
            for p in (model, native):
                p.write_group("MODIFY" if gid in p.groups else "INSERT", gid,
                              [Replica(port, rid) for port, rid in reps])
            continue
        assert got == want, f"event {i} ({kind}) gave different outputs"
    assert counters_of(native) == counters_of(model)
