"""What a newcomer and an admin meet first: a mistyped option answered with the command's
own usage and the option meant, a file that is no log said so in one sentence, `record`
saying what it records, and the exporter conventions operators type without thinking
(`serve --log.format`, `serve --version`, `gpumon completion`).

Each case is the real CLI in a subprocess (the fake NVML where a GPU is read); completion
scripts run in a real bash.
"""

from __future__ import annotations

import gzip
import json
import re
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli import gpumon, one_sentence
from test_serve_daemon import free_port, start_daemon
from test_serve_http import wait_sampled

from gpumon import __version__

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10"


def usage_and_error(stderr: str) -> tuple[str, str]:
    """argparse's answer: the usage (first line) and the error line (last)."""
    lines = stderr.strip().splitlines()
    assert lines[0].startswith("usage: ") and "Traceback" not in stderr, stderr
    return lines[0], lines[-1]


# --------------------------------------------------------------------------- unknown options
@pytest.mark.parametrize(
    ("args", "command", "error"),
    [
        # A close spelling: the option meant.
        (["analyze", "--jsn", "x.csv"], "analyze", "--jsn (did you mean --json?)"),
        # Another exporter's name for it: gpumon's.
        (
            ["serve", "--port", "9977"],
            "serve",
            "--port 9977 (use --web.listen-address HOST:PORT, or :PORT for every address)",
        ),
        # A command within a command: the inner one's usage.
        (["dstat", "install", "--dooll"], "dstat install", "--dooll (did you mean --dool?)"),
    ],
)
def test_an_unknown_option_gets_the_commands_usage_and_the_option_meant(
    args: list[str], command: str, error: str
) -> None:
    r = gpumon(None, *args)
    assert r.returncode == 2
    usage, said = usage_and_error(r.stderr)
    assert usage.startswith(f"usage: gpumon {command} ")
    assert said == f"gpumon {command}: error: unrecognized arguments: {error}"


# --------------------------------------------------------------------------- analyze FILE
def test_a_file_that_is_no_log_is_said_so_in_one_sentence(tmp_path: Path) -> None:
    cases = {
        "empty.csv": (b"", "is empty: there is nothing to analyse."),
        "blank.csv": (b"  \n\n", "is blank: there is nothing to analyse."),
        "shot.png": (PNG, "is a PNG image, not a log"),
        "shot.png.gz": (gzip.compress(PNG), "is a PNG image, not a log"),
        "blob.bin": (
            b"\x00\x01\x02\x03abcd" * 10,
            "is binary data (it starts with the bytes 00 01",
        ),
    }
    for name, (data, said) in cases.items():
        (tmp_path / name).write_bytes(data)
        r = gpumon(None, "analyze", str(tmp_path / name))
        assert r.returncode == 2, (name, r.stderr)
        line = one_sentence(r.stderr)
        assert line.startswith(f"gpumon: {tmp_path / name} {said}"), line
        short = len(line) - len(str(tmp_path / name)) < 160
        assert short and "Tried:" not in line and "\ufffd" not in line, line


def test_text_in_no_format_still_lists_the_formats_tried(tmp_path: Path) -> None:
    junk = tmp_path / "junk.txt"
    junk.write_text("hello world\n")
    r = gpumon(None, "analyze", str(junk))
    assert r.returncode == 2 and "Tried:" in one_sentence(r.stderr)


def test_a_missing_file_or_a_folder_is_a_usage_error(tmp_path: Path) -> None:
    r = gpumon(None, "analyze", str(tmp_path / "nope.csv"))
    assert r.returncode == 2
    assert one_sentence(r.stderr) == f"gpumon: {tmp_path / 'nope.csv'}: no such file."
    r = gpumon(None, "analyze", str(tmp_path))
    assert r.returncode == 2
    assert (
        one_sentence(r.stderr) == f"gpumon: {tmp_path} is a folder: name a trace or log file in it."
    )


# --------------------------------------------------------------------------- record
@pytest.mark.slow
def test_record_says_what_it_records_and_how_it_stops(fake_nvml, tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpumon", "record", "-o", str(out), "--interval", "0.2"],
        env=fake_nvml.env,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    # Said while it records (a bounded wait: a gpumon that says nothing must fail, not hang).
    said, _, _ = select.select([proc.stderr], [], [], 30)
    first = proc.stderr.readline() if said else ""
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=30)[1]
    assert proc.returncode == 0, rest
    assert first == (
        f"gpumon: recording 1 GPU(s), the host to {out} every 0.2 s; it stops on Ctrl-C, "
        "keeping every tick written.\n"
    )
    assert re.search(r"gpumon: wrote \d+ ticks to ", rest), rest


# --------------------------------------------------------------------------- serve
def test_serve_version_is_worded_as_node_exporters() -> None:
    r = gpumon(None, "serve", "--version")
    assert r.returncode == 0, r.stderr
    first, *rest = r.stdout.splitlines()
    assert re.fullmatch(
        rf"gpumon serve, version {re.escape(__version__)} \(revision: ([0-9a-f]{{40}}|unknown)\)",
        first,
    ), first
    assert [ln.split(":")[0] for ln in rest] == ["  python version", "  platform"]


