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
