"""What every test shares.

Hypothesis's deadline fails an example that runs longer than 200 ms, and its too_slow
health check a strategy that generates slowly: both measure the machine, not the property,
and on a busy machine (CI beside other jobs) they fail properties that hold. The suite
asserts no wall-clock bound; timing is bench/'s to measure."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("hysync", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("hysync")


@pytest.fixture(autouse=True)
def _state_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """State a test's `hysync serve` keeps (its job keys) goes to a directory of the test's,
    not the user's ~/.local/state; a serve restarted within the test finds it again."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
