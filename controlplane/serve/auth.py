"""Who is talking to `hysync serve`, and what they may do.

A connection is a *client* (it may admit jobs and act on the jobs it admitted or holds the
key of) or, when it asks to be and its credential allows, the *operator* (it may act on
every job: the CLI's `--serve`). What decides:

* a Unix socket: the socket file's mode decides who can connect at all (0600 unless
  `serve.socket_mode`); the peer's uid (SO_PEERCRED) decides the role: root and the
  serve's own user may act as operator, any other user is a client;
* TCP with `serve.token_file`: nothing but `hello` until the connection presents the token
  (compared in constant time). With `serve.operator_token_file` too, only that second
  token may act as operator; without it, the one token may;
* TCP with mutual TLS (`serve.cacert`, `serve.cert`, `serve.private_key`): only clients
  presenting a certificate `cacert` signed get through the handshake; those whose common
  name is in `serve.operators` may act as operator (every one, if the list is empty).
  Clients present `serve.client_cert` and `serve.client_key`. A token may be required too;
* TCP on a loopback address with neither: every local user may connect, as operator if
  asked (use a Unix socket or a token on a machine shared with users you do not trust).
  On any other address serve refuses to start without a token or mutual TLS.

A token file must be readable by its owner only (mode 0600 or stricter), on the serve's
machine and on every client's.

Against abuse (the numbers below): a connection must say hello within HELLO_SECONDS;
only authenticated connections count against a client's limit, and the `Lobby` keeps at
most MAX_WAITING_PER_ADDRESS unauthenticated ones per address, closing the oldest; a wrong
token closes its connection, and repeated ones from an address are answered ever later.
"""

from __future__ import annotations

import hmac
import os
import socket
import ssl
import stat
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from hysync.controlplane.serve.client import ServeError
from hysync.controlplane.testbed.serve_access import MAKE_TOKEN, ServeAccess, loopback

TOKEN_ENV = "HYSYNC_SERVE_TOKEN_FILE"  # the client side's token file, if not given otherwise
MIN_TOKEN = 16  # characters: `openssl rand -hex 32` gives 64
# Each rank of a training script holds one connection; 32 ranks per host at most
# (a job has 32 members), plus room for the CLI. Only authenticated connections count.
MAX_CONNECTIONS_PER_CLIENT = 64
# Training jobs one client (an address, a uid, a certificate) may hold at once; the
# operator has no quota.
MAX_JOBS_PER_CLIENT = 8
# A connection that has not authenticated within this long is closed: it holds a thread.
# A client sends its hello right after connecting; an authenticated one (a script's lease)
# may idle.
HELLO_SECONDS = 5.0
# Connections from one address still waiting to authenticate: past this many, the oldest
# is closed to make room, so connections that never authenticate cannot keep a client
# with the token out.
MAX_WAITING_PER_ADDRESS = 16
# Failed hellos: each closes its connection; past FREE_FAILURES from one address within
# FAILURE_WINDOW seconds, every further refusal is answered only after a delay growing to
# MAX_FAILURE_DELAY, which caps how fast one address can guess (a right token is never
# delayed).
FREE_FAILURES = 5
FAILURE_WINDOW = 60.0
MAX_FAILURE_DELAY = 2.0


def client_context(cacert: Path | str, cert: Path | str | None = None,
                   key: Path | str | None = None) -> ssl.SSLContext:
    """A client's TLS to serve: serve's certificate checked against `cacert`, this
    client's `cert` and `key` presented. ServeError naming a file that cannot be used."""
    try:
        ctx = ssl.create_default_context(cafile=str(cacert))
        if cert is not None:
            ctx.load_cert_chain(str(cert), str(key) if key else None)
    except (OSError, ssl.SSLError) as err:
        raise ServeError(f"cannot use the serve's TLS files ({cacert}, {cert}, {key}): "
                         f"{getattr(err, 'strerror', None) or err}") from None
    return ctx


def inventory_client_context(access: ServeAccess) -> ssl.SSLContext | None:
    """What a client of the inventory's serve presents: None where serve has no TLS."""
    if not access.tls:
        return None
    assert access.cacert is not None
    return client_context(access.cacert, access.client_cert, access.client_key)


