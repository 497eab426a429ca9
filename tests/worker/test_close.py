"""Transport.close() from another thread while a call runs in the engine: the call ends at
once with TransportClosedError (aborted as a failed call: residual kept, resync flagged),
close() returns only once the call has left the engine, and the socket's descriptor is not
used after it is closed. Against a switch that never answers: a UDP socket that reads and
drops, so the test knows when the call's first packet has left."""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch

from hysync.worker.api import HySyncWorker
from hysync.worker.quantize import FixedPointQuantizer
from hysync.worker.transport import Transport, TransportClosedError, TransportConfig

SCALE = 2.0**20
# Twice the backstop: a call that ends within the backstop did not wait for the switch to be
# declared gone.
DEAD_AFTER = 120.0
BACKSTOP = 60.0  # seconds: only ends a hung test


@pytest.fixture
def silent_switch() -> Iterator[socket.socket]:
    """A switch that reads every datagram and answers none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(BACKSTOP)
        yield sock


def make_transport(switch: socket.socket) -> Transport:
    config = TransportConfig(job_id=3, worker_id=0, switch_host="127.0.0.1",
                             switch_port=switch.getsockname()[1], bind_host="127.0.0.1",
                             slot_base=0, slot_count=4, members=1, dead_after=DEAD_AFTER, seed=0)
    return Transport(config, FixedPointQuantizer(SCALE, 1))


class Caller(threading.Thread):
    """Runs `call` on a thread of its own and keeps what it raised."""

    def __init__(self, call: Callable[[], object]) -> None:
        super().__init__(daemon=True)
        self._call = call
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._call()
        except BaseException as err:  # noqa: BLE001 - the test looks at it
            self.error = err


def test_close_during_allreduce_ends_the_call_at_once(silent_switch):
    tr = make_transport(silent_switch)
    values = np.ones(300, dtype=np.float32)
    caller = Caller(lambda: tr.allreduce("g", values))
    caller.start()
    silent_switch.recv(2048)  # the call is in the engine, waiting on the switch
    tr.close()
    caller.join(BACKSTOP)
    assert not caller.is_alive(), "the call went on after close()"
    assert isinstance(caller.error, TransportClosedError), caller.error
    assert "transport is closed" in str(caller.error) and "'g'" in str(caller.error)
    assert tr.needs_resync  # aborted: the outcome of what was in flight is unknown
    np.testing.assert_allclose(tr.residual("g")[:300], 1.0)  # nothing lost


def test_the_closed_descriptor_is_not_read_by_the_call(silent_switch):
    """The descriptor number of the closed socket goes to the next socket the process opens;
    a datagram sent to that socket stays there for its owner."""
    tr = make_transport(silent_switch)
    caller = Caller(lambda: tr.allreduce("g", np.ones(300, dtype=np.float32)))
    caller.start()
    silent_switch.recv(2048)
    fd = tr._sock.fileno()
    tr.close()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as reuser:
        reuser.bind(("127.0.0.1", 0))
        if reuser.fileno() != fd:
            pytest.fail(f"the new socket got descriptor {reuser.fileno()}, not {fd}: the "
                        "test cannot show who reads the reused number")
        reuser.settimeout(BACKSTOP)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            for n in range(20):
                sender.sendto(b"datagram %d" % n, reuser.getsockname())
        got = [reuser.recv(2048) for _ in range(20)]
    assert got == [b"datagram %d" % n for n in range(20)]
    caller.join(BACKSTOP)
    assert isinstance(caller.error, TransportClosedError), caller.error


def test_close_during_poll_results_ends_it(silent_switch):
    tr = make_transport(silent_switch)
    caller = Caller(lambda: tr.poll_results(DEAD_AFTER))
    caller.start()
    while caller.is_alive() and tr._caller is None:  # the poll has taken the engine
        caller.join(0.01)
    tr.close()
    caller.join(BACKSTOP)
    assert not caller.is_alive(), "the poll went on after close()"
    assert isinstance(caller.error, TransportClosedError), caller.error
    assert "poll_results" in str(caller.error)


def test_every_call_after_close_is_refused_and_close_is_idempotent(silent_switch):
    tr = make_transport(silent_switch)
    tr.close()
    tr.close()
    with pytest.raises(TransportClosedError, match="allreduce of key 'g'.*transport is closed"):
        tr.allreduce("g", np.ones(10, dtype=np.float32))
    with pytest.raises(TransportClosedError, match="poll_results"):
        tr.poll_results(0.01)
    with pytest.raises(TransportClosedError, match="finish"):
        tr.finish(timeout=0.01)
    assert tr._sock.fileno() == -1


def test_a_second_call_during_a_call_is_refused_naming_the_fix(silent_switch):
    tr = make_transport(silent_switch)
    caller = Caller(lambda: tr.allreduce("g", np.ones(300, dtype=np.float32)))
    caller.start()
    silent_switch.recv(2048)
    try:
        with pytest.raises(RuntimeError, match="during another call.*one call at a time"):
            tr.poll_results(0.01)
        with pytest.raises(RuntimeError, match="during another call"):
            tr.allreduce("h", np.ones(10, dtype=np.float32))
    finally:
        tr.close()
    caller.join(BACKSTOP)
    assert not caller.is_alive(), "the call went on after close()"
    assert isinstance(caller.error, TransportClosedError), caller.error


def test_close_from_a_signal_handler_inside_the_call_ends_it(silent_switch):
    """The engine runs signal handlers while it waits, in the calling thread: a handler that
    closes the transport must not wait for that call to leave (it is the call)."""
    tr = make_transport(silent_switch)
    previous = signal.signal(signal.SIGUSR1, lambda *_: tr.close())
    try:
        caller = threading.Timer(0.0, lambda: (silent_switch.recv(2048),
                                               os.kill(os.getpid(), signal.SIGUSR1)))
        caller.start()
        with pytest.raises(TransportClosedError):
            tr.allreduce("g", np.ones(300, dtype=np.float32))
        caller.join(BACKSTOP)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert tr._sock.fileno() == -1  # the call closed the socket as it left
    np.testing.assert_allclose(tr.residual("g")[:300], 1.0)


def test_worker_close_ends_the_running_call_and_the_queued_ones(silent_switch):
    """HySyncWorker.close() with a call in the engine and two queued behind it: it does not
    wait out `dead_after` for each; every future fails with TransportClosedError."""
    config = TransportConfig(job_id=3, worker_id=0, switch_host="127.0.0.1",
                             switch_port=silent_switch.getsockname()[1],
                             bind_host="127.0.0.1", slot_base=0, slot_count=4, members=1,
                             dead_after=DEAD_AFTER, seed=0)
    hw = HySyncWorker(config, scale=SCALE)
    futures = [hw.allreduce_async(torch.ones(300), f"k{i}") for i in range(3)]
    silent_switch.recv(2048)  # the first call is in the engine, waiting on the switch
    closer = Caller(hw.close)
    closer.start()
    closer.join(BACKSTOP)
    assert not closer.is_alive() and closer.error is None, closer.error
    for i, future in enumerate(futures):
        with pytest.raises(TransportClosedError) as caught:
            future.wait()
        assert f"key 'k{i}'" in str(caught.value), caught.value
