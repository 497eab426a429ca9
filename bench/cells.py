"""A bench's runs as the cells of its table: one cell per (scenario, config) that ran,
each time by its spread over the repeats, a config's speedup over a baseline's median
time to target in the same scenario, and the bars of the times in its plot."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Iterator, Sequence
from typing import Any


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


def time_bars(ax: Any, rows: list[dict], scenarios: Sequence[str], config: str, place: int,
              width: float) -> None:
    """On matplotlib axes `ax`, the bars of `config`'s median time to target in each
    scenario (x = the scenario's index), min to max as error bars; `place`: the config's
    index among three drawn side by side (0 left of the scenario's tick, 2 right)."""
    xs, ys, lo, hi = [], [], [], []
    for j, scenario in enumerate(scenarios):
        row = next((r for r in rows if (r["scenario"], r["config"]) == (scenario, config)),
                   None)
        t = row and row["time_to_target_s"]
        if t:
            xs.append(j + (place - 1) * width)
            ys.append(t["median"])
            lo.append(t["median"] - t["min"])
            hi.append(t["max"] - t["median"])
    ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=config)
