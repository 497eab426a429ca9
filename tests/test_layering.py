"""The import rules of docs/design.md ("The house"), read from the source with `ast`.

Every `import` counts, at module level or inside a function, under `TYPE_CHECKING` or
not: a deferred import still ties the two modules together. The tables below are the
drawing's arrows; a new arrow is a change to docs/design.md and to this file together.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Where each top-level folder lives in the import namespace (pyproject's wheel.packages).
NAMESPACE = {
    "hysync": "hysync",
    "controlplane": "hysync.controlplane",
    "softswitch": "hysync.softswitch",
    "worker": "hysync.worker",
    "topologies": "hysync.topologies",
    "examples": "hysync.examples",
    "bench": "bench",
    "tests": "tests",
}

# ------------------------------------------------------------------ top-level packages
# hysync's core (the wire format, names, schema, files, TLS, logs) is the ground floor;
# hysync.torch and hysync.backend, the PyTorch face, sit on the worker and the control
# plane and count as a part of their own.
TORCH_FACE = ("hysync.torch", "hysync.backend")
PACKAGE_ARROWS: dict[str, set[str]] = {
    "hysync": set(),
    "worker": {"hysync"},
    "softswitch": {"hysync"},
    "controlplane": {"hysync"},
    "torch-face": {"hysync", "worker", "controlplane"},
    "topologies": {"hysync", "torch-face", "worker", "softswitch", "controlplane"},
    # the outside: they may import any package, and nothing above imports them
    "examples": {"hysync", "torch-face", "worker", "softswitch", "controlplane", "topologies"},
    "bench": {"hysync", "torch-face", "worker", "softswitch", "controlplane", "topologies",
              "tests"},
    "tests": {"hysync", "torch-face", "worker", "softswitch", "controlplane", "topologies",
              "bench", "examples"},
}

# ------------------------------------------------------------------ controlplane's rooms
# Module or subpackage of hysync.controlplane -> its room. "shared" holds what every room
# needs (errors, the job definition, the TOML field readers); "package" is
# hysync.controlplane's own __init__, its public front.
ROOM_OF = {
    "errors": "shared", "job": "shared", "toml_fields": "shared",
    "p4rt": "p4rt", "tables": "tables", "controller": "controller", "policy": "policy",
    "testbed": "testbed", "serve": "serve", "cli": "cli",
}
BELOW_CLI = {"serve", "testbed", "policy", "controller", "tables", "p4rt", "shared"}
ROOM_ARROWS: dict[str, set[str]] = {
    "shared": set(),
    "p4rt": {"shared"},
    "tables": {"p4rt", "shared"},
    "controller": {"tables", "p4rt", "shared"},
    "policy": {"controller", "tables", "shared"},
    "testbed": {"controller", "tables", "p4rt", "shared"},
    "serve": {"testbed", "policy", "controller", "tables", "p4rt", "shared"},
    "cli": BELOW_CLI,
    "package": {"controller", "tables", "p4rt", "shared"},
}


# ------------------------------------------------------------------ reading the source
def module_name(path: Path) -> str:
    """The dotted name a repository file is imported as."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([NAMESPACE[parts[0]], *parts[1:]])


def repository_modules() -> dict[str, tuple[str, bool]]:
    """Dotted name -> (source, is a package) of every Python file of the packages."""
    found = {}
    for folder in NAMESPACE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            found[module_name(path)] = (path.read_text(encoding="utf-8"),
                                        path.name == "__init__.py")
    return found


