"""The install tag on the worker engine (docs/protocol.md §9, "A switch that lost the job's
state"), on its in-memory backend: the tag given at attach is the state the worker knows
from the start, and a late packet of the state it left is told by when it arrived, not by
when it is read."""

from __future__ import annotations

import numpy as np

from hysync import _core, wire
from hysync.worker.config import engine_config
from tests.worker.scripted_switch import engine_with_faults, stepper

DONE, PENDING, RESET = 0, 3, 4  # Engine.step's statuses


def _engine(install_tag: int, **faults: bool) -> tuple[_core.worker.Engine, int]:
    """An engine of worker 0 of 2 on slot 0, attached with `install_tag`, in a call whose
    chunk is sent (the rules named in `faults` taken out)."""
    e = engine_with_faults(engine_config(job_id=1, worker_id=0, switch_ip="127.0.0.1",
                                         slot_base=0, slot_count=1, members=2,
                                         install_tag=install_tag), **faults)
    key = "grad"
    e.register(key, wire.LANES)
    e.set_time(0.0)
    e.begin_call(key, np.zeros(wire.LANES, np.float32))
    e.step(0.0)
    assert e.take_sent(), "the call sends its chunk"
    return e, e.first_chunk(key)


def _peer_result(tag: int, chunk: int, rnd: int = 0) -> bytes:
    """A result of worker 1's alone, of the install tagged `tag`."""
    return wire.Packet(wire.Header(op=wire.Op.RESULT, job_id=1, worker_id=1, slot=0, round=rnd,
                                   chunk=chunk, mode=wire.Mode.SYNC, count=1, reason=tag,
                                   bitmap=0b10),
                       np.zeros(wire.LANES, np.int32)).encode()


def test_a_first_reply_of_another_install_than_the_one_attached_to_is_a_new_state() -> None:
    e, chunk = _engine(7)
    e.on_datagram(_peer_result(8, chunk + 1), 0.001)
    assert (e.step(0.001), e.needs_resync) == (RESET, True)  # the call aborts, resync


def test_an_engine_given_no_tag_learns_it_from_its_first_reply() -> None:
    e, chunk = _engine(-1)
    e.on_datagram(_peer_result(8, chunk + 1), 0.001)
    assert (e.step(0.001), e.needs_resync) == (PENDING, False)


def test_a_late_packet_of_the_state_left_is_told_by_its_arrival() -> None:
    """The new state shows itself at 1 ms; a result of the state left that arrived 1 ms
    later is read 10 s later, after the call: dropped as late (the replica misses it), not
    taken for a third state. Read at its arrival time as if it had just arrived, it is."""
    for arrived, late in ((0.002, True), (10.0, False)):
        e, chunk = _engine(7)
        e.on_datagram(_peer_result(8, chunk + 1), 0.001)
        assert e.step(0.001) == RESET
        stray = e.stats()["stray_replies"]
        e.set_time(10.0)
        e.on_datagram(_peer_result(7, chunk + 1, rnd=5), 10.0, arrived)
        assert (e.stats()["stray_replies"] == stray + 1) == late, arrived


def _applied_after_late_packets_of_two_states_left(**faults: bool) -> int:
    """Attached with tag 7, the engine hears tag 8 at 1 ms (a restart: the call aborts) and
    tag 9 at 2 ms (the job installed again right after), whose round 0 it applies. Late
    results of tags 7 and 8 arrive at 3 and 4 ms, then a copy of tag 9's round 0 at 5 ms.
    How many times tag 9's round 0 was applied."""
    e, chunk = _engine(7, **faults)
    e.on_datagram(_peer_result(8, chunk + 1, rnd=3), 0.001)
    assert e.step(0.001) == RESET
    e.stats()  # (its "results": the headers applied since it was last asked, taken)
    applied = 0
    for now, tag in ((0.002, 9), (0.003, 7), (0.004, 8), (0.005, 9)):
        e.set_time(now)
        e.on_datagram(_peer_result(tag, chunk + 1, rnd=0 if tag == 9 else 4), now)
        results = e.stats()["results"]
        applied += tag == 9 and len(results) // wire.HEADER_BYTES
    assert e.needs_resync
    return applied


