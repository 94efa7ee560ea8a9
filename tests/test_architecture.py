"""The floors of the engine (docs/architecture.md), kept by reading every import in the project.

Every `import` counts: at the top of a module, inside a function, under `if TYPE_CHECKING:`. A module
belongs to the floor of the longest prefix in FLOORS that names it; it may import its own floor and the
floors below it, never one above, and no set of modules may import each other in a circle. A driver
imports the ground and its own folder only (a new chip is one file or folder plus a line in the
registry). An import inside a function must say why it is there (`# deferred: ...`): start-up time or
a heavy optional library, never a cycle, since a cycle fails here whatever its imports' places.
DAP's own field names (the camelCase properties of the protocol's schema) appear in `dap_server/` only.
"""

from __future__ import annotations

import ast
import graphlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.dap.wire import SPEC as SCHEMA_PATH

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hardware", "checkpoint", "provenance", "dap_server", "examples", "rewind")

# Lowest first. A module's floor is the one of the longest prefix naming it.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("programs", ("examples",)),  # the example models: torch only
    ("ground", ("hardware",)),  # vocabulary: Program, Node, Location, the driver contract, Tick, errors
    ("drivers", ("hardware.drivers", "hardware.frontends")),  # one file or folder per chip; torch.export
    ("records", ("provenance.writelog", "provenance.lineage")),  # what was written, and from what
    ("time", ("checkpoint",)),  # Timeline, ring, tiers, branches, traces
    ("analyses", ("provenance",)),  # forensics, experiments, repair, knowledge: handed a Session
    ("session", ("hardware.session", "hardware.ranks")),  # the Session and its collaborators; a Session per rank
    ("surfaces", ("dap_server", "provenance.lsp", "provenance.forensics_cli", "provenance.repair_cli",
                  "provenance.validate_cli", "provenance.charts", "provenance.report_html")),
    ("facade", ("rewind",)),  # `import rewind`: the Python API for scripts and notebooks, over the surfaces
]
# Which floors each floor may import (besides itself).
MAY_IMPORT: dict[str, set[str]] = {
    "programs": set(),
    "ground": set(),
    "drivers": {"ground"},
    "records": {"ground"},
    "time": {"ground", "records"},
    "analyses": {"ground", "drivers", "records", "time"},
    "session": {"ground", "drivers", "records", "time", "analyses"},
    "surfaces": {"ground", "drivers", "records", "time", "analyses", "session", "programs"},
    "facade": {"ground", "drivers", "records", "time", "analyses", "session", "programs", "surfaces"},
}
DRIVER_REGISTRY = "hardware.drivers"  # the one module of the drivers floor that names every driver
DEFERRED_NOTE = re.compile(r"#\s*deferred\b")


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the project module imported
    line: int
    in_function: bool
    noted: bool  # carries a `# deferred: why` comment on its line or the line above


def floor_of(module: str) -> str:
    best, length = None, -1
    for floor, prefixes in FLOORS:
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > length:
                best, length = floor, len(prefix)
    assert best is not None, f"{module} is in no floor: add it to FLOORS"
    return best


def project_modules() -> dict[str, tuple[Path, bool]]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            modules[".".join(parts)] = (path, is_package)
    return modules


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, modules) -> list[str]:
    names = []
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join(package + ([base] if base else []))
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    found = []
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name != module:
            found.append(name)
    return found


class _Imports(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool, lines: list[str], modules):
        self.module, self.is_package, self.lines, self.modules = module, is_package, lines, modules
        self.depth = 0
        self.found: list[Import] = []

    def _function(self, node) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def _import(self, node) -> None:
        around = " ".join(self.lines[max(0, node.lineno - 2): node.end_lineno])
        for target in _targets(self.module, self.is_package, node, self.modules):
            self.found.append(Import(self.module, target, node.lineno, self.depth > 0,
                                     bool(DEFERRED_NOTE.search(around))))

    visit_Import = visit_ImportFrom = _import


