"""The client side of `hysync serve`'s socket: one JSON object per line each way.

    with ServeClient("127.0.0.1:9600") as serve:
        reply = serve.request({"op": "status"})

A request gets exactly one reply, `{"ok": true, ...}` or `{"ok": false, "error": "..."}`
(raised here as `ServeError` with the server's sentence). The connection that admitted
a job is that job's lease: when it closes - the training script ended or crashed - the
server removes the job (controlplane/serve.py).
"""

from __future__ import annotations

import json
import socket
from types import TracebackType
from typing import Any

from controlplane.errors import ControlPlaneError
from controlplane.inventory import parse_listen


class ServeError(ControlPlaneError):
    """`hysync serve` refused a request, or cannot be reached."""


def open_socket(address: str, timeout: float) -> socket.socket:
    kind, where = parse_listen(address)
    family = socket.AF_UNIX if kind == "unix" else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(where)
    except OSError as err:
        sock.close()
        raise ServeError(f"cannot reach `hysync serve` at {address}: {err.strerror or err}; "
                         "start it with `hysync serve INVENTORY`") from None
    return sock


class ServeClient:
    def __init__(self, address: str, *, timeout: float = 30.0) -> None:
        self.address = address
        self.sock = open_socket(address, timeout)
        self._reader = self.sock.makefile("r", encoding="utf-8")

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        try:
            self.sock.sendall((json.dumps(message) + "\n").encode())
            line = self._reader.readline()
        except OSError as err:
            raise ServeError(f"`hysync serve` at {self.address} went away: "
                             f"{err.strerror or err}") from None
        if not line:
            raise ServeError(f"`hysync serve` at {self.address} closed the connection")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise ServeError(str(reply.get("error", "refused without a reason")))
        return reply

    def close(self) -> None:
        self._reader.close()
        self.sock.close()

    def __enter__(self) -> ServeClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