def test_a_late_packet_of_a_state_left_before_the_last_is_late_too() -> None:
    """Two resets in quick succession leave late packets of both states left on their way:
    each tag left is told late within two rto_max of when it was left, and the copy of tag
    9's round 0 is a duplicate. Taken out (Faults::one_tag_left), tag 7's late result is a
    third state, tag 8's a fourth, and tag 9's copy a fifth, whose round 0 is applied a
    second time (seed 10001822)."""
    assert _applied_after_late_packets_of_two_states_left() == 1
    assert _applied_after_late_packets_of_two_states_left(one_tag_left=True) == 2



def _reply(op: wire.Op, answered: wire.Header, rnd: int, **fields: int) -> bytes:
    """The switch's reply of `op` to worker 0's contribution `answered` (its transmission
    number echoed), for round `rnd` of its slot."""
    header = wire.Header(op=op, job_id=1, worker_id=0, slot=answered.slot, round=rnd,
                         chunk=answered.chunk, mode=wire.Mode.SYNC,
                         flags=fields.pop("flags", 0) | answered.flags & wire.TX_MASK,
                         **fields)
    if op == wire.Op.RESYNC:
        return header.pack()
    return wire.Packet(header, np.zeros(wire.LANES, np.int32)).encode()



def _reset_by_resync_after_round_0(install_tag: int, **faults: bool) -> _core.worker.Engine:
    """An engine attached with `install_tag` sends its chunk at slot 0's round 0; a late
    STALE answer to its probe (open round 2) teaches it round 2 - the state that sent it
    may be gone. Round 0's RESULT, tag 7, counts the chunk (a suspect of that lesson). The
    next call's chunk, at round 2, is answered STALE at open round 1: a new state shown by
    a RESYNC, against the round taught before tag 7 was heard (when attached with none)."""
    e = engine_with_faults(engine_config(job_id=1, worker_id=0, switch_ip="127.0.0.1",
                                         slot_base=0, slot_count=1, members=2,
                                         install_tag=install_tag), **faults)
    e.register("grad", wire.LANES)
    step = stepper(e)

    e.set_time(0.0)
    e.begin_call("grad", np.zeros(wire.LANES, np.float32))
    _status, (probe,) = step(0.0)
    stale = _reply(wire.Op.RESYNC, probe, 0, reason=wire.ResyncReason.STALE_ROUND)
    _status, (flight,) = step(0.001, stale)
    assert flight.round == 0
    step(0.0015, _reply(wire.Op.RESYNC, probe, 2, reason=wire.ResyncReason.STALE_ROUND))
    assert step(0.002, _reply(wire.Op.RESULT, flight, 0, count=2, reason=7,
                              bitmap=0b11))[0] == DONE
    e.set_time(0.01)
    e.begin_call("grad", np.zeros(wire.LANES, np.float32))
    _status, (flight,) = step(0.01)
    assert flight.round == 2
    status, _sent = step(0.011, _reply(wire.Op.RESYNC, flight, 1,
                                       reason=wire.ResyncReason.STALE_ROUND))
    assert (status, e.needs_resync) == (RESET, True)
    return e

def _applied_round_0_again(e: _core.worker.Engine) -> bool:
    """Tag 7 heard again past the late window: the RESEND of round 0 (a JOIN of the state
    that answered may meet it), then round 1. Whether round 0 was applied again; round 1 is
    applied either way."""
    e.stats()  # (its "results": the headers applied since it was last asked, taken)
    resend = wire.Header(op=wire.Op.RESULT, job_id=1, worker_id=1, slot=0, round=0,
                         chunk=e.first_chunk("grad"), flags=wire.Flag.RESEND)
    e.set_time(2.0)
    e.on_datagram(_reply(wire.Op.RESULT, resend, 0, count=2, reason=7, bitmap=0b11,
                         flags=wire.Flag.RESEND), 2.0)
    stats = e.stats()
    again = len(stats["results"]) // wire.HEADER_BYTES
    assert again + stats["duplicate_results"] == 1
    e.on_datagram(_reply(wire.Op.RESULT, resend, 1, count=2, reason=7, bitmap=0b11), 2.0)
    assert len(e.stats()["results"]) // wire.HEADER_BYTES == 1
    assert e.needs_resync
    return again == 1


def test_a_result_of_a_tag_learned_after_the_rounds_a_reset_left_is_not_applied_twice() -> None:
    """Given no tag at attach, the engine learns tag 7 from round 0's result, after the
    RESYNC that taught it round 2: the reset may have been shown by tag 7's own state,
    against a round an older one taught. Heard again, round 0 is a duplicate, the replica
    flagged; round 1, a suspect, is applied. Taken out (Faults::forget_rounds_of_tag_left),
    round 0 is applied again."""
    assert not _applied_round_0_again(_reset_by_resync_after_round_0(-1))
    assert _applied_round_0_again(_reset_by_resync_after_round_0(
        -1, forget_rounds_of_tag_left=True))


