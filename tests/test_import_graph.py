"""The import graph of sweep/, workers/ and storage/: no circle, layers one way, no upward import
inside a package, folders small enough to read, and the packages' public names resolve.

The graph is read with ast (nothing is imported to build it): every import statement counts, at
module level, inside a function or under `if TYPE_CHECKING:`. `from pkg import name` is an arrow
to the module `pkg.name` when there is one, else to `pkg` (its `__init__`).
"""

from __future__ import annotations

import ast
import importlib
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("storage", "workers", "sweep")
"""Lowest first: a package imports only the packages before it (sweep -> workers -> storage)."""

ORDER: dict[str, list[str]] = {
    "sweep": ["terminal", "config", "clusters", "driver", "report show", "cli", "*"],
    "sweep.terminal": ["faults interrupts progress quiet_logs", "*"],
    "sweep.config": ["yaml_io", "schema", "controls seeds checkpoints", "load", "*"],
    "sweep.clusters": ["config", "masking local slurm kubernetes", "shapes", "client", "*"],
    "sweep.driver": ["devices weights plan",
                     "balance bounded compaction freshness training_watch", "token_fit",
                     "preflight", "runner", "graph", "*"],
    "sweep.report": ["controls nulls precision readings seeds", "training intervals",
                     "findings", "tables", "html plots precision_flips", "*"],
    "sweep.show": ["view source", "figure", "*"],
    "sweep.cli": ["outputs report_cache", "commands", "entry", "*"],
    "sweep.cli.commands": ["store_args", "*"],
    "workers": ["exact", "inputs nulls", "models", "task_specs", "tasks", "*"],
    "workers.tasks": ["cache pipeline shards threads", "buffers verdicts nulls", "extract",
                      "*"],
    "workers.exact": ["device_rollout numba_cache scratch token_kinds", "kernel",
                      "center_bound radius restrict_kernel", "pruned", "equality", "cells",
                      "readings", "*"],
    "workers.nulls": ["registry", "baseline", "matched", "*"],
    "workers.inputs": ["base", "*"],
    "workers.models": ["determinism image_processing random_init tiny_text", "registry",
                       "token_layout", "extraction", "hf timm_", "trained", "*"],
    "workers.models.trained": ["options split", "cache", "run", "loop", "family", "ft vit", "*"],
    "workers.models.trained.ft": ["options", "data", "training", "adapter", "*"],
    "workers.models.trained.vit": ["options", "data", "probe", "training", "dino distilled",
                                   "adapter", "*"],
    "storage": ["errors layout fingerprint recording", "location",
                "integrity lease device_pin store", "lock markers", "attention", "query", "*"],
    "storage.query": ["statistics bootstrap", "counts", "nulls tidy", "results status", "*"],
}
"""Per package, its children (modules and subpackages) in layers, lowest first, names of one
layer separated by spaces. A child imports only children of lower layers; `*` is every child not
named (a new module lands on top until it is placed: name it here when something below it
needs it), and the children under `*` may import one another (the cycle test still holds)."""

MAX_MODULES = 12
"""Modules per package folder (its `__init__` and `__main__` not counted)."""


def modules() -> dict[str, Path]:
    """Module name -> file, for every module of PACKAGES (a package by its __init__)."""
    out = {}
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that `name` (at `path`) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = alias.name
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target:
                    found.add(target)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    found.add(f"{base}.{alias.name}")
                elif base in known:
                    found.add(base)
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(name, path, set(known)) for name, path in known.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def layer(package: str, child: str) -> int | None:
    """`child`'s layer in ORDER[package] (None: `*`, or a package without an ORDER)."""
    if package not in ORDER:
        return None
    for number, names in enumerate(ORDER[package]):
        if child in names.split():
            return number
    return None


def upward(importer: str, target: str) -> str | None:
    """Why the arrow importer -> target points up, or None when it points down."""
    a, b = importer.split("."), target.split(".")
    if a[0] != b[0]:
        if PACKAGES.index(b[0]) > PACKAGES.index(a[0]):
            return f"{a[0]} imports {b[0]} (the order is {' -> '.join(reversed(PACKAGES))})"
        return None
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    package = ".".join(a[:common])
    if common == len(b):  # the target is a package the importer lives in: its __init__
        return f"a module of {target} imports its own package's __init__"
    if common == len(a):  # a package's __init__ imports its own children: its public surface
        return None
    mine, theirs = layer(package, a[common]), layer(package, b[common])
    if package not in ORDER or (mine is None and theirs is None):
        return None
    if mine is None or (theirs is not None and theirs < mine):
        return None
    return (f"{a[common]} imports {b[common]}, which is not below it in "
            f"ORDER[{package!r}]")


def test_no_circle():
    assert circles(import_graph()) == []


def test_no_upward_import():
    graph = import_graph()
    problems = [f"{importer} -> {target}: {why}" for importer in sorted(graph)
                for target in sorted(graph[importer])
                if (why := upward(importer, target))]
    assert problems == []


def test_order_names_real_children():
    """A name in ORDER that is no child of its package is a typo or a leftover."""
    known = modules()
    stale = [f"{package}.{child}" for package, layers in ORDER.items()
             for names in layers for child in names.split()
             if child != "*" and f"{package}.{child}" not in known]
    assert stale == []


def test_folders_stay_small():
    counts: dict[str, int] = {}
    for path in modules().values():
        if path.name not in ("__init__.py", "__main__.py"):
            folder = str(path.parent.relative_to(ROOT))
            counts[folder] = counts.get(folder, 0) + 1
    assert {f: n for f, n in counts.items() if n > MAX_MODULES} == {}


def package_exports() -> list[tuple[str, str, str]]:
    """(package, module, name) for every name a package __init__ gives on first use: the
    `submod_attrs` of its `lazy_loader.attach` call."""
    out = []
    for name, path in modules().items():
        if path.name != "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.keyword) and node.arg == "submod_attrs":
                out += [(name, key.value, attr.value)
                        for key, attrs in zip(node.value.keys, node.value.values, strict=True)
                        for attr in attrs.elts]
    return sorted(out)


@pytest.mark.parametrize(("package", "source_name", "name"), package_exports())
def test_public_names_resolve(package, source_name, name):
    """Each package's public names (imported on first use) come from the module defining them."""
    module = importlib.import_module(package)
    value = getattr(module, name)
    source = importlib.import_module(f"{package}.{source_name}")
    assert value is getattr(source, name)
    assert name in module.__all__


def shims() -> list[tuple[str, str]]:
    """(old path, new path) of every deprecated module: one whose docstring says it moved."""
    out = []
    for name, path in modules().items():
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        if doc.startswith("Deprecated import path"):
            out.append((name, doc.split("`")[3]))
    return sorted(out)


@pytest.mark.parametrize(("old", "new"), shims())
def test_moved_modules_keep_their_old_import_path(monkeypatch, old, new):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=new):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert importlib.import_module(old) is module  # warned once, at the first import
