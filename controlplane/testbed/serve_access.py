"""How `hysync serve` is reached and who may use it: the inventory's [serve] table.

`parse_listen` reads where serve listens (HOST:PORT or unix:PATH); `access_from_table`
reads the credentials it asks for (tokens, mutual TLS, the Unix socket's mode) into a
`ServeAccess`. Serve enforces them (serve/auth.py); the inventory, serve and its clients
all read them from here.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_SOCKET_MODE = 0o600
MAKE_TOKEN = "make one with `openssl rand -hex 32 > FILE && chmod 600 FILE`"


@dataclass(frozen=True, slots=True)
class ServeAccess:
    """The [serve] table's credential fields."""
    token_file: Path | None = None
    operator_token_file: Path | None = None
    socket_mode: int = DEFAULT_SOCKET_MODE
    cacert: Path | None = None  # mutual TLS: the CA of serve's and the clients' certificates
    cert: Path | None = None  # serve's certificate and key
    private_key: Path | None = None
    client_cert: Path | None = None  # what clients present
    client_key: Path | None = None
    operators: tuple[str, ...] = ()  # client certificate common names that may operate

    @property
    def tls(self) -> bool:
        return self.cert is not None


_TLS_FILES = ("cacert", "cert", "private_key", "client_cert", "client_key")


def access_from_table(t: dict[str, Any], base: Path) -> ServeAccess:
    """[serve]'s token_file, operator_token_file, socket_mode; ValueError naming the field.
    Paths are relative to `base`; the files are read when serve starts or a client
    connects, so that an inventory loads on a machine that holds neither."""
    files: dict[str, Path | None] = {}
    for key in ("token_file", "operator_token_file", *_TLS_FILES):
        value = t.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            raise ValueError(f"serve.{key} = {value!r}: give the path of a file holding the "
                             + (f"token ({MAKE_TOKEN})" if "token" in key else "PEM"))
        files[key] = (base / value) if value else None
    tls = {k: files[k] for k in ("cacert", "cert", "private_key")}
    if any(tls.values()) and not all(tls.values()):
        raise ValueError("serve.cacert, serve.cert and serve.private_key go together (serve "
                         "over mutual TLS): give all three or none")
    if (files["client_cert"] is None) != (files["client_key"] is None):
        raise ValueError("serve.client_cert and serve.client_key go together: give both")
    operators = t.get("operators", [])
    if not isinstance(operators, list) or not all(isinstance(o, str) and o for o in operators):
        raise ValueError(f"serve.operators = {operators!r}: give a list of client certificate "
                         "common names, e.g. [\"ops\"]")
    mode = t.get("socket_mode", f"{DEFAULT_SOCKET_MODE:o}")
    if not (isinstance(mode, str) and len(mode) <= 4 and mode.isdigit()
            and set(mode) <= set("01234567") and not int(mode, 8) & 0o7007):
        raise ValueError(f"serve.socket_mode = {mode!r}: give the unix socket's mode as an "
                         "octal string without bits for others, e.g. \"0600\" or \"0660\"")
    if files["operator_token_file"] and not files["token_file"]:
        raise ValueError("serve.operator_token_file without serve.token_file: add token_file "
                         "(the training scripts' token)")
    return ServeAccess(files["token_file"], files["operator_token_file"], int(mode, 8),
                       *(files[k] for k in _TLS_FILES), tuple(operators))


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to any address


def parse_listen(text: object) -> tuple[str, str | tuple[str, int]]:
    """`serve.listen` -> ("unix", path) or ("tcp", (host, port)); ValueError if neither."""
    if not isinstance(text, str):
        raise ValueError(f"{text!r} must be a string: HOST:PORT or unix:PATH")
    if text.startswith("unix:"):
        if not text[5:]:
            raise ValueError(f"{text!r} names no socket path: write unix:/run/hysync.sock")
        return "unix", text[5:]
    host, sep, port = text.rpartition(":")
    if not (sep and host and port.isdigit() and int(port) < 65536):
        raise ValueError(f"{text!r} is neither HOST:PORT nor unix:PATH: write e.g. "
                         '"127.0.0.1:9600" or "unix:/run/hysync.sock"')
    return "tcp", (host, int(port))
