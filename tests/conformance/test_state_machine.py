"""Packet-in / packets-out cases for every branch of docs/protocol.md §4, on every target."""

from __future__ import annotations

import numpy as np
from scapy.layers.inet import UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from hysync import p4names, wire
from hysync.scapy import HySync
from hysync.wire import DropReason, Flag, Mode, ResyncReason

from .conftest import install
from .targets import job_group, job_writes, mode_write
from .topology import (
    JOB1,
    JOB2,
    PORTS,
    ack,
    contribution,
    lanes_of,
    multicast,
    raw_frame,
    result,
    resync,
    unicast,
    wrap_sum,
)

ALL4 = 0b1111


def member(job, w: int) -> int:
    return wire.member_index(job.job_id, w)


def drop(job_id: int, reason: DropReason) -> int:
    return job_id * wire.NUM_DROP_REASONS + reason


def send(target, job, w, slot, rnd, chunk=0, **kw):
    return target.send(job.member(w).port, contribution(job, w, slot, rnd, chunk, **kw))


def close_round(target, job, slot, rnd, workers, chunk=0):
    """Contribute from `workers` in order; return the outputs of the last one."""
    for w in workers[:-1]:
        assert send(target, job, w, slot, rnd, chunk) == []
    return send(target, job, workers[-1], slot, rnd, chunk)


# ------------------------------------------------------------------ sync
def test_sync_round_closes_when_every_member_contributed(target):
    out = close_round(target, JOB1, 3, 0, [0, 1, 2, 3], chunk=77)
    expected_sum = wrap_sum(*(lanes_of(w) for w in range(4)))
    assert out == multicast(JOB1, result(JOB1, 3, 3, 0, 77, ALL4, expected_sum))
    for w in range(4):
        assert target.counter(p4names.STATS_CONTRIBUTIONS, member(JOB1, w)) == 1
        assert target.counter(p4names.REPLICATION_RESULTS, member(JOB1, w)) == 1


def test_sync_next_round_writes_the_other_bank_fresh(target):
    close_round(target, JOB1, 3, 0, [0, 1, 2, 3])
    lanes = np.full(wire.LANES, 5, dtype=np.int32)
    for w in range(3):
        assert target.send(JOB1.member(w).port,
                           contribution(JOB1, w, 3, 1, 0, lanes)) == []
    out = target.send(JOB1.member(3).port, contribution(JOB1, 3, 3, 1, 0, lanes))
    assert out == multicast(JOB1, result(JOB1, 3, 3, 1, 0, ALL4, lanes * 4))


def test_sums_wrap_modulo_2_to_the_32(target):
    big = np.full(wire.LANES, 2**31 - 1, dtype=np.int32)
    for w in range(3):
        target.send(JOB1.member(w).port, contribution(JOB1, w, 0, 0, 0, big))
    out = target.send(JOB1.member(3).port, contribution(JOB1, 3, 0, 0, 0, big))
    assert out == multicast(JOB1, result(JOB1, 3, 0, 0, 0, ALL4, wrap_sum(big, big, big, big)))


def test_duplicate_in_open_round_is_dropped_and_counted(target):
    assert send(target, JOB1, 0, 5, 0) == []
    assert send(target, JOB1, 0, 5, 0, flags=Flag.RETRANSMIT) == []
    assert target.counter(p4names.STATS_DUPLICATES, member(JOB1, 0)) == 1
    assert target.counter(p4names.STATS_DROPS, drop(1, DropReason.DUPLICATE)) == 1
    # The round still needs the other three and sums worker 0 once.
    out = close_round(target, JOB1, 5, 0, [1, 2, 3])
    assert out == multicast(JOB1, result(JOB1, 3, 5, 0, 0, ALL4,
                                         wrap_sum(*(lanes_of(w) for w in range(4)))))


def test_retransmission_after_close_gets_the_stored_result_unicast(target):
    close_round(target, JOB1, 2, 0, [0, 1, 2, 3], chunk=9)
    out = send(target, JOB1, 1, 2, 0, chunk=9, flags=Flag.RETRANSMIT)
    stored = result(JOB1, 1, 2, 0, 9, ALL4, wrap_sum(*(lanes_of(w) for w in range(4))),
                    flags=Flag.RESEND)
    assert out == unicast(JOB1, 1, stored)
    assert target.counter(p4names.STATS_DUPLICATES, member(JOB1, 1)) == 1
    assert target.counter(p4names.STATS_LATE, member(JOB1, 1)) == 0
    assert target.counter(p4names.REPLICATION_RESULTS, member(JOB1, 1)) == 2


