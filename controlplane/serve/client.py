"""The client side of `hysync serve`'s socket: one JSON object per line each way.

    with ServeClient("127.0.0.1:9600", token=read_token(path)) as serve:
        reply = serve.request({"op": "status"})

A serve that asks for a token (controlplane/serve/auth.py) gets it in a `hello`, the first
request of every connection; `operator=True` asks to act on every job (the CLI).

A request gets exactly one reply, `{"ok": true, ...}` or `{"ok": false, "error": "..."}`
(raised here as `ServeError` with the server's sentence). The connection that admitted
a job is that job's lease: when it closes - the training script ended or crashed - the
server removes the job (controlplane/serve/server.py).
"""

from __future__ import annotations

import json
import logging
import select
import socket
import ssl
import threading
import time
from types import TracebackType
from typing import Any

from hysync.controlplane.errors import ControlPlaneError
from hysync.controlplane.testbed.serve_access import parse_listen

log = logging.getLogger(__name__)


class ServeError(ControlPlaneError):
    """`hysync serve` refused a request, or cannot be reached."""


def open_socket(address: str, timeout: float,
                tls: ssl.SSLContext | None = None) -> socket.socket:
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
    if tls is None or kind == "unix":
        return sock
    assert isinstance(where, tuple)
    try:
        return tls.wrap_socket(sock, server_hostname=where[0])
    except OSError as err:  # ssl.SSLError among them: a certificate either side refused
        sock.close()
        raise ServeError(f"TLS with `hysync serve` at {address} failed: "
                         f"{getattr(err, 'reason', None) or err}; check serve.cacert and the "
                         "client certificate") from None


class ConnectionLostError(ServeError):
    """The serve closed the connection or went away (it stopped or restarted)."""


class ServeClient:
    """One connection to a serve. A request that meets a lost connection (the serve
    restarted) reconnects, retrying for `timeout` seconds, and is sent once more.
    `hold(job_ids)` makes the connection a lease that outlives a restart: a watcher
    thread notices the connection closing, reconnects and claims the jobs again before
    the restarted serve's grace period ends."""

    def __init__(self, address: str, *, timeout: float = 30.0, token: str | None = None,
                 operator: bool = False, tls: ssl.SSLContext | None = None) -> None:
        self.address, self.timeout = address, timeout
        self.token, self.operator, self.tls = token, operator, tls
        self.sock = open_socket(address, timeout, tls)
        self._reader = self.sock.makefile("r", encoding="utf-8")
        self._lock = threading.Lock()  # one exchange on the socket at a time
        self._held: list[int] = []
        self._key: str | None = None
        self._closed = False
        try:
            self._hello()
        except BaseException:
            self._reader.close()
            self.sock.close()
            raise

    def _hello(self) -> None:
        if self.token is None and not self.operator:
            return  # a serve without a token: nothing to present
        message: dict[str, Any] = {"op": "hello", "operator": self.operator}
        if self.token is not None:
            message["token"] = self.token
        reply = self._exchange(message)
        if not reply.get("ok"):
            raise ServeError(f"`hysync serve` at {self.address} refused this connection: "
                             f"{reply.get('error')}")

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            try:
                reply = self._exchange(message)
            except ConnectionLostError:  # a restarted serve: once more on a new connection
                self._reconnect()
                reply = self._exchange(message)
        if not reply.get("ok"):
            raise ServeError(str(reply.get("error", "refused without a reason")))
        return reply

    def _exchange(self, message: dict[str, Any]) -> dict[str, Any]:
        try:
            self.sock.sendall((json.dumps(message) + "\n").encode())
            line = self._reader.readline()
        except OSError as err:
            raise ConnectionLostError(f"`hysync serve` at {self.address} went away: "
                                      f"{err.strerror or err}") from None
        if not line:
            raise ConnectionLostError(f"`hysync serve` at {self.address} closed the connection")
        return json.loads(line)

    def hold(self, job_ids: list[int], key: str | None = None) -> None:
        """Keep the lease of `job_ids` across serve restarts (see the class); `key`, the
        admit's, is handed to the restarted serve with the claim."""
        self._held, self._key = list(job_ids), key
        threading.Thread(target=self._watch, daemon=True, name="hysync-lease").start()

    def _watch(self) -> None:
        while not self._closed:
            time.sleep(0.5)
            with self._lock:
                if self._closed:
                    return
                try:
                    if self._lost():
                        self._reconnect()
                except (OSError, ServeError) as err:
                    log.error("lost the lease of jobs %s: %s", self._held, err)
                    return

    def _lost(self) -> bool:
        """Whether serve closed the connection. Serve sends nothing unasked, so between
        two exchanges a readable socket is its end of stream."""
        readable, _, _ = select.select([self.sock], [], [], 0)
        if not readable:
            return False
        if not isinstance(self.sock, ssl.SSLSocket):
            return not self.sock.recv(1, socket.MSG_PEEK)
        self.sock.setblocking(False)  # TLS has no peek: read what made it readable
        try:
            return not self.sock.recv(1)
        except ssl.SSLWantReadError:  # a TLS record that carried no data
            return False
        except ssl.SSLEOFError:
            return True
        finally:
            self.sock.settimeout(self.timeout)

    def _reconnect(self) -> None:
        self._reader.close()
        self.sock.close()
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                self.sock = open_socket(self.address, self.timeout, self.tls)
                break
            except ServeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        self._reader = self.sock.makefile("r", encoding="utf-8")
        self._hello()
        if not self._held:
            return
        reply = self._exchange({"op": "claim", "jobs": self._held, "key": self._key})
        if not reply.get("ok"):
            raise ServeError(f"the restarted serve at {self.address} refused the claim of "
                             f"jobs {self._held}: {reply.get('error')}")
        log.info("reconnected to %s and claimed jobs %s", self.address, self._held)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._reader.close()
            self.sock.close()

    def __enter__(self) -> ServeClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
