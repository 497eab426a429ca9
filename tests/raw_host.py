"""A host's rounds on one slot, driven over a raw UDP socket (no worker engine): the tests
of a job across switches use it to keep real datagrams flowing through leaves and a spine."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

from hysync import wire
from hysync.softswitch.levels import serial_after
from hysync.wire import Op


def follow_rounds(sock: socket.socket, send: Callable[[int, int], None], stop: threading.Event,
                  *, delay: float = 0.0, back: bool = False,
                  on_result: Callable[[wire.Header, bytes], None] | None = None) -> None:
    """Until `stop`: after `delay` (a slow host), `send(round, tx)` the contribution, wait for
    its answer (send again, the next tx, on the socket's timeout), and follow the round the
    answer names: a RESULT's next, a RESYNC's ahead (`back`: also behind, a new install's
    rounds starting again at 0). `on_result` sees each RESULT that moved the host on."""
    r, tx = 0, 1
    while not stop.is_set():
        time.sleep(delay)
        send(r, tx)
        try:
            data = sock.recv(65536)
        except TimeoutError:
            tx += 1
            continue
        hdr = wire.Header.unpack(data)  # the header alone: a RESYNC carries no lanes
        if hdr.op == Op.RESULT and serial_after(hdr.round + 1, r):
            if on_result is not None:
                on_result(hdr, data)
            r, tx = hdr.round + 1, 1
        elif hdr.op == Op.RESYNC and (hdr.round != r if back else serial_after(hdr.round, r)):
            r, tx = hdr.round, 1
