"""Summaries and plots of training runs (the JSON logs of hysync.topologies.workload.RunLog).

Conventions, so that numbers mean the same thing in every table:
* time to target: the first wall-clock time at which the reference replica (the lowest
  worker id that is not a straggler in the scenario) reaches the target accuracy on the
  held-out set; None if it never does;
* final accuracy: the mean over the replicas that finished the run;
* throughput: the reference replica's local steps (iterations) per second over the run;
* job clock: the updates the job applied, in sync rounds of every member (what ends the
  run); in partial or async mode a replica runs more local steps than that;
* time per step: the reference replica's mean over its steps after the first (start-up),
  split into compute, waiting for the switch and communication (topologies/step_split.py;
  gloo cannot tell waiting from communication: all of it is communication there).
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass
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
    job_clock: float = 0.0
    compute_ms: float = 0.0
    wait_ms: float | None = None  # None: the backend cannot tell (gloo)
    comm_ms: float = 0.0


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
    timed = steps[1:] or steps  # the first step includes start-up
    mean_ms = lambda key: 1000 * statistics.fmean(s.get(key, 0.0) for s in timed) if timed else 0.0
    step_ms, wait_ms, comm_ms = mean_ms("step_s"), mean_ms("wait_s"), mean_ms("comm_s")
    return ConfigSummary(config, reached, sum(finished) / max(len(finished), 1),
                         len(steps) / duration if duration else 0.0, len(steps), duration,
                         steps[-1]["progress"] if steps else 0.0,
                         max(0.0, step_ms - wait_ms - comm_ms),
                         wait_ms if _is_hysync(logs) else None, comm_ms)


def outcome(summaries: list[ConfigSummary], target: float) -> str:
    """One sentence: the last configuration's time to the target against the others'."""
    *others, main = summaries
    aim = f"{target:.0%} held-out accuracy"
    if main.time_to_target_s is None:
        reached = [f"{o.config} in {o.time_to_target_s:.1f} s" for o in others
                   if o.time_to_target_s is not None]
        return (f"{main.config} did not reach {aim}"
                + (f" ({', '.join(reached)} did)." if reached else ", nor did any other."))
    versus = []
    for o in others:
        if o.time_to_target_s is None:
            versus.append(f"{o.config} did not reach it")
            continue
        ratio = o.time_to_target_s / main.time_to_target_s
        versus.append((f"{ratio:.1f}x faster" if ratio >= 1 else f"{1 / ratio:.1f}x slower")
                      + f" than {o.config} ({o.time_to_target_s:.1f} s)")
    reached = f"{main.config} reached {aim} in {main.time_to_target_s:.1f} s"
    return reached + (": " + ", ".join(versus) if versus else "") + "."


def time_split_rows(summaries: list[ConfigSummary]) -> list[list[str]]:
    """Per configuration: ms per step in compute, waiting, communication; the largest."""
    rows = []
    for s in summaries:
        parts = {"compute": s.compute_ms, "waiting for the switch": s.wait_ms or 0.0,
                 "communication": s.comm_ms}
        rows.append([s.config, f"{s.compute_ms:.1f}",
                     "-" if s.wait_ms is None else f"{s.wait_ms:.1f}", f"{s.comm_ms:.1f}",
                     max(parts, key=parts.get)])
    return rows


def level_rows(events: dict[str, list[dict]]) -> list[list[str]]:
    """Across switches, per configuration and level named by its swaps ("every level" for
    a swap of them all): the mode changes made there, at which step of worker 0 it first
    went partial, and the last mode set. No rows for a run on one switch."""
    rows = []
    for config, made in events.items():
        swaps = [e for e in made if e["action"] == "set_mode"]
        if not any(e.get("level") for e in swaps):
            continue
        for level in dict.fromkeys(e["level"] for e in swaps):
            here = [e for e in swaps if e["level"] == level]
            partial = next((e["at_step"] for e in here if e["mode"] == "partial"), None)
            last = here[-1]
            rows.append([config, level or "every level", str(len(here)),
                         "never" if partial is None else f"step {partial}",
                         last["mode"] + (f"({last['quorum']})" if last["mode"] == "partial"
                                         else "")])
    return rows


def write_summary(runs: dict[str, list[dict]], swaps: dict[str, list], *, scenario,
                  out: Path, title: str, elapsed_s: float, extra: dict | None = None) -> str:
    """The summary of a comparison (the same for the demo and Mininet runs): writes
    out/summary.json and out/plot.png, returns the text to print - the outcome in one
    sentence, the tables, the plot and where the logs are."""
    stragglers = {s.worker for s in scenario.stragglers}
    summaries = [summarize(name, logs, scenario.target_accuracy, stragglers)
                 for name, logs in runs.items()]
    events = {k: [asdict(x) for x in v] for k, v in swaps.items()}
    rows, phase_rows = [], []
    for s in summaries:
        ttt = f"{s.time_to_target_s:.1f} s" if s.time_to_target_s is not None else "not reached"
        rows.append([s.config, ttt, f"{s.final_accuracy:.3f}",
                     f"{s.steps} / {int(s.job_clock)}", f"{s.throughput:.1f}"])
        ref = reference(runs[s.config], stragglers)
        boundaries = [e["at_step"] for e in events[s.config] if e["action"] == "set_mode"]
        for label, _, _, rate, mode in phase_rates(ref, boundaries):
            phase_rows.append([s.config, label, mode, f"{rate:.1f}"])
    plot = plot_runs(runs, out / "plot.png", title, scenario.target_accuracy, stragglers,
                     events)
    sentence = outcome(summaries, scenario.target_accuracy)
    per_level = level_rows(events)
    levels = ["", "mode changes per level (across switches):",
              table(per_level, ["config", "level", "mode changes", "first partial",
                                "last mode set"])] if per_level else []
    (out / "summary.json").write_text(json.dumps(
        {"scenario": scenario.name, **(extra or {}), "outcome": sentence,
         "configs": [asdict(s) for s in summaries], "swaps": events}, indent=2) + "\n")
    return "\n".join([
        "", sentence, "",
        f"{title}: {elapsed_s:.0f} s in all on {os.cpu_count()} cores (load average "
        f"{os.getloadavg()[0]:.1f} at the end); the reference replica is worker "
        f"{reference(next(iter(runs.values())), stragglers)['worker']}", "",
        table(rows, ["config", f"time to {scenario.target_accuracy:.0%}", "final accuracy",
                     "local steps / job clock", "local steps/s"]), "",
        "time per step (ms, mean of the reference replica):",
        table(time_split_rows(summaries), ["config", "compute", "waiting for the switch",
                                           "communication", "dominates"]), "",
        table(phase_rows, ["config", "phase", "mode", "local steps/s"]), *levels, "",
        f"plot: {plot}",
        f"logs: {out}/<config>/worker-<w>.json (policy decisions: policy.jsonl), "
        f"summary: {out}/summary.json",
    ])


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
