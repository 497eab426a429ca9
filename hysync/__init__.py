"""HySync: in-network gradient aggregation with hot-swappable sync modes.

The parts: `hysync.controlplane` (the `hysync` command, P4Runtime), `hysync.softswitch`
(a P4Runtime switch in software), `hysync.worker` (the transport and the DDP hook),
`hysync.torch` (`attach`, for training scripts) and `hysync.topologies` (emulation).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("hysync")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
