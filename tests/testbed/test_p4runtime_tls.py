"""P4Runtime over mutual TLS: the softswitch process serves it with certificates made here;
the controller, the CLI and deploy drive it; a client without a certificate, or with one
another CA signed, or in the clear, is refused."""

from __future__ import annotations

import io
import re
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hysync.controlplane.cli.main import main
from hysync.controlplane.controller import Controller
from hysync.controlplane.errors import NotPrimaryError, P4RuntimeUnreachableError
from hysync.controlplane.job import JobConfig
from hysync.controlplane.p4rt.switch import Switch
from hysync.tls import ClientTls

from ..certs import Certs, make_certs
from .conftest import ANY_PORT, ROOT, loopback_inventory, write_inventory

P4INFO = ROOT / "p4src" / "v1model" / "hysync.p4info.txtpb"
JOB = ROOT / "controlplane" / "examples" / "job-loopback.toml"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def tls_switch(certs: Certs) -> Iterator[str]:
    """A softswitch process serving P4Runtime over mutual TLS; its gRPC address."""
    yield from _tls_switch(certs)


def _tls_switch(certs: Certs, *options: str) -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "hysync.softswitch", "--grpc-addr", "127.0.0.1:0", "--udp",
         "127.0.0.1:0", "--engine", "python", "--log-level", "warning",
         "--server-cert-file", str(certs.server_cert), "--server-key-file",
         str(certs.server_key), "--ca-cert-file", str(certs.ca), *options],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        # The line comes once the switch listens: a generous wait, for a busy machine.
        ready, _, _ = select.select([proc.stdout], [], [], 300)
        line = proc.stdout.readline() if ready else ""
        match = re.search(r"P4Runtime on 127\.0\.0\.1:(\d+) \(mutual TLS", line)
        assert match, line + (proc.stderr.read() if proc.poll() is not None else "")
        yield f"127.0.0.1:{match[1]}"
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def hysync(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return main(list(args), stdout=out, stderr=err), out.getvalue(), err.getvalue()


def test_a_controller_with_a_certificate_the_ca_signed_is_served(certs: Certs,
                                                                  tls_switch: str) -> None:
    tls = ClientTls(certs.ca, certs.client_cert, certs.client_key)
    with Switch(tls_switch, tls=tls) as sw:
        sw.push_pipeline(P4INFO)
        assert sw.is_primary
        assert Controller(sw).list_jobs() == []


@pytest.mark.parametrize("who", ["no certificate", "another CA's certificate", "in the clear"])
def test_other_clients_are_refused(certs: Certs, tls_switch: str, who: str) -> None:
    tls = {"no certificate": ClientTls(certs.ca),
           "another CA's certificate": ClientTls(certs.ca, certs.stranger_cert,
                                                 certs.stranger_key),
           "in the clear": None}[who]
    with pytest.raises(P4RuntimeUnreachableError, match="no answer within"):
        Switch(tls_switch, tls=tls, arbitrate=False, connect_timeout=2.0)


def test_with_writer_only_the_owners_certificate_arbitrates_and_writes(certs: Certs) -> None:
    """The bypass: a client the CA signed, but not the switch's owner, takes the primary
    role with a higher election id or writes with the owner's: refused; it may read."""
    owner_tls = ClientTls(certs.ca, certs.client_cert, certs.client_key)  # CN controller
    intruder_tls = ClientTls(certs.ca, certs.intruder_cert, certs.intruder_key)
    switch = _tls_switch(certs, "--writer", "controller")
    addr = next(switch)
    try:
        with Switch(addr, tls=owner_tls, election_id=(0, 10)) as owner:
            owner.push_pipeline(P4INFO)
            Controller(owner).attach().add_job(JobConfig.load(JOB))
            for election in ((0, 20), (0, 10)):  # higher than the owner's, or the owner's own
                with pytest.raises(NotPrimaryError, match="may not arbitrate or write: this "
                                   "switch takes writes only from the certificates its "
                                   "--writer names .controller."):
                    Switch(addr, tls=intruder_tls, election_id=election)
            with Switch(addr, tls=intruder_tls, election_id=(0, 10), arbitrate=False) as spy:
                with pytest.raises(NotPrimaryError, match="may not arbitrate or write"):
                    spy.push_pipeline(P4INFO)  # carrying the owner's election id
                assert [j.job_id for j in Controller(spy).list_jobs()] == [1]  # reads are open
            assert owner.is_primary
            assert [j.job_id for j in Controller(owner).list_jobs()] == [1]
    finally:
        switch.close()


def test_writer_needs_mutual_tls(certs: Certs) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hysync.softswitch", "--grpc-addr", "127.0.0.1:0", "--udp",
         "127.0.0.1:0", "--writer", "controller"], cwd=ROOT, capture_output=True, text=True,
        timeout=60)
    assert done.returncode != 0 and done.stderr.count("\n") == 1
    assert "--writer names client certificates: give --ca-cert-file too" in done.stderr


def test_a_failed_handshake_is_one_line_without_grpcs_own_logs(certs: Certs,
                                                               tls_switch: str) -> None:
    # A CA that did not sign the switch's certificate: gRPC's C core logs every failed
    # handshake (and each retry) on stderr unless HySync keeps it quiet.
    stranger_ca = sorted(certs.stranger_cert.parent.glob("other-ca*.pem"))[0]
    done = subprocess.run(
        [sys.executable, "-m", "hysync.controlplane.cli", "--grpc-addr", tls_switch,
         "--timeout", "2", "--cacert", str(stranger_ca), "--cert", str(certs.client_cert),
         "--private-key", str(certs.client_key), "job", "list"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"hysync: error: cannot reach the switch at {tls_switch}")
    assert "over TLS: does the switch serve TLS with a certificate --cacert signed" in done.stderr


def test_the_cli_and_deploy_drive_the_switch_over_tls(certs: Certs, tls_switch: str,
                                                      tmp_path: Path) -> None:
    tls = ["--cacert", str(certs.ca), "--cert", str(certs.client_cert), "--private-key",
           str(certs.client_key)]
    code, out, err = hysync("--grpc-addr", tls_switch, *tls, "pipeline", "push", "--p4info",
                            str(P4INFO))
    assert (code, err) == (0, ""), err
    code, out, err = hysync("--grpc-addr", tls_switch, *tls, "job", "add", str(JOB))
    assert (code, err) == (0, "") and out.startswith("job 1 installed")
    code, out, _ = hysync("--grpc-addr", tls_switch, *tls, "job", "list")
    assert code == 0 and out.startswith("job 1: slots")
    code, _, err = hysync("--grpc-addr", tls_switch, "--timeout", "2", "job", "list")
    assert code == 1 and "give --cacert, --cert and --private-key" in err
    code, _, err = hysync("--grpc-addr", tls_switch, "--cacert", str(certs.ca), "--cert",
                          str(certs.client_cert), "job", "list")
    assert code == 2 and "give both --cert and --private-key" in err

    # The inventory names the same files: deploy (and serve) use them.
    data = loopback_inventory(tls_switch, listen=ANY_PORT)
    data["switch"].update(cacert=str(certs.ca), cert=str(certs.client_cert),
                          private_key=str(certs.client_key))
    inventory = write_inventory(tmp_path / "tls.toml", data)
    code, out, err = hysync("deploy", str(inventory))
    assert (code, err) == (0, ""), err
    assert "deployed loopback" in out
