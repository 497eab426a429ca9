"""Straggler scenarios as data: one TOML file per scenario, validated on load.

    name = "constant-straggler"
    workers = 4                 # members of the job
    steps = 300                 # training iterations per worker
    compute_ms = 20.0           # emulated compute time of one step on a healthy worker
    lr = 0.1                    # SGD learning rate (momentum 0.9)
    model = "mlp"               # mlp | cnn (topologies/workload.py)
    target_accuracy = 0.90      # for time-to-target: best on the rising part of the curve
    racks = 1                   # 1: every worker behind one switch; 2..8: as many racks of
                                # workers / racks each, a leaf switch per rack and a spine
                                # (worker w sits in rack w // (workers / racks))

    [[straggler]]               # any number
    worker = 3
    pattern = "constant"        # constant | intermittent | recovering | dies
    factor = 3.0                # compute slowdown while slow (>= 1)
    period_s = 2.0              # intermittent: one slow + one healthy phase lasts period_s
    duty = 0.5                  # intermittent: fraction of the period spent slow
    until_s = 10.0              # recovering: slow until this many seconds into the run
    at_s = 10.0                 # dies: the worker stops at this time

    [link]                      # optional, per-worker link emulation
    bandwidth_mbit = 100.0      # tc htb on Mininet links
    delay_ms = 0.0              # emulated in the softswitch (no netem on this kernel)

    [[schedule]]                # the manual-schedule policy: mode swaps on the job clock
    at_step = 100               # when the job has applied this many updates
    mode = "partial"            # sync | partial | async
    quorum = 3                  # partial only
    level = "spine"             # racks >= 2 only: spine | leaf (every leaf) | leaf:leaf-N
                                # (the leaf of rack N, from 1); every level when left out
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from hysync import files

PATTERNS = ("constant", "intermittent", "recovering", "dies")
MODELS = ("mlp", "cnn")  # topologies/workload.py builds them
MAX_STEPS = 10_000_000  # a run of more steps is a typo: the demo's runs take hundreds
MODES = ("sync", "partial", "async")
# Upper bounds of the emulation's numbers: far beyond any useful run, and below where a
# worker's sleep of compute_ms * factor overflows or a run would never end.
MAX_COMPUTE_MS = 60_000
MAX_FACTOR = 1000.0
MAX_SECONDS = 86_400.0  # a straggler's period_s, until_s, at_s: a day
SECONDS_HINT = "seconds {} 0 and at most 86400 (a day)"
MAX_DELAY_MS = 10_000.0
MAX_MBIT = 100_000.0  # 100 Gbit/s
MAX_RACKS = 8  # leaves of one machine's emulated cluster (hysync rack up --racks)


class ScenarioError(ValueError):
    """A scenario file that cannot be used; the message names the field and the fix."""


@dataclass(frozen=True)
class Straggler:
    worker: int
    pattern: str
    factor: float = 1.0
    period_s: float = 2.0
    duty: float = 0.5
    until_s: float = 0.0
    at_s: float = 0.0

    def factor_at(self, t: float) -> float:
        """Compute slowdown at t seconds into the run (1.0 = healthy)."""
        if self.pattern == "constant":
            return self.factor
        if self.pattern == "intermittent":
            return self.factor if (t % self.period_s) < self.duty * self.period_s else 1.0
        if self.pattern == "recovering":
            return self.factor if t < self.until_s else 1.0
        return 1.0  # dies: healthy until it is gone

    def dead_at(self, t: float) -> bool:
        return self.pattern == "dies" and t >= self.at_s


@dataclass(frozen=True)
class ScheduledSwap:
    at_step: int
    mode: str
    quorum: int = 0
    level: str = ""  # racks >= 2: "spine", "leaf" or "leaf:leaf-N"; "": every level


@dataclass(frozen=True)
class Scenario:
    name: str
    workers: int
    steps: int
    compute_ms: float
    target_accuracy: float
    lr: float = 0.1
    stragglers: tuple[Straggler, ...] = ()
    bandwidth_mbit: float | None = None
    delay_ms: float = 0.0
    schedule: tuple[ScheduledSwap, ...] = field(default=())
    path: Path | None = None
    model: str = "mlp"
    description: str = ""
    racks: int = 1

    @property
    def per_rack(self) -> int:
        return self.workers // self.racks

    def rack_of(self, worker: int) -> int:
        return worker // self.per_rack

    def straggler(self, worker: int) -> Straggler | None:
        return next((s for s in self.stragglers if s.worker == worker), None)


def _field(table: dict, key: str, kind: type, where: str, default=None, check=None, hint=""):
    if key not in table:
        if default is None:
            raise ScenarioError(f"{where}: missing '{key}' ({hint or kind.__name__})")
        return default
    value = table[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value) if abs(value) < 2**1000 else math.inf
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ScenarioError(f"{where}: '{key}' must be a {kind.__name__}, got {value!r}")
    if kind is float and not math.isfinite(value):
        raise ScenarioError(f"{where}: '{key}' = {value!r} must be a finite number: {hint}")
    if check is not None and not check(value):
        raise ScenarioError(f"{where}: '{key}' = {value!r} is out of range: {hint}")
    return value


def _tables(data: dict, key: str, where: str) -> list[dict]:
    """An array of tables ([[key]]), possibly absent."""
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise ScenarioError(f"{where}: '{key}' must be an array of tables ([[{key}]]), "
                            f"got {value!r}")
    return value


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    data = files.read_toml(path, what="the scenario file", error=ScenarioError,
                           fix="pass a scenario such as topologies/scenarios/demo.toml")
    where = str(path)
    known = {"name", "workers", "steps", "compute_ms", "lr", "target_accuracy", "straggler",
             "link", "schedule", "description", "model", "racks"}
    unknown = set(data) - known
    if unknown:
        raise ScenarioError(f"{where}: unknown field(s) {sorted(unknown)}; known: {sorted(known)}")
    workers = _field(data, "workers", int, where, check=lambda v: 2 <= v <= 32,
                     hint="2..32 members")
    racks = _field(data, "racks", int, where, 1, lambda v: 1 <= v <= MAX_RACKS,
                   f"1 (one switch) or 2..{MAX_RACKS} racks behind leaves and a spine")
    if workers % racks or workers // racks < 2 and racks > 1:
        raise ScenarioError(f"{where}: 'workers' = {workers} cannot fill 'racks' = {racks} "
                            "evenly with at least 2 each: make workers a multiple of racks")
    stragglers = []
    for i, s in enumerate(_tables(data, "straggler", where)):
        w = f"{where}: straggler[{i}]"
        pattern = _field(s, "pattern", str, w, check=lambda v: v in PATTERNS,
                         hint=f"one of {', '.join(PATTERNS)}")
        stragglers.append(Straggler(
            worker=_field(s, "worker", int, w, check=lambda v: 0 <= v < workers,
                          hint=f"a worker id 0..{workers - 1}"),
            pattern=pattern,
            factor=_field(s, "factor", float, w, 1.0, lambda v: 1.0 <= v <= MAX_FACTOR,
                          f"a slowdown 1..{MAX_FACTOR:g}"),
            period_s=_field(s, "period_s", float, w, 2.0, lambda v: 0 < v <= MAX_SECONDS,
                            SECONDS_HINT.format(">")),
            duty=_field(s, "duty", float, w, 0.5, lambda v: 0 < v < 1, "a fraction in (0, 1)"),
            until_s=_field(s, "until_s", float, w, 0.0, lambda v: 0 <= v <= MAX_SECONDS,
                           SECONDS_HINT.format(">=")),
            at_s=_field(s, "at_s", float, w, 0.0, lambda v: 0 <= v <= MAX_SECONDS,
                        SECONDS_HINT.format(">=")),
        ))
    if len({s.worker for s in stragglers}) != len(stragglers):
        raise ScenarioError(f"{where}: a worker appears in two [[straggler]] tables; merge them")
    schedule = []
    for i, s in enumerate(_tables(data, "schedule", where)):
        w = f"{where}: schedule[{i}]"
        mode = _field(s, "mode", str, w, check=lambda v: v in MODES,
                      hint=f"one of {', '.join(MODES)}")
        quorum = _field(s, "quorum", int, w, 0, lambda v: 0 <= v <= workers,
                        f"0..{workers} (partial needs 1..{workers})")
        if mode == "partial" and quorum < 1:
            raise ScenarioError(f"{w}: partial needs 'quorum' = 1..{workers}")
        level = _level(s, w, racks)
        if racks > 1 and mode == "async":
            raise ScenarioError(f"{w}: async is not offered across switches (racks = {racks}): "
                                "choose sync or partial")
        if racks > 1 and mode == "partial":
            # each switch's quorum counts its own members: leaves at the spine, hosts at a leaf
            most = {"spine": racks}.get(level, workers // racks if level else
                                        min(racks, workers // racks))
            if quorum > most:
                raise ScenarioError(f"{w}: 'quorum' = {quorum} is more than the {most} "
                                    f"members at {level or 'every level'} (the spine's are "
                                    "the leaves, a leaf's its hosts): give 1.."
                                    f"{most} or name another level")
        schedule.append(ScheduledSwap(_field(s, "at_step", int, w, check=lambda v: v >= 0,
                                             hint="a step >= 0"), mode, quorum, level))
    link = data.get("link", {})
    if not isinstance(link, dict):
        raise ScenarioError(f"{where}: 'link' must be a table ([link]), got {link!r}")
    return Scenario(
        name=_field(data, "name", str, where, hint="a short name for logs and plots"),
        workers=workers,
        steps=_field(data, "steps", int, where, check=lambda v: 0 < v <= MAX_STEPS,
                     hint=f"1..{MAX_STEPS} steps"),
        compute_ms=_field(data, "compute_ms", float, where, 20.0,
                          lambda v: 0 <= v <= MAX_COMPUTE_MS,
                          f"ms >= 0 and at most {MAX_COMPUTE_MS} (a minute per step)"),
        target_accuracy=_field(data, "target_accuracy", float, where, 0.9,
                               lambda v: 0 < v <= 1, "a fraction in (0, 1]"),
        lr=_field(data, "lr", float, where, 0.1, lambda v: 0 < v <= 10, "a rate in (0, 10]"),
        stragglers=tuple(stragglers),
        bandwidth_mbit=_field(link, "bandwidth_mbit", float, f"{where}: link", -1.0,
                              lambda v: 0 < v <= MAX_MBIT, f"Mbit/s > 0 and at most {MAX_MBIT}")
        if "bandwidth_mbit" in link else None,
        delay_ms=_field(link, "delay_ms", float, f"{where}: link", 0.0,
                        lambda v: 0 <= v <= MAX_DELAY_MS, f"ms >= 0 and at most {MAX_DELAY_MS}"),
        schedule=tuple(sorted(schedule, key=lambda s: s.at_step)),
        path=path,
        model=_field(data, "model", str, where, "mlp", lambda v: v in MODELS,
                     f"one of {', '.join(MODELS)}"),
        description=_field(data, "description", str, where, ""),
        racks=racks,
    )


def _level(swap: dict, where: str, racks: int) -> str:
    """A [[schedule]] entry's level: "" (every level), "spine", "leaf" or "leaf:leaf-N", as
    `hysync mode set --level` names them."""
    if "level" not in swap:
        return ""
    leaves = [f"leaf:leaf-{r + 1}" for r in range(racks)]
    level = swap["level"]
    if racks == 1:
        raise ScenarioError(f"{where}: 'level' = {level!r} needs racks >= 2 (one switch has "
                            "one level): leave it out or set racks")
    if level not in ("spine", "leaf", *leaves):
        raise ScenarioError(f"{where}: 'level' = {level!r} is not a level: write spine, leaf "
                            f"(every leaf) or one of {', '.join(leaves)}")
    return level
