"""Layering rules, checked from the import graph (ast, so nothing is imported to check).

- only gpumon/sample/nvml.py imports pynvml, only gpumon/sample/host.py imports psutil:
  everything above them sees plain dataclasses;
- the core (model, errors, sample, traces, detect, session, loop) and the lab never
  import a face: faces import the core;
- faces never import the samplers (gpumon.sample) and never build a Detector: they ask a
  gpumon.session.Session, the one place that wires sources and the detector;
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
    "gpumon.errors",
    "gpumon.sample",
    "gpumon.traces",
    "gpumon.detect",
    "gpumon.session",
    "gpumon.loop",
    "gpumon.lab",
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
        "gpumon.monitor",
    }
    for module, deps in MODULES.items():
        if module.startswith("gpumon.detect"):
            bad = {
                d
                for d in deps
                if d in impure
                or d.split(".")[0] in impure
                or d.startswith(("gpumon.sample", "gpumon.traces", "gpumon.monitor"))
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


@pytest.mark.parametrize("module", FACES)
def test_faces_never_import_the_samplers(module: str) -> None:
    samplers = {d for d in MODULES[module] if d.startswith(("gpumon.sample", "gpumon.monitor"))}
    assert not samplers, f"{module} imports {samplers}: ask gpumon.session.Session instead"


def _calls_detector(path: Path) -> list[int]:
    """Lines where a module calls ``Detector(...)`` (or ``detect.Detector(...)``)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            name = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            if name == "Detector":
                lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("path", sorted((PACKAGE / "faces").rglob("*.py")), ids=str)
def test_faces_never_build_a_detector(path: Path) -> None:
    assert not _calls_detector(path), f"{path}: a face builds a Detector; the session does"


def test_only_the_session_builds_the_detector() -> None:
    builders = {
        module_name(p)
        for p in PACKAGE.rglob("*.py")
        if _calls_detector(p) and not module_name(p).startswith("gpumon.detect")
    }
    assert builders == {"gpumon.session"}


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
