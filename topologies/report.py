"""Summaries and plots of training runs (the JSON logs of topologies.workload.RunLog).

Conventions, so that numbers mean the same thing in every table:
* time to target: the first wall-clock time at which the reference replica (the lowest
  worker id that is not a straggler in the scenario) reaches the target accuracy on the
  held-out set; None if it never does;
* final accuracy: the mean over the replicas that finished the run;
* throughput: the reference replica's iterations per second over the whole run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MODE_LEVEL = {"sync": 0, "partial": 1, "async": 2}


@dataclass
class ConfigSummary:
    config: str
    time_to_target_s: float | None
    final_accuracy: float
    throughput: float
    steps: int
    duration_s: float


def _is_hysync(logs: list[dict]) -> bool:
    return any(s["mode"] in MODE_LEVEL for log in logs for s in log["steps"])


def reference(logs: list[dict], stragglers: set[int]) -> dict:
    return next((log for log in logs if log["worker"] not in stragglers), logs[0])


def summarize(config: str, logs: list[dict], target: float,
              stragglers: set[int] = frozenset()) -> ConfigSummary:
    ref = reference(logs, stragglers)
    steps = ref["steps"]
    reached = next((s["t"] for s in steps
                    if s["accuracy"] is not None and s["accuracy"] >= target), None)
    finished = [log["final_accuracy"] for log in logs
                if log["ended"] == "completed" and log["final_accuracy"] is not None]
    duration = steps[-1]["t"] if steps else 0.0
    return ConfigSummary(config, reached, sum(finished) / max(len(finished), 1),
                         len(steps) / duration if duration else 0.0, len(steps), duration)


def phase_rates(log: dict, boundaries: list[int]) -> list[tuple[str, int, int, float, str]]:
    """(label, first step, last step, iterations/s, mode) for each phase between swaps."""
    steps = log["steps"]
    edges = [0, *[b for b in boundaries if 0 < b < len(steps)], len(steps)]
    phases = []
    for a, b in zip(edges, edges[1:], strict=False):
        if b - a < 2:
            continue
        t0 = steps[a - 1]["t"] if a > 0 else 0.0
        rate = (b - a) / (steps[b - 1]["t"] - t0)
        modes = [s["mode"] for s in steps[a:b] if s["mode"]]
        mode = max(set(modes), key=modes.count) if modes else "-"
        phases.append((f"steps {a}-{b - 1}", a, b - 1, rate, mode))
    return phases


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    line = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths, strict=False))
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def plot_runs(runs: dict[str, list[dict]], out: Path, title: str, target: float | None,
              stragglers: set[int] = frozenset(),
              membership: dict[str, list[dict]] | None = None) -> Path:
    """One PNG: accuracy vs wall-clock per config, iteration time per worker, mode timeline
    (with `membership`: {config: [{"action": "exclude"|"readmit", "worker", "at_step"}]},
    the controller's membership changes on it, placed at the reference replica's step)."""
    fig, (ax_acc, ax_iter, ax_mode) = plt.subplots(3, 1, figsize=(9, 11))
    for config, logs in runs.items():
        ref = reference(logs, stragglers)
        points = [(s["t"], s["accuracy"]) for s in ref["steps"] if s["accuracy"] is not None]
        if points:
            ax_acc.plot(*zip(*points, strict=False), marker=".", label=config)
    if target:
        ax_acc.axhline(target, color="grey", linestyle="--", linewidth=0.8,
                       label=f"target {target:.0%}")
    ax_acc.set(xlabel="wall-clock time (s)", ylabel="held-out accuracy",
               title=f"{title}: accuracy of the reference replica")
    ax_acc.legend(fontsize=8)

    main = next((c for c, logs in runs.items() if _is_hysync(logs)), next(iter(runs)))
    slowest = 0.0
    for log in runs[main]:
        steps = log["steps"]
        ax_iter.plot([s["t"] for s in steps], [s["step_s"] * 1000 for s in steps],
                     linewidth=0.8, label=f"worker {log['worker']}"
                     + (" (straggler)" if log["worker"] in stragglers else ""))
        times = sorted(s["step_s"] for s in steps[1:])  # step 0 includes start-up
        if times:
            slowest = max(slowest, times[int(0.99 * (len(times) - 1))] * 1000)
    if slowest:
        ax_iter.set_ylim(0, slowest * 1.5)
    ax_iter.set(xlabel="wall-clock time (s)", ylabel="iteration time (ms)",
                title=f"iteration time per worker ({main})")
    ax_iter.legend(fontsize=8)

    for offset, (config, logs) in enumerate(runs.items()):
        steps = [s for s in reference(logs, stragglers)["steps"] if s["mode"] in MODE_LEVEL]
        if steps:
            ax_mode.step([s["t"] for s in steps],
                         [MODE_LEVEL.get(s["mode"], 0) + offset * 0.05 for s in steps],
                         where="post", label=config)
    for config, events in (membership or {}).items():
        steps = reference(runs[config], stragglers)["steps"] if config in runs else []
        for e in events:
            if e["action"] not in ("exclude", "readmit") or not steps:
                continue
            t = steps[min(e["at_step"], len(steps) - 1)]["t"]
            color = "tab:red" if e["action"] == "exclude" else "tab:green"
            ax_mode.axvline(t, color=color, linestyle=":", linewidth=1)
            ax_mode.annotate(f"{e['action']} w{e['worker']}", (t, 2.1), rotation=90,
                             fontsize=7, color=color, va="top")
    ax_mode.set(xlabel="wall-clock time (s)",
                title="mode in force, HySync configs (from result headers); membership changes",
                yticks=list(MODE_LEVEL.values()), yticklabels=list(MODE_LEVEL))
    ax_mode.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
