"""Live progress of training runs: one line per configuration.

Each line shows the *job clock* (the updates the job applied, in units of one sync round
of every member: what ends the run, and what the summary counts) against the
scenario's steps, with its ETA, the mode in force and the latest held-out accuracy; the
controller's decisions appear as lines of their own as they happen. In partial or async
mode a round that closes without every member advances the clock by its share only, so
a fast worker runs more local steps than the clock: the line says so when it happens.

On a terminal the lines are live (rich); otherwise (CI, a log file) a plain line every
2 s per running configuration, and one line per event.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Protocol, TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Column

PLAIN_EVERY_S = 2.0


@dataclass
class RunState:
    """What one configuration's line shows (the reference replica's view)."""

    clock: float = 0.0  # the job's updates applied, in sync rounds
    local_steps: dict[int, int] = field(default_factory=dict)  # worker -> steps it ran
    mode: str | None = None
    accuracy: float | None = None

    def ahead(self) -> str:
        """Why a worker's local steps ran ahead of the job clock, if one did; '' otherwise."""
        if not self.local_steps:
            return ""
        worker, steps = max(self.local_steps.items(), key=lambda item: item[1])
        if steps <= int(self.clock) + 1:
            return ""
        why = self.mode if self.mode in ("partial", "async") else "earlier partial/async"
        return f"{why}: worker {worker} at {steps} local steps, job clock {int(self.clock)}"

    def fields(self) -> str:
        acc = f"{self.accuracy:.3f}" if self.accuracy is not None else "-"
        return "  ".join(p for p in (f"mode {self.mode or '-'}", f"accuracy {acc}",
                                     self.ahead()) if p)


class RunLine(Protocol):
    """The line of one running configuration."""

    def update(self, state: RunState) -> None: ...
    def event(self, text: str) -> None: ...
    def finish(self, state: RunState) -> None: ...


class Display(Protocol):
    def line(self, config: str, total: int) -> RunLine: ...
    def close(self) -> None: ...


def make_display(stream: TextIO = sys.stdout) -> Display:
    """Live lines on a terminal, plain lines otherwise."""
    return LiveDisplay(Console(file=stream)) if stream.isatty() else PlainDisplay(stream)


class LiveDisplay:
    def __init__(self, console: Console) -> None:
        # The details wrap under a narrow terminal rather than push the bar off the line.
        self._progress = Progress(
            TextColumn("{task.description}", table_column=Column(no_wrap=True)),
            BarColumn(bar_width=12), TextColumn("job clock {task.completed:.0f}/{task.total}"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[info]}", table_column=Column(ratio=1, overflow="fold")),
            console=console)
        self._progress.start()

    def line(self, config: str, total: int) -> RunLine:
        return _LiveLine(self._progress, config, total)

    def close(self) -> None:
        self._progress.stop()


class _LiveLine:
    def __init__(self, progress: Progress, config: str, total: int) -> None:
        self._progress, self._config = progress, config
        self._task = progress.add_task(config, total=total, info="starting")

    def update(self, state: RunState) -> None:
        self._progress.update(self._task, completed=int(state.clock), info=state.fields())

    def finish(self, state: RunState) -> None:
        self.update(state)
        self._progress.stop_task(self._task)

    def event(self, text: str) -> None:
        self._progress.console.print(f"  [{self._config}] {text}", markup=False,
                                     highlight=False)


class PlainDisplay:
    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def line(self, config: str, total: int) -> RunLine:
        return _PlainLine(self._stream, config, total)

    def close(self) -> None:
        pass


class _PlainLine:
    def __init__(self, stream: TextIO, config: str, total: int) -> None:
        self._stream, self._config, self._total = stream, config, total
        self._start = time.monotonic()
        self._last = self._start - PLAIN_EVERY_S
        self._shown = ""

    def update(self, state: RunState) -> None:
        if time.monotonic() - self._last >= PLAIN_EVERY_S:
            self.finish(state)

    def finish(self, state: RunState) -> None:
        now = time.monotonic()
        shown = f"job clock {int(state.clock)} of {self._total}  {state.fields()}"
        if shown != self._shown:  # a run winding down changes nothing: no repeated lines
            self._last, self._shown = now, shown
            self._write(f"{now - self._start:5.1f}s  {shown}")

    def event(self, text: str) -> None:
        self._write(text)

    def _write(self, text: str) -> None:
        print(f"  [{self._config}] {text}", file=self._stream, flush=True)


class QuietDisplay:
    """No output (benchmarks)."""

    def line(self, config: str, total: int) -> RunLine:
        return _QuietLine()

    def close(self) -> None:
        pass


class _QuietLine:
    def update(self, state: RunState) -> None:
        pass

    def finish(self, state: RunState) -> None:
        pass

    def event(self, text: str) -> None:
        pass
