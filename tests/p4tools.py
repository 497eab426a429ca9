"""The tests that need p4c or BMv2 skip, and say why, where the tools are missing (a user's
clone). Where they were installed for the run (`.ci/run` sets HYSYNC_REQUIRE_P4TOOLS=1
after installing them), a missing tool is a failure instead: a BMv2 test never passes
for CI by skipping."""

from __future__ import annotations

import os

import pytest

REQUIRED = os.environ.get("HYSYNC_REQUIRE_P4TOOLS") == "1"


def skip_unless_available(reason: str | None) -> None:
    """Skip (or, where the tools are required, fail) with `reason`; None means they run."""
    if reason is None:
        return
    if REQUIRED:
        pytest.fail(f"{reason} (HYSYNC_REQUIRE_P4TOOLS=1 says p4c and BMv2 were installed "
                    "for this run: put /opt/p4tools/bin on PATH, or unset it to skip)",
                    pytrace=False)
    pytest.skip(reason)