def test_previous_result_stays_readable_while_next_round_accumulates(target):
    close_round(target, JOB1, 2, 0, [0, 1, 2, 3], chunk=9)
    new = np.full(wire.LANES, -3, dtype=np.int32)
    target.send(JOB1.member(0).port, contribution(JOB1, 0, 2, 1, 10, new))
    out = send(target, JOB1, 2, 2, 0, chunk=9)
    stored = result(JOB1, 2, 2, 0, 9, ALL4, wrap_sum(*(lanes_of(w) for w in range(4))),
                    flags=Flag.RESEND)
    assert out == unicast(JOB1, 2, stored)


def test_stale_round_gets_resync_saying_not_counted(target):
    for rnd in range(2):
        close_round(target, JOB1, 4, rnd, [0, 1, 2, 3], chunk=rnd)
    send(target, JOB1, 0, 4, 2, chunk=5)  # round 2 under way: count 1, bitmap 0b1
    out = send(target, JOB1, 3, 4, 0, chunk=0)  # two rounds behind
    reply = resync(JOB1, 3, 4, open_round=2, chunk=5, count=1, bitmap=0b1,
                   reason=ResyncReason.STALE_ROUND)
    # Worker 3 *was* counted in round 0 but has since been counted in round 1: the
    # switch remembers the last round only, so only that one is reported as counted.
    assert out == unicast(JOB1, 3, reply)
    assert target.counter(p4names.STATS_STALE, member(JOB1, 3)) == 1
    assert target.counter(p4names.STATS_DROPS, drop(1, DropReason.STALE)) == 1


def test_stale_round_that_counted_the_worker_says_so(bare_target):
    install(bare_target, JOB1, Mode.PARTIAL, 2)
    t = bare_target
    assert send(t, JOB1, 0, 1, 0) == []
    close = send(t, JOB1, 1, 1, 0)  # round 0 closes with {0, 1}
    assert len(close) == 4
    send(t, JOB1, 2, 1, 1)
    send(t, JOB1, 3, 1, 1)  # round 1 closes with {2, 3}
    out = send(t, JOB1, 0, 1, 0, flags=Flag.RETRANSMIT)  # worker 0 lost round 0's result
    reply = resync(JOB1, 0, 1, open_round=2, chunk=0, count=0, bitmap=0,
                   reason=ResyncReason.STALE_COUNTED, mode=Mode.PARTIAL, quorum=2)
    assert out == unicast(JOB1, 0, reply)


def test_round_ahead_of_the_switch_gets_resync(target):
    out = send(target, JOB1, 2, 6, 7)
    reply = resync(JOB1, 2, 6, open_round=0, chunk=0, count=0, bitmap=0,
                   reason=ResyncReason.STALE_ROUND)
    assert out == unicast(JOB1, 2, reply)


def test_chunk_mismatch_gets_resync_naming_the_latched_chunk(target):
    send(target, JOB1, 0, 7, 0, chunk=100)
    out = send(target, JOB1, 1, 7, 0, chunk=101)
    reply = resync(JOB1, 1, 7, open_round=0, chunk=100, count=1, bitmap=0b1,
                   reason=ResyncReason.CHUNK_MISMATCH)
    assert out == unicast(JOB1, 1, reply)
    assert target.counter(p4names.STATS_DROPS, drop(1, DropReason.CHUNK_MISMATCH)) == 1
    assert target.counter(p4names.STATS_CONTRIBUTIONS, member(JOB1, 1)) == 0