def test_a_tag_known_before_the_rounds_a_reset_left_is_a_newer_install_when_heard_again() -> None:
    """Attached with tag 7, the engine learned round 2 from tag 7's state, which the reset
    left for sure: tag 7 heard past the late window is a newer install with the same tag
    (docs/protocol.md §9), whose round 0 is new."""
    assert _applied_round_0_again(_reset_by_resync_after_round_0(7))


def _stale_counted_decided_after_a_reset(**faults: bool) -> tuple[int, int]:
    """An engine of two slots attached with tag 7 has slot 0's chunk, at round 3, answered
    STALE_COUNTED with open round 5: counted, its result lost; a grace period runs. Before it
    ends, a peer's result of tag 8 on slot 1, round 0, arrives: a new state. Read with the
    grace period over (a member back from a pause reads its queue at once), the call's timers
    run before it aborts. The next call's chunk on slot 0 is answered STALE at open round 0,
    then tag 8's RESEND of slot 1 round 0 arrives past the late window. The status after that
    STALE answer, and how often slot 1's round 0 was applied."""
    e = engine_with_faults(engine_config(job_id=1, worker_id=0, switch_ip="127.0.0.1",
                                         slot_base=0, slot_count=2, members=2, install_tag=7),
                           **faults)
    e.register("grad", 2 * wire.LANES)
    applied = 0

    def step(now: float, *data: bytes, arrived: float | None = None
             ) -> tuple[int, list[wire.Header]]:
        nonlocal applied
        e.set_time(now)
        for d in data:
            e.on_datagram(d, now, now if arrived is None else arrived)
        status = e.step(now)
        applied += len(e.stats()["results"]) // wire.HEADER_BYTES
        return status, [wire.Header.unpack(d) for d in e.take_sent()]

    def peer_round_0(chunk: int, **fields: int) -> bytes:
        return wire.Packet(wire.Header(op=wire.Op.RESULT, job_id=1, worker_id=1, slot=1, round=0,
                                       chunk=chunk, mode=wire.Mode.SYNC, count=1, reason=8,
                                       bitmap=0b10, **fields),
                           np.zeros(wire.LANES, np.int32)).encode()

    stale, counted = wire.ResyncReason.STALE_ROUND, wire.ResyncReason.STALE_COUNTED
    e.set_time(0.0)
    e.begin_call("grad", np.zeros(2 * wire.LANES, np.float32))
    _status, probes = step(0.0)
    _status, (flight, other) = step(0.001, *(_reply(wire.Op.RESYNC, p, 3, reason=stale)
                                             for p in probes))
    assert (flight.slot, flight.round, other.slot) == (0, 3, 1)
    step(0.002, _reply(wire.Op.RESYNC, flight, 5, reason=counted))
    assert step(1.0, peer_round_0(other.chunk), arrived=0.003)[0] == RESET
    assert applied == 1
    e.set_time(1.1)
    e.begin_call("grad", np.zeros(2 * wire.LANES, np.float32))
    _status, sent = step(1.1)
    (again,) = (h for h in sent if h.slot == 0)
    status, _sent = step(1.101, _reply(wire.Op.RESYNC, again, 0, reason=stale))
    step(2.2, peer_round_0(other.chunk, flags=wire.Flag.RESEND))
    return status, applied


def test_a_stale_counted_of_the_state_a_reset_left_teaches_the_new_state_no_round() -> None:
    """The STALE_COUNTED, of tag 7's state, decided after tag 8's reset, settles the flight
    but suspects no round of tag 8's: slot 0 is still to learn, its next chunk a probe that
    open round 0 answers as any other, and tag 8's RESEND of a round applied is a duplicate.
    Taken out (Faults::state_left_teaches_rounds), slot 0 learns round 4 there, the chunk sent
    at round 4 meets open round 0 - a reset, tag 8 left - and the RESEND, tag 8 heard again
    past the late window, is applied a second time (seed 9109296)."""
    assert _stale_counted_decided_after_a_reset() == (PENDING, 1)
    assert _stale_counted_decided_after_a_reset(state_left_teaches_rounds=True) == (RESET, 2)
