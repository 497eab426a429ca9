"""What every softswitch data plane shares: a serve() loop on a thread of its own."""

from __future__ import annotations

import threading
from typing import Self


class ServingThread:
    """start() runs `serve` on a daemon thread until stop(); `close` releases the sockets."""

    thread_name = "softswitch-dataplane"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.packets_in = 0
        self.packets_out = 0

    def serve(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        self._thread = threading.Thread(target=self.serve, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.close()
