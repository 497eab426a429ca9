"""The raw-interface data plane: the softswitch on Linux interfaces (Mininet veths), as BMv2.

`-i 1@s1-eth1 -i 2@s1-eth2` maps switch ports to interfaces, exactly as
simple_switch's `-i` does. Each interface gets one AF_PACKET/SOCK_RAW socket bound
to it for every protocol (ETH_P_ALL); a poll over all of them wakes the loop, which
drains each ready socket in a batch, runs the batch through
`pipeline.process_frame` under one `pipeline.lock`, then sends every output frame
on its egress port's socket.

An ETH_P_ALL socket also sees a copy of every frame sent out of its interface by
anyone else (the kernel's own IPv6 neighbour discovery on a Mininet switch port,
another tap); the kernel does not loop a socket's own transmissions back to it.
Those copies carry `PACKET_OUTGOING` in the address recvfrom returns and are
skipped: they left through the port, they did not arrive on it. Frames are sent
as the pipeline built them: the kernel pads short frames on the wire.
"""

from __future__ import annotations

import errno
import logging
import select
import socket

from hysync.softswitch.delay import DelayLine
from hysync.softswitch.pipeline import Pipeline
from hysync.softswitch.serving import ServingThread

log = logging.getLogger(__name__)

ETH_P_ALL = 0x0003
BATCH = 256
MAX_FRAME = 65536  # offloads are off on the veths, but a jumbo frame must not be truncated
MAX_PORT = 511  # v1model ports are bit<9>
_BUFFER = 4 * 1024 * 1024


def parse_port(spec: str) -> tuple[int, str]:
    """'1@s1-eth1' -> (1, 's1-eth1'); ValueError with the expected syntax otherwise."""
    port_text, sep, iface = spec.partition("@")
    if not sep or not iface or not port_text.strip().isdigit():
        raise ValueError(f"bad port map {spec!r}: expected PORT@IFACE, e.g. 1@s1-eth1")
    port = int(port_text)
    if port > MAX_PORT:
        raise ValueError(f"bad port map {spec!r}: port {port} is above {MAX_PORT} "
                         "(v1model ports are 9 bits)")
    if len(iface) >= 16 or "/" in iface or any(c.isspace() for c in iface):
        raise ValueError(f"bad port map {spec!r}: {iface!r} is not a Linux interface name")
    return port, iface


def parse_port_map(specs: list[str]) -> dict[int, str]:
    """['1@s1-eth1', '2@s1-eth2'] -> {1: 's1-eth1', 2: 's1-eth2'}; duplicates are errors."""
    ports: dict[int, str] = {}
    for spec in specs:
        port, iface = parse_port(spec)
        if port in ports:
            raise ValueError(f"port {port} is mapped twice ({ports[port]} and {iface})")
        if iface in ports.values():
            raise ValueError(f"interface {iface} is mapped to two ports")
        ports[port] = iface
    return ports


class RawDataPlane(ServingThread):
    thread_name = "softswitch-raw"

    def __init__(self, pipeline: Pipeline, ports: dict[int, str],
                 delays_ms: dict[int, float] | None = None) -> None:
        super().__init__()
        if not ports:
            raise ValueError("the raw data plane needs at least one PORT@IFACE")
        self.pipeline = pipeline
        self.ports = dict(ports)
        self.sockets: dict[int, socket.socket] = {}
        try:
            for port, iface in self.ports.items():
                self.sockets[port] = _open(iface)
        except OSError:
            self._close()
            raise
        self._port_of = {sock.fileno(): port for port, sock in self.sockets.items()}
        self.delay = DelayLine(delays_ms or {})

    def close(self) -> None:
        self._close()

    def _close(self) -> None:
        for sock in self.sockets.values():
            sock.close()

    def serve(self) -> None:
        """Receive, process and send in batches until stop()."""
        poller = select.poll()
        for sock in self.sockets.values():
            poller.register(sock, select.POLLIN)
        pipeline = self.pipeline
        delay = self.delay
        while not self._stop.is_set():
            ready = poller.poll(delay.timeout_ms(100))
            for port, frame in delay.due():
                self._send(port, frame)
            if not ready:
                continue
            batch = []
            for fd, _ in ready:
                port = self._port_of[fd]
                batch.extend((port, frame) for frame in self._drain(self.sockets[port]))
            outputs = []
            with pipeline.lock:
                for port, frame in batch:
                    outputs.extend(pipeline.process_frame(port, frame))
            self.packets_in += len(batch)
            for port, frame in outputs:
                if delay.delayed(port):
                    delay.push(port, frame)
                else:
                    self._send(port, frame)

    @staticmethod
    def _drain(sock: socket.socket) -> list[bytes]:
        frames = []
        for _ in range(BATCH):
            try:
                frame, addr = sock.recvfrom(MAX_FRAME)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as err:  # e.g. ENETDOWN while the link is taken down
                log.debug("receive error: %s", err)
                break
            if addr[2] == socket.PACKET_OUTGOING:  # left through this port, did not arrive
                continue
            frames.append(frame)
        return frames

    def _send(self, port: int, frame: bytes) -> None:
        sock = self.sockets.get(port)
        if sock is None:
            log.warning("dropping a frame for port %d: no interface is mapped to it (-i %d@IFACE)",
                        port, port)
            return
        try:
            sock.send(frame)
        except BlockingIOError:
            # Send buffer full: wait for room rather than lose a result.
            select.select([], [sock], [], 1.0)
            try:
                sock.send(frame)
            except OSError as err:
                log.warning("cannot send on port %d (%s): %s", port, self.ports[port], err)
                return
        except OSError as err:
            log.warning("cannot send on port %d (%s): %s", port, self.ports[port], err)
            return
        self.packets_out += 1


def _open(iface: str) -> socket.socket:
    try:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    except PermissionError as err:
        raise PermissionError(f"cannot open a raw socket for {iface}: the raw data plane needs "
                              "root (CAP_NET_RAW); use --udp HOST:PORT otherwise") from err
    try:
        sock.bind((iface, ETH_P_ALL))
    except OSError as err:
        sock.close()
        if err.errno == errno.ENODEV:
            raise OSError(err.errno, f"interface {iface} does not exist (create it, e.g. with "
                          "Mininet, or fix the -i PORT@IFACE map)") from err
        raise OSError(err.errno, f"cannot bind a raw socket to {iface}: {err.strerror}") from err
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BUFFER)
    sock.setblocking(False)
    return sock
