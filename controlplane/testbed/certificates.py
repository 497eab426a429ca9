"""Certificates made with the `openssl` command: a CA, and certificates it signs. What
`hysync rack up` gives its emulated rack (the switch serves mutual TLS and takes writes
from serve's certificate only), and what the TLS tests make. Keys are EC P-256, mode 0600."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from hysync.controlplane.errors import ControlPlaneError

# The common name of serve's certificate in a rack: the one the softswitch's --writer names.
SERVE_NAME = "hysync-serve"


class CertificateError(ControlPlaneError):
    """openssl is missing or failed; the message says which."""


def _openssl(*args: str | Path) -> None:
    if shutil.which("openssl") is None:
        raise CertificateError("making certificates needs the `openssl` command: install it "
                               "(Debian: apt-get install openssl)")
    done = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True,
                          timeout=60)
    if done.returncode != 0:
        raise CertificateError(f"openssl {args[0]} failed: {done.stderr.strip()[-300:]}")


def make_ca(d: Path, name: str, days: int = 2) -> tuple[Path, Path]:
    """(certificate, key) of a new CA whose common name is `name`, in `d`."""
    key, cert = d / f"{name}.key", d / f"{name}.pem"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", key, "-out", cert, "-days", str(days), "-subj", f"/CN={name}")
    os.chmod(key, 0o600)
    return cert, key


def make_signed(d: Path, name: str, ca: tuple[Path, Path], ext: str,
                days: int = 2) -> tuple[Path, Path]:
    """(certificate, key) with common name `name`, signed by `ca`, with the x509v3
    extensions `ext` (one per line: subjectAltName, extendedKeyUsage)."""
    key, csr, cert = d / f"{name}.key", d / f"{name}.csr", d / f"{name}.pem"
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
    os.chmod(key, 0o600)
    extfile = d / f"{name}.ext"
    extfile.write_text(ext + "\n")
    _openssl("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
             "-out", cert, "-days", str(days), "-extfile", extfile)
    return cert, key


def rack_certificates(d: Path, switch_ip: str) -> dict[str, Path]:
    """A rack's CA, the switch's certificate for `switch_ip`, and serve's (the inventory's
    [switch] cert: the one certificate the switch takes writes from), in `d`."""
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca = make_ca(d, "rack-ca", days=365)
    switch = make_signed(d, "switch", ca, f"subjectAltName=IP:{switch_ip}\n"
                         "extendedKeyUsage=serverAuth", days=365)
    serve = make_signed(d, SERVE_NAME, ca, "extendedKeyUsage=clientAuth", days=365)
    return {"ca": ca[0], "switch_cert": switch[0], "switch_key": switch[1],
            "serve_cert": serve[0], "serve_key": serve[1]}


def fabric_certificates(d: Path, switch_ips: dict[str, str]) -> dict[str, Path]:
    """A cluster's CA, a certificate for each switch (name -> its P4Runtime address), and
    serve's (the one certificate every switch takes writes from), in `d`: keys "ca",
    "serve_cert", "serve_key", and "<name>_cert", "<name>_key" per switch."""
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca = make_ca(d, "rack-ca", days=365)
    made = {"ca": ca[0]}
    for name, ip in switch_ips.items():
        cert, key = make_signed(d, name, ca, f"subjectAltName=IP:{ip}\n"
                                "extendedKeyUsage=serverAuth", days=365)
        made |= {f"{name}_cert": cert, f"{name}_key": key}
    serve = make_signed(d, SERVE_NAME, ca, "extendedKeyUsage=clientAuth", days=365)
    return made | {"serve_cert": serve[0], "serve_key": serve[1]}
