"""gpumon as a library: ``import gpumon`` offers the engine, the data model and the errors,
typed (py.typed), cheap to import, and the README's library example runs as written."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import gpumon

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "gpumon" / "data" / "demo-synthetic.jsonl.gz"


def test_every_public_name_resolves_and_is_listed() -> None:
    assert "__version__" in gpumon.__all__
    for name in gpumon.__all__:
        assert getattr(gpumon, name) is not None, name
        assert name in dir(gpumon)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        gpumon.nope  # noqa: B018


def test_importing_gpumon_loads_nothing_until_a_name_is_used() -> None:
    """The dstat plugin and the CLI import gpumon first: it must stay cheap."""
    code = (
        "import json, sys, gpumon\n"
        "before = sorted(m for m in sys.modules if m.startswith('gpumon.'))\n"
        "gpumon.Session\n"
        "after = 'gpumon.engine.session' in sys.modules\n"
        "print(json.dumps([before, after]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, after = json.loads(out.stdout)
    assert before == [] and after is True


def test_the_package_says_it_is_typed() -> None:
    assert (Path(gpumon.__file__).parent / "py.typed").is_file()


def test_a_trace_is_judged_in_a_few_lines() -> None:
    with gpumon.open_trace(str(DEMO)) as trace:
        result = gpumon.analyze(trace.header, trace)
    assert isinstance(result, gpumon.Analysis)
    assert result.summary.verdict is gpumon.State.STARVED
    assert result.summary.cause in (gpumon.Cause.CPU, gpumon.Cause.GIL)
    assert result.summary.advice and len(result.gpus) == 2


def test_the_readmes_library_example_runs_as_written(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```python\n(import gpumon\n.*?)```", readme, re.S)
    assert block is not None, "README: a ```python block starting with 'import gpumon'"
    code = block.group(1)
    assert len([ln for ln in code.splitlines() if ln.strip()]) <= 6
    src = code.replace('"run.csv"', repr(str(DEMO)))
    out = subprocess.run(
        [sys.executable, "-c", src], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "starved" in out.stdout
    assert any(ln.startswith(f"{lv}: ") for ln in out.stdout.splitlines() for lv in gpumon.Lever)


def test_errors_carry_their_fields() -> None:
    with pytest.raises(gpumon.ProcessGoneError) as gone:
        gpumon.Session.live(gpumon.LiveOptions(pid=2**22 + 12345))
    assert gone.value.pid == 2**22 + 12345
    not_a_trace = ROOT / "docs" / "library.md"
    with pytest.raises(gpumon.TraceFormatError) as bad, gpumon.open_trace(str(not_a_trace)):
        pass
    assert bad.value.path is not None and bad.value.path.endswith("library.md")
    err = gpumon.NoDriverError("cannot read GPUs: no driver.", nvml_code=12)
    assert err.nvml_code == 12 and str(err) == "cannot read GPUs: no driver."


def test_no_driver_names_nvmls_code(tmp_path: Path) -> None:
    from fakenvml import missing_library_env

    code = (
        "import gpumon\n"
        "try:\n"
        "    gpumon.Session.live()\n"
        "except gpumon.NoDriverError as e:\n"
        "    print(e.nvml_code)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=missing_library_env(),
        timeout=60,
    )
    assert out.stdout.strip() == "12", (out.stdout, out.stderr)  # NVML_ERROR_LIBRARY_NOT_FOUND


@pytest.mark.slow
def test_the_docs_live_example_runs_as_written_and_ends_with_a_verdict(
    fake_nvml, tmp_path: Path
) -> None:
    """docs/library.md's live loop, on the fake NVML, watching a process that holds the
    fake GPU: its ticks are paced, so the run it watches is judged (not `unknown`)."""
    from fakenvml import FakeGPU, Process, Scenario

    doc = (ROOT / "docs" / "library.md").read_text(encoding="utf-8")
    block = re.search(
        r"```python\n(import gpumon\n\nsession = gpumon\.Session\.live.*?)```", doc, re.S
    )
    assert block is not None, "docs/library.md: the live example"
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        fake_nvml.set(Scenario(gpus=[FakeGPU(processes=[Process(job.pid)])]))
        code = block.group(1).replace("pid=1234", f"pid={job.pid}")
        assert code != block.group(1)
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=fake_nvml.env,
            timeout=300,
        )
    finally:
        job.kill()
        job.wait()
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert len(lines) == 21, out.stdout  # a state per tick, then the run's verdict
    assert lines[-1] == "healthy", out.stdout
    assert "healthy" in lines[:-1], out.stdout  # judged while it ran, too