# --------------------------------------------------------------- partial
def test_partial_closes_at_quorum_and_the_straggler_is_late(bare_target):
    install(bare_target, JOB1, Mode.PARTIAL, 3)
    t = bare_target
    out = close_round(t, JOB1, 8, 0, [2, 0, 1], chunk=4)
    summed = wrap_sum(lanes_of(0), lanes_of(1), lanes_of(2))
    assert out == multicast(JOB1, result(JOB1, 1, 8, 0, 4, 0b0111, summed,
                                         mode=Mode.PARTIAL, quorum=3))
    late = send(t, JOB1, 3, 8, 0, chunk=4)
    resent = result(JOB1, 3, 8, 0, 4, 0b0111, summed, mode=Mode.PARTIAL, quorum=3,
                    flags=Flag.RESEND)
    assert late == unicast(JOB1, 3, resent)
    assert t.counter(p4names.STATS_LATE, member(JOB1, 3)) == 1
    assert t.counter(p4names.STATS_CONTRIBUTIONS, member(JOB1, 3)) == 0


# ----------------------------------------------------------------- async
def test_async_closes_a_round_per_contribution_and_acks_retransmissions(bare_target):
    install(bare_target, JOB1, Mode.ASYNC, 0)
    t = bare_target
    out = send(t, JOB1, 2, 9, 0xDEAD0001, chunk=3)
    assert out == multicast(JOB1, result(JOB1, 2, 9, 0, 3, 0b0100, lanes_of(2),
                                         mode=Mode.ASYNC))
    out = send(t, JOB1, 0, 9, 0xBEEF0001, chunk=3)
    assert out == multicast(JOB1, result(JOB1, 0, 9, 1, 3, 0b0001, lanes_of(0),
                                         mode=Mode.ASYNC))
    again = send(t, JOB1, 2, 9, 0xDEAD0001, chunk=3, flags=Flag.RETRANSMIT)
    assert again == unicast(JOB1, 2, ack(JOB1, 2, 9, 0xDEAD0001, 3))
    assert t.counter(p4names.STATS_DUPLICATES, member(JOB1, 2)) == 1
    assert t.counter(p4names.STATS_CONTRIBUTIONS, member(JOB1, 2)) == 1


# ------------------------------------------------------------- hot swap
def test_mode_change_mid_round_applies_from_the_next_round(target):
    send(target, JOB1, 0, 10, 0)
    target.write("MODIFY", mode_write(JOB1, Mode.PARTIAL, 2))
    # Round 0 latched sync: worker 1 does not close it.
    assert send(target, JOB1, 1, 10, 0) == []
    out = close_round(target, JOB1, 10, 0, [2, 3])
    assert out[0][1][wire.HYSYNC_OFFSET + 3] == Mode.SYNC
    # Round 1 starts after the swap: partial(2).
    out = close_round(target, JOB1, 10, 1, [3, 1])
    assert out == multicast(JOB1, result(JOB1, 1, 10, 1, 0, 0b1010,
                                         wrap_sum(lanes_of(3), lanes_of(1)),
                                         mode=Mode.PARTIAL, quorum=2))


def test_mode_change_exactly_at_a_round_boundary(target):
    close_round(target, JOB1, 11, 0, [0, 1, 2, 3])
    target.write("MODIFY", mode_write(JOB1, Mode.ASYNC, 0))
    out = send(target, JOB1, 1, 11, 0x11110001, chunk=6)
    assert out == multicast(JOB1, result(JOB1, 1, 11, 1, 6, 0b0010, lanes_of(1),
                                         mode=Mode.ASYNC))
    target.write("MODIFY", mode_write(JOB1, Mode.SYNC, 0))
    # The next contribution starts round 2 under sync again.
    assert send(target, JOB1, 0, 11, 2) == []


def test_a_higher_priority_range_overrides_part_of_the_job(target):
    target.write("INSERT", mode_write(JOB1, Mode.PARTIAL, 1, lo=12, hi=13, priority=10))
    out = send(target, JOB1, 0, 12, 0)
    assert out == multicast(JOB1, result(JOB1, 0, 12, 0, 0, 0b1, lanes_of(0),
                                         mode=Mode.PARTIAL, quorum=1))
    assert send(target, JOB1, 0, 14, 0) == []  # outside the override: sync