def read_token(path: Path | str, what: str = "the token file") -> str:
    """The token in `path`; ServeError if the file cannot be read, others may read it,
    or it is too short to be a secret."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        raise ServeError(f"cannot read {what} {path}: {reason}; {MAKE_TOKEN}") from None
    if stat.S_IMODE(mode) & 0o077:
        raise ServeError(f"{what} {path} has mode {stat.S_IMODE(mode):04o}: others may read "
                         f"it; chmod 600 {path}")
    if len(token) < MIN_TOKEN:
        raise ServeError(f"{what} {path} holds {len(token)} characters: a token has at least "
                         f"{MIN_TOKEN}; {MAKE_TOKEN}")
    return token


@dataclass(slots=True)
class Peer:
    """One connection's identity: who (for messages), whether it has authenticated,
    whether it may act as operator, whether it asked to."""
    who: str
    client: tuple[str, object]  # what the connection limit counts by: ("tcp", ip) | ("unix", uid)
    authenticated: bool
    may_operate: bool
    operator: bool = False
    counted: bool = False  # counted among its client's connections (authenticated ones)


class Gate:
    """The serve's side: the tokens, read once at start, and each connection's Peer."""

    def __init__(self, access: ServeAccess, kind: str, where: object, inventory: Path) -> None:
        self.kind = kind
        self.token = read_token(access.token_file, "serve.token_file") \
            if access.token_file else None
        self.operator_token = read_token(access.operator_token_file,
                                         "serve.operator_token_file") \
            if access.operator_token_file else None
        self.socket_mode = access.socket_mode
        self.operators = access.operators
        self.hello_seconds = HELLO_SECONDS
        self.tls: ssl.SSLContext | None = None
        if access.tls:
            if kind != "tcp":
                raise ServeError("serve.cert is for a TCP serve.listen: a unix socket is "
                                 "guarded by its file mode (serve.socket_mode); remove "
                                 "serve.cacert, serve.cert and serve.private_key")
            try:
                self.tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH,
                                                      cafile=str(access.cacert))
                self.tls.verify_mode = ssl.CERT_REQUIRED
                self.tls.num_tickets = 0  # no resumption: nothing sent that a client must read
                self.tls.load_cert_chain(str(access.cert), str(access.private_key))
            except (OSError, ssl.SSLError) as err:
                raise ServeError(f"cannot use serve.cacert/cert/private_key of {inventory}: "
                                 f"{getattr(err, 'strerror', None) or err}") from None
        if kind == "tcp" and self.token is None and self.tls is None:
            host = str(where[0]) if isinstance(where, tuple) else str(where)
            if not loopback(host):
                raise ServeError(
                    f"serve.listen = {host}:{where[1] if isinstance(where, tuple) else ''} "
                    "is reachable from other machines and [serve] names no credential: add "
                    f"token_file = \"/etc/hysync/serve.token\" to [serve] in {inventory} "
                    f"({MAKE_TOKEN}), or cacert, cert and private_key (mutual TLS), or "
                    "listen on 127.0.0.1 or a unix: socket")

    def peer(self, sock: socket.socket, address: object) -> Peer:
        if self.kind == "unix":
            _, uid, _ = struct.unpack("3i", sock.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
            return Peer(f"uid {uid}", ("unix", uid), True, uid in (0, os.getuid()))
        ip = address[0] if isinstance(address, tuple) else str(address)
        if isinstance(sock, ssl.SSLSocket):  # the handshake checked the certificate
            name = _common_name(sock.getpeercert())
            operator = not self.operators or name in self.operators
            return Peer(f"{ip} ({name})", ("tcp", ip), self.token is None, operator)
        if self.token is None:  # loopback only (checked at start): local users
            return Peer(f"{ip}", ("tcp", ip), True, True)
        return Peer(f"{ip}", ("tcp", ip), False, False)

    def hello(self, peer: Peer, token: str | None, operator: bool) -> None:
        """Authenticate `peer` with `token` and grant the operator role if asked and
        allowed; ServeError (and nothing granted) if not."""
        if token is not None and self.token is not None:
            given = token.encode()
            if self.operator_token is not None and \
                    hmac.compare_digest(given, self.operator_token.encode()):
                peer.authenticated = peer.may_operate = True
            elif hmac.compare_digest(given, self.token.encode()):
                peer.authenticated = True
                peer.may_operate = peer.may_operate if self.tls else self.operator_token is None
            else:
                raise ServeError("wrong token: present the one in the inventory's "
                                 "serve.token_file (--token-file FILE, or "
                                 f"${TOKEN_ENV})")
        if not peer.authenticated:
            raise ServeError(self.refusal())
        if operator and not peer.may_operate:
            raise ServeError(f"{peer.who} may not act as the operator: "
                             + ("present a certificate whose common name serve.operators lists"
                                if self.tls else "present serve.operator_token_file's token"
                                if self.kind == "tcp" else
                                "connect as root or as the user serve runs as"))
        peer.operator = bool(operator)

    def refusal(self) -> str:
        return ("authenticate first: send {\"op\": \"hello\", \"token\": ...} with the token "
                "of serve.token_file (the CLI: --token-file FILE or "
                f"${TOKEN_ENV}; hysync.torch.attach reads the inventory's)")


class Lobby:
    """The connections of each address that have not authenticated yet, and its failed
    hellos: what keeps traffic without the token from crowding out a client that has it."""

    def __init__(self, max_waiting: int = MAX_WAITING_PER_ADDRESS) -> None:
        self.max_waiting = max_waiting
        self._lock = threading.Lock()
        self._waiting: dict[object, dict[int, socket.socket]] = {}  # insertion order: age
        self._failures: dict[object, deque[float]] = {}

    def enter(self, address: object, conn: int, sock: socket.socket) -> socket.socket | None:
        """Connection `conn` waits to authenticate; the oldest waiting one of its address
        is returned, to be closed, when there are more than max_waiting."""
        with self._lock:
            waiting = self._waiting.setdefault(address, {})
            waiting[conn] = sock
            if len(waiting) <= self.max_waiting:
                return None
            oldest = next(iter(waiting))
            return waiting.pop(oldest)

    def leave(self, address: object, conn: int) -> None:
        """`conn` authenticated or closed."""
        with self._lock:
            waiting = self._waiting.get(address)
            if waiting is not None:
                waiting.pop(conn, None)
                if not waiting:
                    del self._waiting[address]

    def failed(self, address: object) -> float:
        """Record a failed hello of `address`; the seconds to wait before refusing it."""
        now = time.monotonic()
        with self._lock:
            recent = self._failures.setdefault(address, deque())
            while recent and recent[0] < now - FAILURE_WINDOW:
                recent.popleft()
            recent.append(now)
            excess = len(recent) - FREE_FAILURES
            if len(self._failures) > 4096:  # many addresses: forget those quiet for a window
                for quiet in [a for a, d in self._failures.items() if d[-1] < now - FAILURE_WINDOW]:
                    del self._failures[quiet]
        return 0.0 if excess <= 0 else min(MAX_FAILURE_DELAY, 0.25 * excess)


def _common_name(cert: dict[str, object] | None) -> str:
    for rdn in (cert or {}).get("subject", ()):  # type: ignore[union-attr]
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return "no common name"
