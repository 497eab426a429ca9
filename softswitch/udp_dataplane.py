"""The UDP data plane: the softswitch on one UDP socket, members addressed by IP:port.

No root, no interfaces: the embedded default. A datagram from (ip, port) enters the
pipeline as if it came in on `INGRESS_PORT` from that address; every output is
sent to the (ip, port) that the pipeline's rewrite (or reply) addresses it to.
The socket is opened once and drained in batches: one lock acquisition and one
poll per batch, not per packet.
"""

from __future__ import annotations

import logging
import select
import socket

from hysync import wire
from hysync.softswitch.pipeline import Pipeline
from hysync.softswitch.serving import ServingThread

log = logging.getLogger(__name__)

INGRESS_PORT = 1
BATCH = 256
_RCVBUF = 16 * 1024 * 1024


_SO_SNDBUFFORCE, _SO_RCVBUFFORCE = 32, 33  # Linux; not exported by the socket module


def _big_buffers(sock: socket.socket, size: int) -> None:
    """Socket buffers of `size`: past net.core.[rw]mem_max when root may (the *FORCE
    options), else as large as the system allows. A burst from many workers' windows
    must fit, or it is lost and waits for the workers' retransmission timeouts."""
    for force, plain in ((_SO_RCVBUFFORCE, socket.SO_RCVBUF), (_SO_SNDBUFFORCE, socket.SO_SNDBUF)):
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, size)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, plain, size)


class UdpDataPlane(ServingThread):
    thread_name = "softswitch-udp"

    def __init__(self, pipeline: Pipeline, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__()
        self.pipeline = pipeline
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        _big_buffers(self.sock, _RCVBUF)
        try:
            self.sock.bind((host, port))
        except OSError as err:
            self.sock.close()
            raise OSError(f"cannot bind the softswitch UDP data plane to {host}:{port}: {err}. "
                          "Pick a free port with --udp HOST:PORT.") from err
        self.sock.setblocking(False)
        self.address: tuple[str, int] = self.sock.getsockname()

    def close(self) -> None:
        self.sock.close()

    def serve(self) -> None:
        """Receive, process and send in batches until stop()."""
        sock, pipeline = self.sock, self.pipeline
        recv, send = sock.recvfrom, sock.sendto
        ip_of: dict[str, int] = {}
        addr_of: dict[tuple[int, int], tuple[str, int]] = {}
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            batch = []
            for _ in range(BATCH):
                try:
                    batch.append(recv(2048))
                except BlockingIOError:
                    break
            outputs = []
            with pipeline.lock:
                for payload, (host, port) in batch:
                    src_ip = ip_of.get(host)
                    if src_ip is None:
                        src_ip = ip_of[host] = wire.ip_to_int(host)
                    outputs.extend(pipeline.process_datagram(src_ip, port, payload))
            self.packets_in += len(batch)
            for dst_ip, dst_port, out in outputs:
                dst = addr_of.get((dst_ip, dst_port))
                if dst is None:
                    dst = addr_of[(dst_ip, dst_port)] = (wire.int_to_ip(dst_ip), dst_port)
                try:
                    send(out, dst)
                except BlockingIOError:
                    # Send buffer full: wait for room rather than lose a result.
                    select.select([], [sock], [], 1.0)
                    send(out, dst)
                except OSError as err:
                    log.warning("cannot send to %s:%d: %s", dst[0], dst[1], err)
            self.packets_out += len(outputs)
