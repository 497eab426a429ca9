"""Progress lines: the job clock against the total, and why local steps may run ahead."""

from __future__ import annotations

import io

from rich.console import Console

from hysync.topologies.progress import LiveDisplay, PlainDisplay, RunState, make_display


def test_a_worker_ahead_of_the_job_clock_is_explained():
    state = RunState(clock=240.4, local_steps={0: 286, 3: 150}, mode="partial")
    assert state.ahead() == "partial: worker 0 at 286 local steps, job clock 240"
    state.mode = "sync"  # back in sync, the partial rounds before still show
    assert state.ahead() == ("earlier partial/async: worker 0 at 286 local steps, "
                             "job clock 240")


def test_local_steps_level_with_the_clock_need_no_explanation():
    # a step's record lands just before its round is counted: one step ahead is level
    state = RunState(clock=119.0, local_steps={0: 120, 1: 119}, mode="sync")
    assert state.ahead() == ""
    assert "local steps" not in state.fields()


def test_plain_lines_count_the_job_clock_and_print_decisions_once():
    out = io.StringIO()
    display = make_display(out)
    assert isinstance(display, PlainDisplay)  # not a terminal: plain lines
    line = display.line("hysync-adaptive", 300)
    state = RunState(clock=100, local_steps={0: 101}, mode="sync", accuracy=0.9)
    line.update(state)
    line.event("policy: mode partial(3): worker 3 slow (2.72x); cost model: ...")
    state.mode, state.clock = "partial", 300
    state.local_steps[0] = 340
    line.update(state)  # within 2 s of the last line: not shown
    line.finish(state)  # the end is always shown
    line.finish(state)  # ... once
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines
    assert "job clock 100 of 300  mode sync  accuracy 0.900" in lines[0]
    assert lines[1] == ("  [hysync-adaptive] policy: mode partial(3): worker 3 slow (2.72x); "
                        "cost model: ...")
    assert "job clock 300 of 300  mode partial" in lines[2]
    assert "partial: worker 0 at 340 local steps, job clock 300" in lines[2]


def test_live_line_shows_the_clock_mode_accuracy_and_decisions():
    out = io.StringIO()
    display = LiveDisplay(Console(file=out, force_terminal=True, width=250))
    line = display.line("hysync-adaptive", 300)
    line.event("policy: mode partial(3): worker 3 slow (2.72x)")
    line.finish(RunState(clock=150, local_steps={0: 151}, mode="partial", accuracy=0.95))
    display.close()
    text = out.getvalue()
    for shown in ("hysync-adaptive", "job clock 150/300", "mode partial", "accuracy 0.950",
                  "[hysync-adaptive] policy: mode partial(3): worker 3 slow (2.72x)"):
        assert shown in text, shown
