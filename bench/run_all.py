"""`make bench`: every benchmark, one after the other; each writes bench/results/*.json."""

from __future__ import annotations

import importlib

BENCHES = ("softswitch_bench", "hotswap_bench", "write_bench", "worker_bench", "straggler_bench",
           "adaptive_bench", "bmv2_bench", "host_reduce_bench", "two_level_bench")


def main() -> None:
    for name in BENCHES:
        try:
            module = importlib.import_module(f"bench.{name}")
        except ModuleNotFoundError as err:
            print(f"bench {name}: not available ({err})")
            continue
        print(f"== {name}", flush=True)
        module.main([])


if __name__ == "__main__":
    main()
