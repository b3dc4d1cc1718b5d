"""Kept job reports on data: the AdminComment encoding, the file per job, what is refused.
(tests/test_report_cluster.py keeps and reads them back against a real Prometheus.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpumon.faces.report.kept import (
    COMMENT_PREFIX,
    FileStore,
    Kept,
    decode_comment,
    encode_comment,
    from_record,
    valid_job_id,
)

KEPT = Kept(
    "81423", 1_780_000_000.5, "http://prometheus:9090", "Verdict: STARVED\n", {"job": "81423"}
)


def test_the_admincomment_carries_the_report_and_reads_back() -> None:
    comment = encode_comment(KEPT)
    assert comment.startswith(COMMENT_PREFIX) and " " not in comment  # one scontrol word
    back = decode_comment(comment, "here")
    assert back is not None and back.to_record() == KEPT.to_record() and back.where == "here"


@pytest.mark.parametrize(
    "comment",
    ["", "JS1:H4sIAAAAAAAAA6tWSs7PS0lNLlGyUlAqS8wpTtVRSs5ILC4uzUkFCQIA", "an admin's note",
     COMMENT_PREFIX + "not base64!", COMMENT_PREFIX + "aGVsbG8="],
)  # fmt: skip
def test_another_tools_comment_or_a_damaged_one_is_no_report(comment: str) -> None:
    assert decode_comment(comment, "here") is None


def test_a_record_of_another_format_or_version_is_not_read() -> None:
    rec = KEPT.to_record()
    assert from_record(rec, "x") is not None
    assert from_record({**rec, "version": 2}, "x") is None
    assert from_record({**rec, "format": "jobstats"}, "x") is None
    assert from_record({**rec, "report": "text"}, "x") is None
    assert from_record([rec], "x") is None


def test_the_file_store_writes_one_readable_file_per_job(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "reports")
    where = store.write(KEPT)
    assert where == str(tmp_path / "reports" / "81423.json")
    assert Path(where).stat().st_mode & 0o777 == 0o644
    assert json.loads(Path(where).read_text())["job"] == "81423"
    read = store.read("81423")
    assert read is not None and read.text == KEPT.text and read.where == where
    assert store.read("81424") is None
    Path(where).write_text("{half")
    assert store.read("81423") is None  # damaged: Prometheus is asked instead
    assert [p.name for p in (tmp_path / "reports").iterdir()] == ["81423.json"]  # no temp left


@pytest.mark.parametrize(
    ("job", "ok"),
    [("81423", True), ("81423_7", True), ("81423+1", True), ("../etc/passwd", False),
     ("", False), ("81423.json", False), ("-1", False)],
)  # fmt: skip
def test_only_slurm_job_ids_name_a_kept_file(job: str, ok: bool) -> None:
    assert valid_job_id(job) is ok
