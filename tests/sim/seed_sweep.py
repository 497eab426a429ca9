"""Run one simulation over a range of seeds and write what they found to a results file.

The two-level simulations (two_level_pipeline, two_level_engines) sweep seeds the same way:
each seed gives the invariants it broke and the counts it kept; the sweep adds the counts up,
keeps the failing seeds with the command that replays each, and writes the summary as it goes,
so that a sweep stopped from outside keeps what it ran.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path

SeedRun = Callable[[int], tuple[list[str], Mapping[str, float]]]
SeedKind = Callable[[Mapping[str, float]], str]


def sweep_seeds(run: SeedRun, *, label: str, start: int, seeds: int, out: Path,
                about: dict[str, str], replay: str, every: int,
                kind: SeedKind | None = None) -> int:
    """Seeds start..start+seeds through `run`, results to `out` (every `every` seeds, and at
    the end); the number of failing seeds.

    `label` names the sweep in its progress lines; `about` heads the results (what ran);
    `replay` is the command that replays a seed, with `{seed}` in it; `kind`, where given,
    sorts a failing seed by its counts."""
    t0, cpu0 = time.time(), time.process_time()
    totals, failures, kinds, violations = Counter(), [], Counter(), Counter()
    done = 0

    def report() -> dict:
        return {**about, "seeds": done, "first_seed": start, "complete": done == seeds,
                **{k: round(v, 3) if isinstance(v, float) else v for k, v in totals.items()},
                "violations": sum(violations.values()),
                "violations_by_invariant": dict(violations),
                "failing_seeds": len(failures),
                **({"failing_by_kind": dict(kinds)} if kind is not None else {}),
                "failures": failures[:20],
                "cpu_seconds": round(time.process_time() - cpu0, 1),
                "wall_seconds": round(time.time() - t0, 1)}

    out.parent.mkdir(parents=True, exist_ok=True)
    for seed in range(start, start + seeds):
        problems, stats = run(seed)
        totals.update(stats)
        done += 1
        violations.update(p.split(":", 1)[0] for p in problems)
        if problems:
            if kind is not None:
                kinds[kind(stats)] += 1
            failures.append({"seed": seed, "violations": problems[:5],
                             "replay": replay.format(seed=seed)})
        if done % every == 0:  # partial results survive an interrupted sweep
            print(f"{label}: {done}/{seeds} seeds, {len(failures)} failing", file=sys.stderr,
                  flush=True)
            out.write_text(json.dumps(report(), indent=1) + "\n")
    out.write_text(json.dumps(report(), indent=1) + "\n")
    print(json.dumps({k: v for k, v in report().items() if k != "failures"}))
    for f in failures[:5]:
        print(f["replay"], "->", f["violations"][0])
    return len(failures)
