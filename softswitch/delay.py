"""Per-port link delay, emulated in the switch: this kernel has no netem.

A frame for a delayed port waits in a time-ordered queue until its departure time;
the data plane's poll timeout shrinks to the next departure. FIFO per port is kept
because every frame of a port has the same delay.
"""

from __future__ import annotations

import heapq
import itertools
import time


class DelayLine:
    def __init__(self, delays_ms: dict[int, float]) -> None:
        for port, ms in delays_ms.items():
            if ms < 0:
                raise ValueError(f"port {port}: a delay must be >= 0 ms, got {ms:g}")
        self.delays = {port: ms / 1000.0 for port, ms in delays_ms.items() if ms > 0}
        self._queue: list[tuple[float, int, int, bytes]] = []
        self._order = itertools.count()

    def delayed(self, port: int) -> bool:
        return port in self.delays

    def push(self, port: int, frame: bytes, now: float | None = None) -> None:
        due = (time.monotonic() if now is None else now) + self.delays[port]
        heapq.heappush(self._queue, (due, next(self._order), port, frame))

    def due(self, now: float | None = None) -> list[tuple[int, bytes]]:
        """Every (port, frame) whose departure time has come, in departure order."""
        now = time.monotonic() if now is None else now
        out = []
        while self._queue and self._queue[0][0] <= now:
            _, _, port, frame = heapq.heappop(self._queue)
            out.append((port, frame))
        return out

    def timeout_ms(self, default_ms: int, now: float | None = None) -> int:
        """How long the data plane may sleep before the next departure."""
        if not self._queue:
            return default_ms
        now = time.monotonic() if now is None else now
        return max(0, min(default_ms, int((self._queue[0][0] - now) * 1000) + 1))

    def __len__(self) -> int:
        return len(self._queue)


def parse_delay(text: str) -> tuple[int, float]:
    """'PORT:MS' -> (port, ms)."""
    port, sep, ms = text.partition(":")
    try:
        if not sep:
            raise ValueError
        value = (int(port), float(ms))
    except ValueError:
        raise ValueError(
            f"--delay {text!r} is not PORT:MS (e.g. 3:5 delays port 3 by 5 ms)") from None
    if value[0] < 0 or value[1] < 0:
        raise ValueError(f"--delay {text!r}: port and milliseconds must be >= 0")
    return value
