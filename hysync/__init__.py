"""HySync: in-network gradient aggregation with hot-swappable sync modes.

The parts: `hysync.controlplane` (the `hysync` command, P4Runtime), `hysync.softswitch`
(a P4Runtime switch in software), `hysync.worker` (the transport and the DDP hook),
`hysync.torch` (`attach`, for training scripts), `hysync.backend` (the `hysync`
torch.distributed backend) and `hysync.topologies` (emulation).
"""

import os
from importlib.metadata import PackageNotFoundError, version

# HySync processes start child processes (switches, workers) while their P4Runtime channels
# are open. grpcio's fork handlers then restart its poller in the forked child, whose fds
# subprocess closes before exec: the child (or, with the handlers racing, the parent) aborts
# with "epoll_wait error: Bad file descriptor" (grpc/grpc#43055). No HySync process uses gRPC
# in a forked child without exec, so the handlers are off unless the user says otherwise.
# grpcio reads this when it is first imported, which every HySync module does after this.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
# gRPC's C core logs each failed TLS handshake (and each retry of it) on stderr, lines a user
# cannot act on, ahead of HySync's one-line error that says what to check. Its own logs come
# back with GRPC_VERBOSITY=ERROR (or INFO, DEBUG) set by the user.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

try:
    __version__ = version("hysync")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
