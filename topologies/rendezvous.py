"""torchrun launchers on one machine that meet without a port chosen in advance.

`torchrun --master-port P` on every launcher makes the one of node rank 0 bind P when it
starts: a port picked free beforehand may be taken by then (another run on a busy
machine), and the other launchers then wait for a store that never comes, or join one
that is not theirs. Here the caller owns the rendezvous store, bound to a port the kernel
chose, and every launcher joins it as a client (the c10d rendezvous with
`is_host=false`); the workers' own store is then created by the launcher that becomes
rank 0 on a port the kernel chose too, and published through the rendezvous store.
Ranks are given in the order the launchers join, not by a `--node-rank`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta


@contextlib.contextmanager
def torchrun_rendezvous(nodes: int, *, run_id: str = "none",
                        timeout_s: float = 300.0) -> Iterator[list[str]]:
    """While inside, the torchrun arguments that make `nodes` launchers on this machine
    one job (pass them before the script); the store lives as long as the block, and is
    this job's alone. `run_id` is torchrun's own default ("none": hysync.torch names the
    job 'torchrun'), or a name of the caller's."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          multi_tenant=True, timeout=timedelta(seconds=timeout_s))
    try:
        yield ["--nnodes", str(nodes), "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"127.0.0.1:{store.port}",
               "--rdzv-id", run_id, "--rdzv-conf", "is_host=false"]
    finally:
        del store
