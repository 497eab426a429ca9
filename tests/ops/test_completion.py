"""`hysync completion bash`: the script, loaded into a real bash, completes commands,
subcommands, options and choices."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from .conftest import hysync

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def complete(script: str, line: str) -> list[str]:
    """What bash offers for the last word of `line` with the script loaded."""
    words = line.split(" ")
    program = (f"{script}\nCOMP_WORDS=({' '.join(repr(w) for w in words)})\n"
               f"COMP_CWORD={len(words) - 1}\n_hysync_complete\n"
               "printf '%s\\n' \"${COMPREPLY[@]}\"\n")
    result = subprocess.run(["bash", "--norc", "--noprofile"], input=program, text=True,
                            capture_output=True, check=True, timeout=30)
    return [w for w in result.stdout.splitlines() if w]


def test_the_bash_script_completes_commands_options_and_choices() -> None:
    code, script, err = hysync("completion", "bash")
    assert (code, err) == (0, "")
    assert script.rstrip().endswith("complete -o default -F _hysync_complete hysync")
    assert {"job", "mode", "member", "serve", "top", "stats"} <= set(complete(script, "hysync "))
    assert complete(script, "hysync jo") == ["job"]
    assert set(complete(script, "hysync job ")) == {"add", "remove", "list", "--help"}
    assert complete(script, "hysync --json mode set 1 --slots 0-3 pa") == ["partial"]
    assert "--wait" in complete(script, "hysync mode set 1 --")
    assert set(complete(script, "hysync serve inv.toml --policy ")) == {"adaptive", "none"}


def test_an_unknown_shell_is_a_usage_error() -> None:
    code, out, err = hysync("completion", "fish")
    assert (code, out) == (2, "") and "invalid choice: 'fish'" in err