def all_imports() -> list[Import]:
    modules = project_modules()
    found = []
    for module, (path, is_package) in modules.items():
        text = path.read_text()
        visitor = _Imports(module, is_package, text.splitlines(), modules)
        visitor.visit(ast.parse(text, str(path)))
        found += visitor.found
    return found


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return all_imports()


def _where(i: Import) -> str:
    return f"{i.source} (line {i.line}) imports {i.target}"


def test_no_module_imports_a_floor_above_its_own(imports):
    wrong = [f"{_where(i)}: {floor_of(i.source)} may not import {floor_of(i.target)}"
             for i in imports
             if floor_of(i.source) != floor_of(i.target) and floor_of(i.target) not in MAY_IMPORT[floor_of(i.source)]]
    assert not wrong, "imports against the floor order:\n" + "\n".join(wrong)


def test_no_modules_import_each_other_in_a_circle(imports):
    graph: dict[str, set[str]] = {}
    for i in imports:
        graph.setdefault(i.source, set()).add(i.target)
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        pytest.fail("modules import each other in a circle: " + " -> ".join(exc.args[1]))


def test_a_driver_imports_only_the_ground_and_its_own_folder(imports):
    def chip(module: str) -> str:  # hardware.drivers.sim.kernel -> sim; hardware.drivers.torch -> torch
        parts = module.split(".")
        return parts[2] if len(parts) > 2 else ""

    wrong = [_where(i) for i in imports
             if i.source.startswith("hardware.drivers.") and i.target.startswith("hardware.drivers")
             and chip(i.source) != chip(i.target)]
    assert not wrong, "a driver imports another driver (or the registry):\n" + "\n".join(wrong)


def test_imports_inside_functions_say_why(imports):
    silent = [_where(i) for i in imports if i.in_function and not i.noted]
    assert not silent, ("imports inside a function without a `# deferred: why` comment (a cycle is no "
                        "reason: move the code to the floor it belongs to):\n" + "\n".join(silent))


def _camel_case_fields() -> set[str]:
    names: set[str] = set()

    def walk(node) -> None:
        if isinstance(node, dict):
            names.update(node.get("properties", {}) if isinstance(node.get("properties"), dict) else ())
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(Path(SCHEMA_PATH).read_text()))
    return {name for name in names if re.search(r"[a-z][A-Z]", name)}


def test_dap_field_names_appear_only_in_the_protocol_floor():
    fields = _camel_case_fields()
    assert {"hitCondition", "instructionReference", "hitBreakpointIds", "dataId"} <= fields  # the schema was read
    found = []
    for module, (path, _) in project_modules().items():
        if floor_of(module) == "surfaces" and module.startswith("dap_server"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in fields:
                found.append(f"{module} (line {node.lineno}): '{node.value}'")
    assert not found, "DAP field names below the protocol floor:\n" + "\n".join(found)


def test_the_checker_sees_what_it_must(tmp_path):
    """The reader finds imports inside functions and TYPE_CHECKING blocks, relative ones, and a circle."""
    source = ("from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
              "if TYPE_CHECKING:\n    from hardware.session import Session\n"
              "def f():\n    from . import ticks\n    import checkpoint.timeline  # deferred: start-up time\n")
    modules = {"hardware.program": (None, False), "hardware.session": (None, True),
               "hardware.ticks": (None, False), "checkpoint.timeline": (None, False)}
    visitor = _Imports("hardware.program", False, source.splitlines(), modules)
    visitor.visit(ast.parse(source))
    got = {(i.target, i.in_function, i.noted) for i in visitor.found}
    assert got == {("hardware.session", False, False), ("hardware.ticks", True, False),
                   ("checkpoint.timeline", True, True)}
    assert floor_of("hardware.program") == "ground" and floor_of("hardware.session.motion") == "session"
    assert "ground" not in {f for f in MAY_IMPORT["ground"]} and "session" not in MAY_IMPORT["time"]
    with pytest.raises(graphlib.CycleError):
        tuple(graphlib.TopologicalSorter({"a": {"b"}, "b": {"a"}}).static_order())
