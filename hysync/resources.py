"""The files HySync ships besides its code, found the same way from a wheel and from a
checkout: the P4 sources and P4Info files (`p4src/`) and the example inventories and
scripts (`examples/`).

A wheel holds them under the package (`hysync/p4src/...`, pyproject's `wheel.packages`);
an editable install leaves them where the repository keeps them, beside `hysync/`. Every
lookup goes through `path`, so no module depends on where it was installed from.

Inventories and `hysync pipeline push` accept `hysync:RELATIVE` for a shipped file, e.g.
`p4info = "hysync:p4src/v1model/hysync.p4info.txtpb"`, which works from any directory.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

PREFIX = "hysync:"
V1MODEL_P4INFO = "p4src/v1model/hysync.p4info.txtpb"


def path(relative: str) -> Path:
    """The shipped file or folder `relative` (e.g. "p4src/v1model/hysync.p4info.txtpb")."""
    shipped = Path(str(files("hysync"))) / relative  # a wheel: package data
    if shipped.exists():
        return shipped
    # An editable install: the folders sit beside hysync/ in the checkout.
    checkout = Path(__file__).resolve().parent.parent / relative
    if checkout.exists():
        return checkout
    raise FileNotFoundError(f"{PREFIX}{relative}: HySync ships no such file (looked in "
                            f"{shipped.parent}); the shipped ones are under p4src/ and "
                            "examples/")


def resolve(value: str, base: Path | None = None) -> Path:
    """A path as a user wrote it: `hysync:RELATIVE` is a shipped file, anything else is
    taken relative to `base` (default: the working directory)."""
    if value.startswith(PREFIX):
        return path(value[len(PREFIX):])
    return ((base or Path.cwd()) / value).resolve()