# ------------------------------------------------------------ membership
def test_excluded_member_is_not_admitted_and_rounds_close_without_it(bare_target):
    install(bare_target, JOB1, active=(0, 1, 2))
    t = bare_target
    assert send(t, JOB1, 3, 0, 0) == []
    assert t.counter(p4names.STATS_DROPS, drop(1, DropReason.NOT_MEMBER)) == 1
    out = close_round(t, JOB1, 0, 0, [0, 1, 2])
    summed = wrap_sum(lanes_of(0), lanes_of(1), lanes_of(2))
    assert out == multicast(JOB1, result(JOB1, 2, 0, 0, 0, 0b0111, summed), members=(0, 1, 2))


def test_shrinking_membership_never_strands_an_open_round(target):
    close_round(target, JOB1, 1, 0, [0, 1], chunk=0)[:0]  # two of four in round 0
    # Exclude worker 3: job config now says 3 members, group without 3.
    target.write("MODIFY", job_writes(JOB1, active=(0, 1, 2))[3])
    out = send(target, JOB1, 2, 1, 0)
    summed = wrap_sum(lanes_of(0), lanes_of(1), lanes_of(2))
    assert out == multicast(JOB1, result(JOB1, 2, 1, 0, 0, 0b0111, summed))
    target.write_group("MODIFY", JOB1.job_id, job_group(JOB1, (0, 1, 2)))


# ------------------------------------------------------------ two jobs
def test_two_jobs_aggregate_independently(target):
    assert send(target, JOB2, 0, 16, 0) == []
    out1 = close_round(target, JOB1, 0, 0, [0, 1, 2, 3])
    out2 = send(target, JOB2, 1, 16, 0)
    assert len(out1) == 4
    assert out2 == multicast(JOB2, result(JOB2, 1, 16, 0, 0, 0b11,
                                          wrap_sum(lanes_of(0), lanes_of(1))))


# ------------------------------------------------------------- drops
def _assert_state_unchanged(target):
    """A full sync round on slot 15 still sums exactly the four contributions."""
    out = close_round(target, JOB1, 15, 0, [0, 1, 2, 3])
    assert out == multicast(JOB1, result(JOB1, 3, 15, 0, 0, ALL4,
                                         wrap_sum(*(lanes_of(w) for w in range(4)))))


def _payload(**fields):
    """A crafted HySync datagram: job 1 worker 0's CONTRIB for slot 15 unless overridden."""
    header = dict(op=wire.Op.CONTRIB, job_id=1, worker_id=0, slot=15, round=0,
                  lanes=[int(v) for v in lanes_of(0)])
    header.update(fields)
    return HySync(**header)


def test_malformed_packets_are_dropped_counted_and_change_nothing(target):
    lanes = [int(v) for v in lanes_of(0)]
    cases = [
        (raw_frame(JOB1, 0, bytes(_payload())[:10]), 0, DropReason.MALFORMED),  # short header
        (raw_frame(JOB1, 0, _payload(lanes=lanes[:25])), 1, DropReason.MALFORMED),  # short lanes
        (raw_frame(JOB1, 0, _payload(version=2)), 1, DropReason.BAD_VERSION),
        (raw_frame(JOB1, 0, _payload(op=wire.Op.RESULT)), 1, DropReason.BAD_OP),
        (raw_frame(JOB1, 0, _payload(op=9)), 1, DropReason.BAD_OP),  # header only
        (raw_frame(JOB1, 0, _payload() / Raw(b"\0" * 8)), 1, DropReason.BAD_LENGTH),
        # Right IPv4/UDP lengths, but bytes after the IPv4 packet.
        (raw_frame(JOB1, 0, _payload()) + b"\xee" * 6, 1, DropReason.BAD_LENGTH),
    ]
    for frame, job, reason in cases:
        assert target.send(1, frame) == [], reason
        assert target.counter(p4names.STATS_DROPS, drop(job, reason)) >= 1, reason
    assert target.counter(p4names.STATS_DROPS, drop(1, DropReason.BAD_OP)) == 2
    _assert_state_unchanged(target)


def test_every_drop_is_counted_switch_wide_whatever_job_its_bytes_name(target):
    """Garbage is counted under the job id its bytes happen to carry;
    the switch-wide counter sees every drop by reason."""
    cases = [(_payload(job_id=77, version=3), DropReason.BAD_VERSION),
             (_payload(job_id=0xBEEF, op=7), DropReason.BAD_OP),
             (_payload(job_id=200), DropReason.NOT_MEMBER),
             (_payload(job_id=1, worker_id=9), DropReason.NOT_MEMBER)]
    for payload, _ in cases:
        assert target.send(1, raw_frame(JOB1, 0, payload)) == []
    for reason in DropReason:
        expected = sum(1 for _, r in cases if r == reason)
        assert target.counter(p4names.STATS_SWITCH_DROPS, reason) == expected, reason
    _assert_state_unchanged(target)


