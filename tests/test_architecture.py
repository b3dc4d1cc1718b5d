"""Layering rules, checked from the import graph (ast, so nothing is imported to check).

- only gpumon/sample/nvml.py imports pynvml, only gpumon/sample/host.py imports psutil:
  everything above them sees plain dataclasses;
- the floors: model, errors and loop at the bottom; detect and traces on them; sample and
  lab above; the engine above those; the faces on top; no module imports a floor above
  its own (the package's own ``__init__``, the library face, may name anything lazily);
- faces never import the samplers (gpumon.sample) nor the detector's floor (gpumon.detect),
  and never build a Detector, a job table, a job resolver or a process-tree sampler: they
  ask a gpumon.engine.Session, which wires sources, jobs, the detector and the memory;
- pyproject's package list names every package under gpumon/ (it is listed, not found,
  because the dstat plugin package is mapped onto dstat_plugins/);
- the detector is pure: no I/O modules, no clock;
- gpumon's modules import each other without a cycle (a function-level import that only
  hides one still counts): each module can be read, and loaded, before those above it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gpumon"
CORE_PREFIXES = (
    "gpumon.model",
    "gpumon.evidence_fields",
    "gpumon.errors",
    "gpumon.sample",
    "gpumon.traces",
    "gpumon.detect",
    "gpumon.engine",
    "gpumon.loop",
    "gpumon.files",
    "gpumon.terminal",
    "gpumon.lab",
    "gpumon.schema",
)


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


MODULES = {module_name(p): imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def importers_of(top: str) -> set[str]:
    return {m for m, deps in MODULES.items() if any(d.split(".")[0] == top for d in deps)}


def test_only_the_nvml_sampler_imports_pynvml() -> None:
    assert importers_of("pynvml") == {"gpumon.sample.nvml"}


def test_only_the_host_sampler_imports_psutil() -> None:
    assert importers_of("psutil") <= {"gpumon.sample.host"}


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith(CORE_PREFIXES)))
def test_core_never_imports_a_face(module: str) -> None:
    faces = {d for d in MODULES[module] if d.startswith("gpumon.faces")}
    assert not faces, f"{module} imports faces {faces}"


def test_detector_is_pure() -> None:
    impure = {
        "os",
        "time",
        "socket",
        "subprocess",
        "threading",
        "pynvml",
        "psutil",
        "io",
        "pathlib",
        "logging",
        "gpumon.sample",
        "gpumon.traces",
    }
    for module, deps in MODULES.items():
        if module.startswith("gpumon.detect"):
            bad = {
                d
                for d in deps
                if d in impure
                or d.split(".")[0] in impure
                or d.startswith(("gpumon.sample", "gpumon.traces"))
            }
            assert not bad, f"{module} imports {bad}"


def test_pyproject_lists_every_package() -> None:
    import tomllib

    setuptools = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"][
        "setuptools"
    ]
    listed = set(setuptools["packages"])
    found = {module_name(p) for p in PACKAGE.rglob("__init__.py")}
    assert found <= listed, f"not in pyproject's packages: {sorted(found - listed)}"
    # The rest are the folders mapped in from outside gpumon/ (dstat_plugins/, deploy/).
    assert listed - found == set(setuptools["package-dir"])


FACES = sorted(m for m in MODULES if m.startswith("gpumon.faces"))
FACES_NEVER_IMPORT = ("gpumon.sample", "gpumon.detect")


@pytest.mark.parametrize("module", FACES)
def test_faces_never_import_the_samplers_or_the_detector(module: str) -> None:
    below = {d for d in MODULES[module] if d.startswith(FACES_NEVER_IMPORT)}
    assert not below, f"{module} imports {below}: ask gpumon.engine instead"


# Floors, bottom up: a module imports only its own floor and those below it.
FLOORS = (
    (
        "gpumon.model",
        "gpumon.evidence_fields",
        "gpumon.errors",
        "gpumon.loop",
        "gpumon.files",
        "gpumon.terminal",
    ),
    ("gpumon.schema",),
    ("gpumon.detect", "gpumon.traces"),
    ("gpumon.sample", "gpumon.lab"),
    ("gpumon.engine",),
    ("gpumon.faces", "gpumon.cli", "gpumon.__main__"),
)


def floor_of(module: str) -> int | None:
    for k, prefixes in enumerate(FLOORS):
        if module.startswith(prefixes):
            return k
    return None


@pytest.mark.parametrize("module", sorted(m for m in MODULES if floor_of(m) is not None))
def test_no_module_imports_a_floor_above_its_own(module: str) -> None:
    own = floor_of(module)
    assert own is not None
    above = {d for d in MODULES[module] if (floor_of(d) or 0) > own}
    assert not above, f"{module} (floor {own}) imports {above} from a floor above"


def test_every_module_has_a_floor() -> None:
    homeless = {m for m in MODULES if floor_of(m) is None and m != "gpumon"}
    assert not homeless, f"modules on no floor: {sorted(homeless)} (see FLOORS)"


# What wires a run: the detector, the job table, the job resolver, a process-tree sampler.
BUILDERS = {"Detector", "JobTracker", "JobResolver", "ProcessTreeSampler", "NvmlSampler"}


def _builds(path: Path) -> list[tuple[int, str]]:
    """(line, class) where a module calls one of ``BUILDERS`` (``X(...)`` or ``m.X(...)``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            name = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            if name in BUILDERS:
                found.append((node.lineno, name))
    return found


@pytest.mark.parametrize("path", sorted((PACKAGE / "faces").rglob("*.py")), ids=str)
def test_faces_never_build_a_detector_nor_job_attribution(path: Path) -> None:
    assert not _builds(path), f"{path}: a face builds {_builds(path)}; the engine does"


def test_only_the_engine_builds_the_detector_and_the_job_table() -> None:
    builders = {
        module_name(p)
        for p in PACKAGE.rglob("*.py")
        if any(name in ("Detector", "JobTracker") for _, name in _builds(p))
        and not module_name(p).startswith("gpumon.detect")
    }
    assert builders <= {"gpumon.engine.session", "gpumon.engine.jobs"}
    assert builders, "the engine builds them: the rule looks for the wrong names"


def module_edges(path: Path) -> set[str]:
    """The gpumon modules a file imports.  ``from pkg import sub`` is an edge to ``sub``
    alone: the package is already loading when it hands out its submodule."""
    edges: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            edges.update(a.name for a in node.names if a.name in MODULES)
        elif isinstance(node, ast.ImportFrom) and node.module in MODULES and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & MODULES.keys()
            edges.update(subs)
            if len(subs) < len(node.names):
                edges.add(node.module)
    edges.discard(module_name(path))
    return edges


def import_cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    graph = {module_name(p): module_edges(p) for p in PACKAGE.rglob("*.py")}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            component.append(v)
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycles() -> None:
    assert import_cycles() == []


def test_the_rules_name_modules_and_classes_that_exist() -> None:
    """A rule over a module or a class that was renamed away checks nothing: every name
    the rules above use is still one of gpumon's."""
    prefixes = {*CORE_PREFIXES, *FACES_NEVER_IMPORT, *(p for floor in FLOORS for p in floor)}
    missing = {p for p in prefixes if not any(m == p or m.startswith(p + ".") for m in MODULES)}
    assert not missing, f"the rules name modules that do not exist: {sorted(missing)}"
    classes = {
        node.name
        for p in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(p.read_text(), str(p)))
        if isinstance(node, ast.ClassDef)
    }
    assert classes >= BUILDERS, f"the rules name classes that do not exist: {BUILDERS - classes}"
