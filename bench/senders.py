"""Load generators for the benches: windowed contributors over UDP (loopback by default,
or a host address in a network namespace: `bind`, `switch_host`).

Each sender keeps one contribution in flight per slot of its window (the next round
of a slot goes out when that slot's result arrives), as a SwitchML worker does, so
the switch is loaded to its capacity without being flooded past its socket buffer.
A sender can also record, per slot, when the first result aggregated under a given
mode arrived: that is when the slot *latched* it (the hot-swap bench).
"""

from __future__ import annotations

import select
import socket
import time

import numpy as np

from hysync import wire
from hysync.wire import Op

BASE_PORT = 47100
RTO_S = 0.1  # per-slot retransmission timeout


def sender_main(w: int, job: int, switch_port: int, slots: tuple[int, int], seconds: float,
                start, out, watch_mode: int | None = None, *, bind: str = "127.0.0.1",
                switch_host: str = "127.0.0.1", tally: dict[str, int] | None = None,
                sock: socket.socket | None = None) -> None:
    """Contribute on slots [base, base+count) until `seconds` pass; put the count sent
    (and, with watch_mode, {slot: monotonic time of its first result in that mode}).

    sock: a UDP socket bound already (a port the kernel chose, which the job names); else
    the sender binds `bind` (its port is BASE_PORT + w, in a namespace of its own);
    switch_host: where the switch listens (port switch_port). tally, if given, is filled
    with the number of timeout retransmissions, RESYNCs and RESULTs received."""
    base, count = slots
    if sock is None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((bind, BASE_PORT + w))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
    sock.setblocking(False)
    dst = (switch_host, switch_port)
    retransmits = resyncs = results = 0
    batch = wire.empty_batch(count)
    batch["op"], batch["job_id"], batch["worker_id"] = Op.CONTRIB, job, w
    batch["slot"] = np.arange(base, base + count)
    batch["lanes"] = np.arange(wire.LANES, dtype=np.int32) + w
    packets = [bytearray(p) for p in wire.encode_batch(batch)]
    next_round = [0] * count
    sent_at = [0.0] * count
    latched: dict[int, float] = {}
    start.wait()
    now = time.monotonic()
    for i, pkt in enumerate(packets):
        sock.sendto(pkt, dst)
        sent_at[i] = now
    sent, deadline, last_sweep = count, time.perf_counter() + seconds, now
    while time.perf_counter() < deadline:
        select.select([sock], [], [], RTO_S / 2)
        now = time.monotonic()
        while True:
            try:
                data = sock.recv(2048)
            except BlockingIOError:
                break
            i = (data[8] << 8 | data[9]) - base
            rnd = int.from_bytes(data[12:16], "big")
            if data[1] == Op.RESYNC:  # fell behind (a partial round closed without us)
                resyncs += 1
                next_round[i] = rnd
            elif data[1] != Op.RESULT or rnd < next_round[i]:
                continue
            else:
                results += 1
                if watch_mode is not None and data[3] == watch_mode and i not in latched:
                    latched[i] = now
                next_round[i] = rnd + 1
            pkt = packets[i]
            pkt[12:16] = next_round[i].to_bytes(4, "big")
            sock.sendto(pkt, dst)
            sent_at[i] = now
            sent += 1
        if now - last_sweep > RTO_S / 2:  # retransmit what a full buffer dropped
            last_sweep = now
            for i in range(count):
                if now - sent_at[i] > RTO_S:
                    sock.sendto(packets[i], dst)
                    sent_at[i] = now
                    retransmits += 1
    if tally is not None:
        tally.update(retransmits=retransmits, resyncs=resyncs, results=results)
    out.put((sent, latched))
    sock.close()
