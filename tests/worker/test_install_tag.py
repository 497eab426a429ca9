"""The install tag on the worker engine (docs/protocol.md §9, "A switch that lost the job's
state"), on its in-memory backend: the tag given at attach is the state the worker knows
from the start, and a late packet of the state it left is told by when it arrived, not by
when it is read."""

from __future__ import annotations

import numpy as np

from hysync import _core, wire
from hysync.worker.config import engine_config

RESET, PENDING = 4, 3  # Engine.step's statuses


def _engine(install_tag: int) -> tuple[_core.worker.Engine, int]:
    """An engine of worker 0 of 2 on slot 0, attached with `install_tag`, in a call whose
    chunk is sent."""
    e = _core.worker.Engine(engine_config(job_id=1, worker_id=0, switch_ip="127.0.0.1",
                                          slot_base=0, slot_count=1, members=2,
                                          install_tag=install_tag))
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
