"""An ACKed twin on the worker engine (docs/protocol.md §9, "A switch that lost the job's
state"), on its in-memory backend: a sync-style contribution that an ACK settles as counted
after the slot turned async was counted in an async round, whose RESULT - a round of one with
its lanes - a later packet of the same chunk and lanes would take for its own count."""

from __future__ import annotations

import numpy as np

from hysync import _core, wire
from hysync.worker.config import engine_config
from tests.worker.scripted_switch import engine_with_faults, stepper

DONE, PENDING, RESET = 0, 3, 4  # Engine.step's statuses
TAG = 7  # the install tag the engine is attached with, which every RESULT and ACK carries


def _reply(op: wire.Op, answered: wire.Header, rnd: int, mode: wire.Mode,
           **fields: int) -> bytes:
    """The switch's reply of `op` to worker 0's contribution `answered` (its transmission
    number echoed, for a RESULT only with `echo`), for round `rnd` of slot 0."""
    echo = fields.pop("echo", op != wire.Op.RESULT)
    header = wire.Header(op=op, job_id=1, worker_id=0, slot=0, round=rnd, chunk=answered.chunk,
                         mode=mode, flags=answered.flags & wire.TX_MASK if echo else 0,
                         **fields)
    if op != wire.Op.RESULT:
        return header.pack()
    return wire.Packet(header, np.zeros(wire.LANES, np.int32)).encode()


def _twin_result_in_next_call(**faults: bool) -> tuple[int, _core.worker.Engine, wire.Header]:
    """Worker 0 of 2 sends zeros (every call's packet alike) at slot 0's round 2, taught by
    a STALE answer to its probe; the slot turns async and the packet is counted in async round
    2, whose RESULT is late: an ACK settles it. The next call's packet goes out under a
    sequence number, its floor round 3, and round 2's RESULT arrives - my bit, my chunk, my
    lanes. The step's status then, the engine, and that packet."""
    e = engine_with_faults(engine_config(job_id=1, worker_id=0, switch_ip="127.0.0.1",
                                         slot_base=0, slot_count=1, members=2,
                                         install_tag=TAG), **faults)
    e.register("grad", wire.LANES)
    step = stepper(e)

    e.set_time(0.0)
    e.begin_call("grad", np.zeros(wire.LANES, np.float32))
    _status, (probe,) = step(0.0)
    _status, (flight,) = step(0.001, _reply(wire.Op.RESYNC, probe, 2, wire.Mode.SYNC,
                                            reason=wire.ResyncReason.STALE_ROUND))
    assert flight.round == 2
    status, _sent = step(0.002, _reply(wire.Op.ACK, flight, 2, wire.Mode.ASYNC, reason=TAG))
    assert status == DONE
    e.set_time(0.01)
    e.begin_call("grad", np.zeros(wire.LANES, np.float32))
    _status, (packet,) = step(0.01)
    assert packet.round != 2  # a sequence number: the slot is async
    e.stats()  # (its "results": the headers applied since it was last asked, taken)
    status, _sent = step(0.011, _reply(wire.Op.RESULT, flight, 2, wire.Mode.ASYNC, count=1,
                                       bitmap=0b01, reason=TAG))
    return status, e, packet


def test_the_async_result_of_an_acked_sync_style_packet_is_its_own_not_the_next_packets() -> None:
    """Round 2's RESULT is the ACKed packet's: applied once (no ACK applied it), and the next
    call's packet waits for its own answer, which its ACK then gives. Taken out
    (Faults::acked_sync_leaves_no_twin), the RESULT is read as that packet counted below its
    floor by a new switch state: the call ends reset on no restart."""
    status, e, packet = _twin_result_in_next_call()
    assert (status, e.needs_resync) == (PENDING, False)
    assert len(e.stats()["results"]) // wire.HEADER_BYTES == 1  # applied, once
    e.set_time(0.012)
    e.on_datagram(_reply(wire.Op.ACK, packet, packet.round, wire.Mode.ASYNC, reason=TAG), 0.012)
    assert e.step(0.012) == DONE
    status, e, _packet = _twin_result_in_next_call(acked_sync_leaves_no_twin=True)
    assert (status, e.needs_resync) == (RESET, True)
