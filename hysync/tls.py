"""P4Runtime over TLS: the PEM files of either end, as gRPC credentials.

The controller names them as p4runtime-shell does (`--cacert`, `--cert`,
`--private-key`; the inventory's [switch] cacert, cert, private_key); the softswitch as
Stratum does (`--ca-cert-file`, `--server-cert-file`, `--server-key-file`). With a CA
the softswitch requires every client to present a certificate it signed (mutual TLS).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

from hysync.errors import BadFileError


class TlsFileError(BadFileError):
    """A certificate or key file that cannot be used; the message names it."""


def read_pem(path: Path | str, what: str) -> bytes:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise TlsFileError(f"cannot read {what} {path}: {err.strerror or err}") from None
    if b"-----BEGIN " not in data:
        raise TlsFileError(f"{what} {path} is not PEM (no '-----BEGIN' line): give a "
                           "PEM-encoded file, e.g. from `openssl req ... -out FILE.pem`")
    return data


@dataclass(frozen=True, slots=True)
class ClientTls:
    """What a controller presents: the CA that signed the switch's certificate (None: the
    system's roots), and its own certificate and key for mutual TLS (both or neither)."""
    cacert: Path | None = None
    cert: Path | None = None
    private_key: Path | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.private_key is None):
            raise TlsFileError("a client certificate needs its private key and the key its "
                               "certificate: give both --cert and --private-key, or neither")

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=read_pem(self.cacert, "CA certificate") if self.cacert else None,
            private_key=read_pem(self.private_key, "private key") if self.private_key else None,
            certificate_chain=read_pem(self.cert, "certificate") if self.cert else None)


def channel(grpc_addr: str, tls: ClientTls | None,
            options: list[tuple[str, object]] | None = None) -> grpc.Channel:
    """A channel to `grpc_addr`: over TLS with `tls`, else in the clear."""
    if tls is None:
        return grpc.insecure_channel(grpc_addr, options=options)
    return grpc.secure_channel(grpc_addr, tls.credentials(), options=options)


def server_credentials(cert: Path | str, key: Path | str,
                       ca: Path | str | None = None) -> grpc.ServerCredentials:
    """The softswitch's side: its certificate and key; with `ca`, clients must present a
    certificate `ca` signed."""
    return grpc.ssl_server_credentials(
        [(read_pem(key, "server key"), read_pem(cert, "server certificate"))],
        root_certificates=read_pem(ca, "CA certificate") if ca else None,
        require_client_auth=ca is not None)
