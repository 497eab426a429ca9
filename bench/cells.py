"""A bench's runs as the cells of its table: one cell per (scenario, config) that ran,
each time by its spread over the repeats, and a config's speedup over a baseline's
median time to target in the same scenario."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Iterator, Sequence


def spread(values: list[float], digits: int = 2) -> dict | None:
    """Median, min, max and count of `values`, rounded to `digits`; None for none."""
    if not values:
        return None
    return {"median": round(statistics.median(values), digits),
            "min": round(min(values), digits), "max": round(max(values), digits),
            "n": len(values)}


def cell_runs(runs: list[dict], scenarios: Iterable[str],
              configs: Sequence[str]) -> Iterator[tuple[str, str, list[dict]]]:
    """(scenario, config, its runs) of each cell with runs, scenario by scenario in the
    order given."""
    for scenario in scenarios:
        for config in configs:
            mine = [r for r in runs if (r["scenario"], r["config"]) == (scenario, config)]
            if mine:
                yield scenario, config, mine


def add_speedups(rows: list[dict], bases: Sequence[str]) -> None:
    """`speedup_over_BASE` in each row of a scenario where BASE and the row both reached
    the target: BASE's median time to target over the row's."""
    for scenario in dict.fromkeys(r["scenario"] for r in rows):
        by = {r["config"]: r for r in rows if r["scenario"] == scenario}
        for base in bases:
            ref = by.get(base, {}).get("time_to_target_s")
            for row in by.values():
                mine = row["time_to_target_s"]
                if ref and mine and row["config"] != base:
                    row[f"speedup_over_{base}"] = round(ref["median"] / mine["median"], 2)
