"""Link delay emulation in the softswitch (this kernel has no netem)."""

from __future__ import annotations

import pytest

from hysync.softswitch.__main__ import main
from hysync.softswitch.delay import DelayLine, parse_delay


def test_frames_leave_after_their_ports_delay_in_order():
    line = DelayLine({2: 5.0, 3: 0.0})
    assert line.delayed(2) and not line.delayed(3) and not line.delayed(1)
    line.push(2, b"a", now=10.0)
    line.push(2, b"b", now=10.001)
    assert line.due(now=10.004) == []
    assert line.timeout_ms(100, now=10.004) == 2
    assert line.due(now=10.0055) == [(2, b"a")]
    assert line.due(now=10.01) == [(2, b"b")]
    assert line.timeout_ms(100) == 100 and len(line) == 0


def test_negative_delay_is_refused():
    with pytest.raises(ValueError, match="must be >= 0"):
        DelayLine({1: -1.0})


@pytest.mark.parametrize("text", ["3", "x:5", "3:y", "-1:5"])
def test_bad_delay_spec_says_the_syntax(text):
    with pytest.raises(ValueError, match="PORT:MS|>= 0"):
        parse_delay(text)


def test_delay_needs_the_raw_data_plane(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--grpc-addr", "127.0.0.1:0", "--udp", "127.0.0.1:0", "--delay", "1:5"])
    assert exit_.value.code == 2
    assert "--delay needs the raw data plane" in capsys.readouterr().err
