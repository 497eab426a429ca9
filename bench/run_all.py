"""`make bench`: every benchmark, one after the other; each writes bench/results/*.json."""

from __future__ import annotations

from bench import softswitch_bench


def main() -> None:
    softswitch_bench.main([])


if __name__ == "__main__":
    main()