def test_non_members_and_foreign_slots_are_dropped_and_counted(target):
    frame = Ether(raw_frame(JOB1, 0, _payload()))
    frame[UDP].sport += 1  # an address the members table does not admit
    wrong_port = bytes(frame)
    assert target.send(1, wrong_port) == []
    assert send(target, JOB1, 0, 16, 0) == []  # JOB2's slot
    assert send(target, JOB1, 0, 4000, 0) == []  # beyond every job
    assert target.counter(p4names.STATS_DROPS, drop(1, DropReason.NOT_MEMBER)) == 1
    assert target.counter(p4names.STATS_DROPS, drop(1, DropReason.SLOT_RANGE)) == 2
    _assert_state_unchanged(target)


def test_member_of_a_job_without_config_is_dropped(bare_target):
    t = bare_target
    for w in job_writes(JOB1)[:4]:
        t.write("INSERT", w)
    assert send(t, JOB1, 0, 0, 0) == []
    assert t.counter(p4names.STATS_DROPS, drop(1, DropReason.NO_JOB)) == 1


# ------------------------------------------------------- L2 forwarding
def _ether(dst: bytes, src: bytes, ethertype: bytes = b"\x08\x06") -> bytes:
    return dst + src + ethertype + bytes(46)


def test_broadcast_floods_to_every_other_port(target):
    frame = _ether(b"\xff" * 6, JOB1.member(0).mac)
    assert target.send(1, frame) == [(p, frame) for p in PORTS if p != 1]


def test_known_unicast_goes_to_its_port(target):
    target.write("INSERT", _l2(JOB1.member(2).mac, 3))
    frame = _ether(JOB1.member(2).mac, JOB1.member(0).mac, b"\x08\x00")
    assert target.send(1, frame) == [(3, frame)]


def test_tcp_between_hosts_is_forwarded_untouched(target):
    target.write("INSERT", _l2(JOB1.member(1).mac, 2))
    a, b = JOB1.member(0), JOB1.member(1)
    ip = bytearray(wire.build_frame(wire.FrameAddress(a.mac, b.mac, a.ip, b.ip, 5555, 6666),
                                    b"hello"))
    ip[wire.ETH_BYTES + 9] = 6  # TCP: not HySync even with a HySync-looking port
    frame = bytes(ip)
    assert target.send(1, frame) == [(2, frame)]


def _l2(mac: bytes, port: int):
    from .targets import Write

    return Write(p4names.FORWARDING_L2, (int.from_bytes(mac, "big"),),
                 p4names.FORWARDING_SET_EGRESS_PORT, (port,))


def test_retransmission_closes_a_round_that_an_exclusion_completed(target):
    for w in (0, 1, 2):
        assert send(target, JOB1, w, 6, 0) == []  # waiting for worker 3
    target.write("MODIFY", job_writes(JOB1, active=(0, 1, 2))[3])  # exclude worker 3
    target.write_group("MODIFY", JOB1.job_id, job_group(JOB1, (0, 1, 2)))
    out = send(target, JOB1, 1, 6, 0, flags=Flag.RETRANSMIT)
    summed = wrap_sum(lanes_of(0), lanes_of(1), lanes_of(2))
    assert out == multicast(JOB1, result(JOB1, 1, 6, 0, 0, 0b0111, summed), members=(0, 1, 2))
    assert target.counter(p4names.STATS_DUPLICATES, member(JOB1, 1)) == 1


def test_the_contribution_that_closes_a_round_is_counted_as_its_close(target):
    close_round(target, JOB1, 1, 0, [2, 0, 3, 1])
    close_round(target, JOB1, 1, 1, [0, 1, 2, 3])
    assert [target.counter(p4names.STATS_CLOSES, member(JOB1, w))
            for w in range(4)] == [0, 1, 0, 1]
