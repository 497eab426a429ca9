"""Certificates for TLS tests, made with the `openssl` command: a CA, a server certificate
for 127.0.0.1 and a client certificate it signed, and a client certificate another CA
signed (one the server must refuse)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from hysync.controlplane.testbed.certificates import make_ca, make_signed


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path  # signed by another CA
    stranger_key: Path
    intruder_cert: Path  # signed by the CA, but not the controller's name
    intruder_key: Path


def make_certs(d: Path) -> Certs:
    if shutil.which("openssl") is None:
        pytest.fail("the TLS tests make their certificates with the `openssl` command: "
                    "install it (Debian: apt-get install openssl)")
    d.mkdir(parents=True, exist_ok=True)
    ca = make_ca(d, "ca")
    server = make_signed(d, "switch", ca, "subjectAltName=IP:127.0.0.1\n"
                         "extendedKeyUsage=serverAuth")
    client = make_signed(d, "controller", ca, "extendedKeyUsage=clientAuth")
    other = make_ca(d, "other-ca")
    stranger = make_signed(d, "stranger", other, "extendedKeyUsage=clientAuth")
    intruder = make_signed(d, "intruder", ca, "extendedKeyUsage=clientAuth")
    return Certs(ca[0], *server, *client, *stranger, *intruder)
