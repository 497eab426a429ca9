"""The local harness's member ports: held from the moment they are picked, so no other process
can bind one before its worker starts, and handed to the worker as an inherited socket."""

from __future__ import annotations

import errno
import os
import socket

import pytest

from hysync.topologies.runner import LocalHarness


@pytest.fixture
def harness(tmp_path):
    h = LocalHarness(tmp_path)
    yield h
    h.close()


def test_member_ports_are_distinct_and_no_one_else_can_bind_them(harness):
    members = harness.members(4) + harness.members(4, averaging=True)
    ports = [m.udp_port for m in members]
    assert len(set(ports)) == 8
    assert harness.members(4) == members[:4]  # the same ports for every configuration
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other:
            with pytest.raises(OSError) as info:
                other.bind(("127.0.0.1", port))
            assert info.value.errno == errno.EADDRINUSE


def test_a_worker_inherits_its_bound_socket_drained_of_earlier_datagrams(harness):
    member = harness.members(1)[0]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        sender.sendto(b"left over from the previous configuration", ("127.0.0.1",
                                                                      member.udp_port))
    argv = harness.bind_argv("--bind", member)
    assert argv[:3] == ["--bind", f"127.0.0.1:{member.udp_port}", "--bind-fd"]
    fd = int(argv[3])
    child = ("import socket, sys\n"
             "s = socket.socket(fileno=int(sys.argv[1])); s.setblocking(False)\n"
             "try:\n    s.recv(100); print('stale')\n"
             "except BlockingIOError:\n    print(s.getsockname()[1])\n")
    proc = harness.start_worker(0, ["-c", child, str(fd)])
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert out.strip() == str(member.udp_port)
    os.fstat(fd)  # the harness still holds it for the next configuration


def test_the_switch_and_the_rendezvous_ports_are_bound_before_anyone_is_told_them(harness):
    # The softswitch bound port 0 for both and printed what it got: those are the ports the
    # harness hands out, already taken by the switch.
    host, port = harness.grpc_addr.rsplit(":", 1)
    for kind, taken in ((socket.SOCK_STREAM, int(port)), (socket.SOCK_DGRAM, harness.data_port)):
        with socket.socket(socket.AF_INET, kind) as other:
            with pytest.raises(OSError) as info:
                other.bind((host, taken))
            assert info.value.errno == errno.EADDRINUSE
    assert harness.switch_data_addr() == f"127.0.0.1:{harness.data_port}"
    # The rendezvous listens from the moment it is named; worker 0 inherits that socket.
    address = harness.rendezvous()
    rhost, rport = address.rsplit(":", 1)
    socket.create_connection((rhost, int(rport)), timeout=30).close()
    child = ("import socket, sys\n"
             "fd = int(sys.argv[sys.argv.index('--rendezvous-fd') + 1])\n"
             "print(socket.socket(fileno=fd).getsockname()[1])\n")
    proc = harness.start_worker(0, ["-c", child])
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out.strip() == rport
    other = harness.start_worker(1, ["-c", "import sys; print('--rendezvous-fd' in sys.argv)"])
    assert other.communicate(timeout=60)[0].strip() == "False"  # the others connect to it
