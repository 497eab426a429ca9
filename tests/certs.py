"""Certificates for TLS tests, made with the `openssl` command: a CA, a server certificate
for 127.0.0.1 and a client certificate it signed, and a client certificate another CA
signed (one the server must refuse)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


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


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)


def _ca(d: Path, name: str) -> tuple[Path, Path]:
    key, cert = d / f"{name}.key", d / f"{name}.pem"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", f"/CN={name}")
    return cert, key


def _signed(d: Path, name: str, ca: tuple[Path, Path], ext: str) -> tuple[Path, Path]:
    key, csr, cert = d / f"{name}.key", d / f"{name}.csr", d / f"{name}.pem"
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
    extfile = d / f"{name}.ext"
    extfile.write_text(ext + "\n")
    _openssl("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
             "-out", cert, "-days", "2", "-extfile", extfile)
    return cert, key


def make_certs(d: Path) -> Certs:
    if shutil.which("openssl") is None:
        pytest.fail("the TLS tests make their certificates with the `openssl` command: "
                    "install it (Debian: apt-get install openssl)")
    d.mkdir(parents=True, exist_ok=True)
    ca = _ca(d, "ca")
    server = _signed(d, "switch", ca, "subjectAltName=IP:127.0.0.1\n"
                     "extendedKeyUsage=serverAuth")
    client = _signed(d, "controller", ca, "extendedKeyUsage=clientAuth")
    other = _ca(d, "other-ca")
    stranger = _signed(d, "stranger", other, "extendedKeyUsage=clientAuth")
    intruder = _signed(d, "intruder", ca, "extendedKeyUsage=clientAuth")
    return Certs(ca[0], *server, *client, *stranger, *intruder)
