"""What every test shares."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _state_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """State a test's `hysync serve` keeps (its job keys) goes to a directory of the test's,
    not the user's ~/.local/state; a serve restarted within the test finds it again."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
