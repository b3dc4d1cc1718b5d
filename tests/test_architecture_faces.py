"""Faces stand side by side: a face imports no other face.

What faces share lives beside them, in modules of gpumon/faces/ itself (``common``,
``wrap``, ``trace_output``); a face is a package (gpumon/faces/<face>/).  The one face
made of others, ``demo`` (serve and watch over a bundled trace), starts them through
their packages' public names (``gpumon.faces.serve.Daemon``, ``gpumon.faces.watch.watch``),
never through their modules: a change inside serve or watch reaches the demo as it
reaches a user.  Checked from the import graph (ast: nothing is imported to check).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

FACES_DIR = Path(__file__).resolve().parent.parent / "gpumon" / "faces"
FACES = sorted(p.name for p in FACES_DIR.iterdir() if (p / "__init__.py").exists())
# The faces a face may start through their package's public names (``__all__``).
COMPOSED_OF = {"demo": {"serve", "watch"}}


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) of every absolute import in ``path``, function-level ones too."""
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [alias.name for alias in node.names]))
    return found


def _face_of(module: str) -> tuple[str, str] | None:
    """(face, the rest of the module path) for a module inside a face's package."""
    parts = module.split(".")
    if parts[:2] != ["gpumon", "faces"] or len(parts) < 3 or parts[2] not in FACES:
        return None
    return parts[2], ".".join(parts[3:])


def _public(face: str) -> set[str]:
    tree = ast.parse((FACES_DIR / face / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return set(ast.literal_eval(node.value))
    return set()


def test_every_face_is_found() -> None:
    assert {"analyze", "demo", "deploy", "dstat", "record", "report", "serve", "watch"} <= set(
        FACES
    )


@pytest.mark.parametrize("face", FACES)
def test_a_face_imports_no_other_face(face: str) -> None:
    wrong = []
    for path in sorted((FACES_DIR / face).rglob("*.py")):
        for module, names in _imports(path):
            other = _face_of(module)
            if other is None or other[0] == face:
                continue
            to, inside = other
            allowed = to in COMPOSED_OF.get(face, set())
            if allowed and not inside and set(names) <= _public(to):
                continue  # the composed face's public names
            wrong.append(f"{path.relative_to(FACES_DIR)}: {module} {names or ''}".rstrip())
    assert not wrong, (
        f"face {face} reaches into other faces (share through gpumon/faces/*.py): {wrong}"
    )


def test_the_rule_sees_a_reach_into_another_face(tmp_path: Path) -> None:
    """The check itself: a module-level reach and a function-level one are both found."""
    sample = tmp_path / "x.py"
    sample.write_text(
        "from gpumon.faces.analyze.command import finite\n"
        "def f():\n    from gpumon.faces.serve.http import MetricsServer\n"
    )
    found = [m for m, _ in _imports(sample) if _face_of(m)]
    assert found == ["gpumon.faces.analyze.command", "gpumon.faces.serve.http"]
    assert _face_of("gpumon.faces.common") is None and "Daemon" in _public("serve")
