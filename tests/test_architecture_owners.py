"""Who writes the detector's state, checked from the code (ast, so nothing is imported):

- a GPU's readings (``detect.gpu.GpuTrack``) are written only by the track's own methods:
  no other module of the detector assigns one of its attributes, only the detector calls
  the methods that fold readings in (``ingest``, ``record``, ``reset_cycles``), and no
  module outside the detector's floor imports the track at all;
- the per-GPU rules (``detect/rules.py``) write nothing they are given: they return a
  ``Candidate`` (or, ``enter_work``, a new ``GpuDecision``) and the detector applies it;
- the run rules (``detect/multi.py``) write only the run context's candidates and its
  outputs, never its tracks, decisions or windows;
- the records the detector hands on are built by keyword (``kw_only``); what the detector
  decided is a frozen value, and what a rule proposes (a ``Candidate``, built on every eval
  for every GPU, where frozen would cost 4x) is never assigned into once built.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "gpumon"
DETECT = PACKAGE / "detect"
TRACK_MODULE = DETECT / "gpu.py"
# The track's methods that fold readings in; the detector (and the track) call them.
TRACK_WRITERS = ("ingest", "record", "reset_cycles")
# What the run rules may write of their RunContext: the candidates and the outputs.
RUN_OUTPUTS = {
    "cands",
    "busywait",
    "straggler",
    "spinning_since",
    "waited_on_s",
    "computed_s",
    "_working",
}
KEYWORD_RECORDS = {
    "model.py": ("Episode", "GpuVerdict", "Verdict"),
    "detect/rules.py": ("Candidate", "GpuDecision", "GpuContext"),
    "detect/detector.py": ("DetectorUpdate", "GpuTotals"),
    "detect/summary.py": ("GpuFacts",),
    "detect/multi.py": ("RunContext",),
    "detect/gpu.py": ("Rhythm",),  # (a Window is built by position in the hot path)
}
FROZEN_VALUES = {"detect/rules.py": ("GpuDecision",)}


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def class_named(tree: ast.Module, name: str) -> ast.ClassDef:
    found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    assert found, f"no class {name}"
    return found[0]


def targets(node: ast.AST) -> Iterator[ast.expr]:
    """The expressions an assignment writes (tuples unpacked; never the keys inside)."""
    if isinstance(node, ast.Assign):
        todo = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        todo = [node.target]
    else:
        return
    while todo:
        t = todo.pop()
        if isinstance(t, (ast.Tuple, ast.List)):
            todo.extend(t.elts)
        elif isinstance(t, ast.Starred):
            todo.append(t.value)
        else:
            yield t


def chain(e: ast.expr) -> tuple[str | None, list[str]]:
    """``c.cands[i]`` -> ("c", ["cands"]): the root name and the attributes on the way."""
    attrs: list[str] = []
    while isinstance(e, (ast.Attribute, ast.Subscript)):
        if isinstance(e, ast.Attribute):
            attrs.append(e.attr)
        e = e.value
    return (e.id if isinstance(e, ast.Name) else None), attrs[::-1]


def readings() -> set[str]:
    """Every attribute the track assigns itself: its readings (and their caches)."""
    cls = class_named(parse(TRACK_MODULE), "GpuTrack")
    names = set()
    for node in ast.walk(cls):
        for t in targets(node):
            root, attrs = chain(t)
            if root == "self" and attrs:
                names.add(attrs[0])
    return names


def methods(cls: ast.ClassDef) -> set[str]:
    return {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}


def test_the_readings_are_found() -> None:
    found = readings()
    assert {"cum_cov", "run_busy", "period_s", "latest", "long_gaps"} <= found
    # What the detector decides is no reading.
    assert not found & {"state", "cause", "reason", "seen_work", "work_start_s", "lost_s"}
    assert set(TRACK_WRITERS) <= methods(class_named(parse(TRACK_MODULE), "GpuTrack"))


def test_no_module_but_the_track_writes_its_readings() -> None:
    names = readings()
    wrong = []
    for path in sorted(DETECT.rglob("*.py")):
        if path == TRACK_MODULE:
            continue
        for node in ast.walk(parse(path)):
            for t in targets(node):
                root, attrs = chain(t)
                if root != "self" and attrs and attrs[-1] in names and isinstance(t, ast.Attribute):
                    wrong.append(f"{path.name}:{node.lineno}: {ast.unparse(t)}")
    assert not wrong, "a track's readings are written only by the track:\n" + "\n".join(wrong)


def test_only_the_detector_folds_readings_into_a_track() -> None:
    wrong = []
    for path in sorted(DETECT.rglob("*.py")):
        if path in (TRACK_MODULE, DETECT / "detector.py"):
            continue
        for node in ast.walk(parse(path)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in TRACK_WRITERS
                and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "self")
            ):
                wrong.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert not wrong, "only the detector calls a track's writers:\n" + "\n".join(wrong)


def test_nothing_outside_the_detector_imports_the_track() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(DETECT):
            continue
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            if "gpumon.detect.gpu" in names:
                wrong.append(str(path.relative_to(PACKAGE)))
    assert not wrong


def _parameter_writes(path: Path, allowed: set[str]) -> list[str]:
    """Assignments into what a function was given (its parameters' attributes or items),
    but for ``self`` in a method and the attributes in ``allowed``."""
    wrong = []
    for fn in ast.walk(parse(path)):
        if not isinstance(fn, (ast.FunctionDef, ast.Lambda)):
            continue
        a = fn.args
        params = {p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)} - {"self"}
        for node in ast.walk(fn):
            for t in targets(node):
                root, attrs = chain(t)
                written = root in params and not isinstance(t, ast.Name)
                if written and not (attrs and attrs[0] in allowed):
                    wrong.append(f"{path.name}:{node.lineno}: {ast.unparse(t)}")
    return wrong


def test_the_rules_return_what_they_find_and_write_nothing() -> None:
    wrong = _parameter_writes(DETECT / "rules.py", set())
    assert not wrong, "a rule returns a value; the detector applies it:\n" + "\n".join(wrong)


def test_the_run_rules_write_only_candidates_and_outputs() -> None:
    run_context = class_named(parse(DETECT / "multi.py"), "RunContext")
    fields = {
        n.target.id
        for n in run_context.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    assert fields >= RUN_OUTPUTS | {"tracks", "decided", "wins"}
    wrong = _parameter_writes(DETECT / "multi.py", RUN_OUTPUTS)
    assert not wrong, "the run rules rewrite candidates, never tracks:\n" + "\n".join(wrong)


def _dataclass_flags(cls: ast.ClassDef) -> set[str]:
    flags = set()
    for dec in cls.decorator_list:
        if isinstance(dec, ast.Call) and getattr(dec.func, "id", None) == "dataclass":
            flags |= {
                k.arg
                for k in dec.keywords
                if k.arg and isinstance(k.value, ast.Constant) and k.value.value is True
            }
    return flags


def test_records_are_built_by_keyword() -> None:
    """A record of many fields built by position reads wrong and breaks silently when a
    field is added: these cannot be (``kw_only``)."""
    for rel, names in KEYWORD_RECORDS.items():
        tree = parse(PACKAGE / rel)
        for name in names:
            assert "kw_only" in _dataclass_flags(class_named(tree, name)), f"{rel}: {name}"


def test_proposals_and_decisions_are_values() -> None:
    for rel, names in FROZEN_VALUES.items():
        tree = parse(PACKAGE / rel)
        for name in names:
            assert "frozen" in _dataclass_flags(class_named(tree, name)), f"{rel}: {name}"
    candidate = class_named(parse(DETECT / "rules.py"), "Candidate")
    fields = {
        n.target.id
        for n in candidate.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    assert {"state", "since_s", "backdate_s", "clear"} <= fields
    wrong = []
    for path in sorted(DETECT.rglob("*.py")):
        for node in ast.walk(parse(path)):
            for t in targets(node):
                root = chain(t)[0]
                if isinstance(t, ast.Attribute) and t.attr in fields and root != "self":
                    wrong.append(f"{path.name}:{node.lineno}: {ast.unparse(t)}")
    assert not wrong, "a candidate is replaced, never changed:\n" + "\n".join(wrong)
