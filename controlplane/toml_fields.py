"""Reading the control plane's TOML files (job files, inventories): the file itself, bounded
in size and nesting, and the checks every table's fields share. A refused field is a
`JobConfigError` naming it and the fix; the inventory re-raises those as its own error."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from hysync import files
from hysync.controlplane.errors import JobConfigError

Parsed = TypeVar("Parsed")


def read_toml(path: Path, error: type[Exception], what: str, example: str) -> dict[str, Any]:
    """A TOML file as data, bounded in size and nesting (hysync.files); `error` with what is
    wrong and an example of a good file."""
    return files.read_toml(path, what=what, fix=f"pass a TOML file such as {example}",
                           error=error)


def load_toml(path: Path, parse: Callable[[dict[str, Any]], Parsed], error: type[Exception],
              what: str, example: str) -> Parsed:
    """`parse` of the TOML file at `path`; what it refuses, a field helper's `JobConfigError`
    included, is `error` with the file's name in front."""
    data = read_toml(path, error, what, example)
    try:
        return parse(data)
    except (JobConfigError, error) as err:
        raise error(f"{path}: {err}") from None


def no_unknown_keys(table: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise JobConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed keys are "
                             f"{', '.join(sorted(allowed))}")


def tables(raw: list[Any], section: str, allowed: set[str],
           error: type[Exception] = JobConfigError) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Each table of the array of tables `[[section]]` with where it stands (`section[i]`),
    its keys checked against `allowed`; anything else in the array is `error`."""
    for i, item in enumerate(raw):
        where = f"{section}[{i}]"
        if not isinstance(item, Mapping):
            raise error(f"{where} must be a table ([[{section}]])")
        no_unknown_keys(item, allowed, where)
        yield where, item


def int_field(table: Mapping[str, Any], key: str, low: int | None, high: int | None, hint: str,
              *, field: str | None = None, default: int | None = None) -> int:
    field = field or key
    if key not in table:
        if default is not None:
            return default
        raise JobConfigError(f"{field} is missing: set it to {hint}")
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise JobConfigError(f"{field} = {value!r} must be an integer: {hint}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise JobConfigError(f"{field} = {value} is out of range: use {hint}")
    return value
