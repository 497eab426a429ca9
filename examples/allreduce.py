"""`dist.all_reduce` through a HySync switch: the `hysync` process-group backend.

    HYSYNC_INVENTORY=examples/loopback.toml \\
        torchrun --standalone --nproc-per-node 2 examples/allreduce.py

Every rank all-reduces a tensor of its own (SUM and AVG, float32, float16, bfloat16 and
float64, synchronous and with async_op) and checks each result against the exact sum,
computed here from every rank's seed, within the quantization bound; a broadcast and
an all_gather go through gloo in the same group. Prints one JSON line per rank:
`"ok"` and the largest error seen.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist

import hysync.backend  # noqa: F401 - registers the "hysync" backend

SIZE = 10_000


def contribution(rank: int, dtype: torch.dtype, call: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * call + rank)
    return torch.randn(SIZE, generator=generator).to(dtype)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="hysync", help="hysync (default), or gloo to compare")
    args = p.parse_args()
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    worst = 0.0
    call = 0
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            for async_op in (False, True):
                call += 1
                tensor = contribution(rank, dtype, call)
                work = dist.all_reduce(tensor, op=op, async_op=async_op)
                if async_op:
                    assert work is not None
                    (result,) = work.get_future().wait()
                    assert result is tensor  # the future holds the caller's tensor
                expected = sum(contribution(r, dtype, call).double() for r in range(world))
                if op == dist.ReduceOp.AVG:
                    expected /= world
                error = float((tensor.double() - expected).abs().max())
                # the switch's quantization (2**-21 per member at the default scale) and
                # the dtype's own rounding of the result
                bound = world * 2.0**-20 + float(expected.abs().max()) * torch.finfo(dtype).eps
                assert error <= bound, (dtype, op, async_op, error, bound)
                worst = max(worst, error)
    # a strided view (a transposed matrix) is reduced as a copy and written back into it
    call += 1
    view = contribution(rank, torch.float32, call).reshape(100, 100).t()
    dist.all_reduce(view)
    expected = sum(contribution(r, torch.float32, call).double() for r in range(world))
    error = float((view.double() - expected.reshape(100, 100).t()).abs().max())
    assert error <= world * 2.0**-20 + 8 * torch.finfo(torch.float32).eps, error
    empty = torch.zeros(0)
    dist.all_reduce(empty)  # nothing to send, nothing to wait for
    # the other collectives: gloo, in the same process group
    value = torch.tensor([float(rank + 1)])
    dist.broadcast(value, src=0)
    gathered = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(gathered, torch.tensor([float(rank)]))
    assert value.item() == 1.0 and [g.item() for g in gathered] == list(range(world))
    dist.barrier()
    print(json.dumps({"rank": rank, "backend": args.backend, "ok": True,
                      "group": dist.get_backend(), "max_error": worst}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