def logfmt(line: str) -> dict[str, str]:
    """One logfmt line: key=bare or key="quoted \\"json\\" string"."""
    out = {}
    for m in re.finditer(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', line):
        value = m.group(2)
        out[m.group(1)] = json.loads(value) if value.startswith('"') else value
    return out


@pytest.mark.slow
def test_serve_log_format_json_and_logfmt(fake_nvml, tmp_path: Path) -> None:
    """Every line serve says is one JSON object, or one logfmt line: start, warning, stop."""
    parsers = {"json": json.loads, "logfmt": logfmt}
    for fmt, parse in parsers.items():
        # Beyond loopback (the later flag wins over the helper's): the exposure warning too.
        port = free_port()
        d = start_daemon(
            fake_nvml.env, tmp_path, "--log.format", fmt,
            "--web.listen-address", f"0.0.0.0:{port}", wait=False,
        )  # fmt: skip
        d.port = port
        try:
            wait_sampled(d)
        finally:
            assert d.stop() == 0, d.stderr_text
        records = [parse(ln) for ln in d.stderr_text.splitlines()]
        assert records and all(set(r) == {"time", "level", "msg"} for r in records), records
        assert all(
            re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", r["time"]) for r in records
        )
        first, last = records[0], records[-1]
        assert first["level"] == "INFO" and first["msg"].startswith("serving 1 GPU(s) on "), first
        assert last["level"] == "INFO" and last["msg"].startswith("stopped (signal SIGTERM)"), last
        assert any(r["level"] == "WARN" and r["msg"].startswith("serving on ") for r in records)
    # The error that ends it too, with its status.
    r = gpumon(
        fake_nvml.env, "serve", "--log.format", "json", "--config", str(tmp_path / "no.toml")
    )
    assert r.returncode == 2
    (line,) = r.stderr.splitlines()
    assert json.loads(line)["level"] == "ERROR"
    assert json.loads(line)["msg"] == f"{tmp_path / 'no.toml'}: no such configuration file."


# --------------------------------------------------------------------------- completion
def bash_complete(script: Path, *words: str) -> list[str]:
    """What bash offers for the last word of ``gpumon WORDS``, by the script's function."""
    line = " ".join(["gpumon", *words])
    code = (
        f"source {script}\n"
        f"COMP_WORDS=(gpumon {' '.join(repr(w) for w in words)}); COMP_CWORD={len(words)}\n"
        f"COMP_LINE={line!r}; COMP_POINT={len(line)}\n"
        f"_shtab_gpumon gpumon {words[-1]!r} {(['gpumon', *words])[-2]!r}\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    res = subprocess.run(["bash", "--norc", "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return res.stdout.split()


def test_bash_completion_offers_commands_options_and_choices(tmp_path: Path) -> None:
    pytest.importorskip(
        "shtab", reason="shtab not installed (pip install 'gpumon-why[completion]')"
    )
    if shutil.which("bash") is None:
        pytest.skip("bash not installed")
    r = gpumon(None, "completion", "bash")
    assert r.returncode == 0, r.stderr
    script = tmp_path / "gpumon.bash"
    script.write_text(r.stdout)
    assert bash_complete(script, "se") == ["serve"]
    assert "--json" in bash_complete(script, "analyze", "--js")
    assert bash_complete(script, "serve", "--log.format", "") == ["logfmt", "json"]
    assert bash_complete(script, "completion", "") == ["bash", "zsh"]


def test_zsh_completion_is_a_compdef_for_gpumon(tmp_path: Path) -> None:
    pytest.importorskip(
        "shtab", reason="shtab not installed (pip install 'gpumon-why[completion]')"
    )
    r = gpumon(None, "completion", "zsh")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("#compdef gpumon")
    for command in ("watch", "analyze", "serve", "report", "deploy", "completion"):
        assert command in r.stdout
    zsh = shutil.which("zsh")
    if zsh is None:
        pytest.skip("zsh not installed: the script's syntax is not checked")
    script = tmp_path / "_gpumon"
    script.write_text(r.stdout)
    res = subprocess.run([zsh, "-n", str(script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_completion_without_shtab_says_how_to_get_it() -> None:
    code = (
        "import sys; sys.modules['shtab'] = None\n"  # as where shtab is not installed
        "from gpumon.cli import main; raise SystemExit(main(['completion', 'bash']))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 1
    assert one_sentence(r.stderr) == (
        "gpumon: shell completion needs shtab: pip install 'gpumon-why[completion]'."
    )
    assert r.stdout == ""


# --------------------------------------------------------------------------- the README
def test_the_readmes_dstat_command_asks_for_the_bands_its_output_shows() -> None:
    """dstat shows one band per GPU (gpu0, gpu1) only with -f; without it, total-gpu."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("### `dstat --gpu`", 1)[1].split("\n### ", 1)[0]
    commands, output = re.findall(r"```(?:sh)?\n(.*?)```", section, flags=re.S)[:2]
    per_gpu = "-gpu0-" in output
    for line in commands.splitlines():
        shown = line.split("#", 1)[0].split("&&")[-1].split()
        assert ("-f" in shown) == per_gpu, line
