"""`python -m softswitch.reflect` as a user runs it: every datagram comes back as sent."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys

PROG = [sys.executable, "-m", "softswitch.reflect"]


def test_every_datagram_comes_back_unchanged_to_its_sender() -> None:
    proc = subprocess.Popen([*PROG, "--udp", "127.0.0.1:0", "--threads", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        found = re.match(r"reflector: UDP 127\.0\.0\.1:(\d+), 2 threads", line)
        assert found, line
        port = int(found.group(1))
        senders = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(3)]
        sent = 0
        for i, sock in enumerate(senders):
            sock.settimeout(5)
            for size in (1, 280, 1400):
                payload = bytes([i]) * size
                sock.sendto(payload, ("127.0.0.1", port))
                assert sock.recvfrom(2048) == (payload, ("127.0.0.1", port))
                sent += 1
            sock.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert out.strip() == f"reflector: answered {sent} of {sent} datagrams"


def test_a_bad_address_is_one_line_and_exit_2() -> None:
    done = subprocess.run([*PROG, "--udp", "nohost.invalid:1"], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith("reflector: error: cannot bind UDP nohost.invalid:1")