def imports(name: str, source: str, is_package: bool, known: Iterable[str]) -> set[str]:
    """The modules of `known` that the module `name` imports, anywhere in its body."""
    known = set(known)
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import mod` imports the module pkg.mod; `from mod import name`, mod
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # a name inside a module: the module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph(modules: Mapping[str, tuple[str, bool]]) -> dict[str, set[str]]:
    return {name: imports(name, src, pkg, modules) for name, (src, pkg) in modules.items()}


# ------------------------------------------------------------------ the rules
def package_of(module: str) -> str:
    if any(module == face or module.startswith(face + ".") for face in TORCH_FACE):
        return "torch-face"
    for folder, space in NAMESPACE.items():
        if folder != "hysync" and (module == space or module.startswith(space + ".")):
            return folder
    return "hysync"


def room_of(module: str) -> str | None:
    """The controlplane room of a module; None outside hysync.controlplane."""
    if module == "hysync.controlplane":
        return "package"
    if not module.startswith("hysync.controlplane."):
        return None
    return ROOM_OF[module.split(".")[2]]


def forbidden_arrows(edges: Mapping[str, set[str]]) -> list[str]:
    """Every import that crosses packages or rooms against the tables above."""
    wrong = []
    for source, targets in sorted(edges.items()):
        for target in sorted(targets):
            a, b = package_of(source), package_of(target)
            if a != b and b not in PACKAGE_ARROWS[a]:
                wrong.append(f"{source} -> {target} ({a} never imports {b})")
                continue
            ra, rb = room_of(source), room_of(target)
            if ra is not None and rb is not None and ra != rb and rb not in ROOM_ARROWS[ra]:
                wrong.append(f"{source} -> {target} (room {ra} never imports room {rb})")
    return wrong


def circles(edges: Mapping[str, set[str]], inside: str) -> list[list[str]]:
    """The import circles among the modules under `inside` (one per strongly connected
    set of modules, Tarjan's algorithm)."""
    nodes = sorted(n for n in edges if n == inside or n.startswith(inside + "."))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges[node]):
            if nxt not in nodes:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            members = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                members.append(top)
                if top == node:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for node in nodes:
        if node not in index:
            visit(node)
    return found


# ------------------------------------------------------------------ the repository
@pytest.fixture(scope="module")
def edges() -> dict[str, set[str]]:
    return graph(repository_modules())


def test_every_controlplane_module_has_a_room(edges: dict[str, set[str]]) -> None:
    for name in edges:
        if name.startswith("hysync.controlplane."):
            assert name.split(".")[2] in ROOM_OF, (
                f"{name}: add its room to ROOM_OF here and to docs/design.md")


def test_no_import_circle_inside_controlplane(edges: dict[str, set[str]]) -> None:
    assert circles(edges, "hysync.controlplane") == []


def test_every_import_follows_the_drawn_arrows(edges: dict[str, set[str]]) -> None:
    assert forbidden_arrows(edges) == []


def test_the_arrows_are_the_drawing_in_docs_design() -> None:
    """Each room arrow of the table is drawn in docs/design.md, and no other."""
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    drawn = text.split("<!-- rooms -->")[1].split("<!-- /rooms -->")[0]
    listed = {}
    for line in drawn.splitlines():
        room, sep, targets = line.strip().partition(" imports ")
        if sep:
            listed[room] = {t.strip() for t in targets.split(",")} - {"nothing"}
    assert listed == ROOM_ARROWS


# ------------------------------------------------------------------ the checks can fail
def synthetic(sources: dict[str, str]) -> dict[str, set[str]]:
    return graph({name: (src, False) for name, src in sources.items()})


def test_a_circle_is_found() -> None:
    edges = synthetic({
        "hysync.controlplane.cli.main": "from hysync.controlplane.cli import completion\n",
        "hysync.controlplane.cli.completion":
            "def f():\n    from hysync.controlplane.cli.main import build_parser\n",
        "hysync.controlplane.errors": "",
    })
    assert circles(edges, "hysync.controlplane") == [
        ["hysync.controlplane.cli.completion", "hysync.controlplane.cli.main"]]


def test_an_upward_import_is_refused() -> None:
    edges = synthetic({
        "hysync.controlplane.testbed.rack": "from hysync.topologies.netns import NetnsStar\n",
        "hysync.topologies.netns": "NetnsStar = object\n",
        "hysync.controlplane.p4rt.switch":
            "from hysync.controlplane.policy.runner import PolicyRunner\n",
        "hysync.controlplane.policy.runner": "PolicyRunner = object\n",
        "hysync.controlplane.tables.counters": "import bench.worker_bench\n",
        "bench.worker_bench": "",
        "hysync.wire": "from hysync.controlplane import Controller\n",
        "hysync.controlplane": "Controller = object\n",
    })
    assert forbidden_arrows(edges) == [
        "hysync.controlplane.p4rt.switch -> hysync.controlplane.policy.runner "
        "(room p4rt never imports room policy)",
        "hysync.controlplane.tables.counters -> bench.worker_bench "
        "(controlplane never imports bench)",
        "hysync.controlplane.testbed.rack -> hysync.topologies.netns "
        "(controlplane never imports topologies)",
        "hysync.wire -> hysync.controlplane (hysync never imports controlplane)",
    ]


def test_relative_and_deferred_imports_count() -> None:
    edges = synthetic({
        "hysync.controlplane.tables.installed":
            "def read():\n    from ..serve import server\n",
        "hysync.controlplane.serve.server": "",
    })
    assert edges["hysync.controlplane.tables.installed"] == {"hysync.controlplane.serve.server"}
    assert forbidden_arrows(edges) == [
        "hysync.controlplane.tables.installed -> hysync.controlplane.serve.server "
        "(room tables never imports room serve)"]
