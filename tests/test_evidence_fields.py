"""The one table of evidence fields (gpumon/evidence_fields.py) and everything that must
agree with it: the types mypy needs spelled out (``Evidence``, ``EvidenceKey``,
``HostKey``), the words every face prints, and the docs' table.

``python3 tests/test_evidence_fields.py --write`` rewrites the docs' table from the code.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import get_args

import pytest

from gpumon.detect.host import KEYS, HostKey
from gpumon.engine.words import EVIDENCE, QUIET_EVIDENCE, evidence_items, evidence_line
from gpumon.evidence_fields import EVIDENCE_FIELDS, EvidenceField, EvidenceFormat
from gpumon.model import Evidence, EvidenceKey

DOCS = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
BEGIN = "<!-- evidence fields: begin (written from gpumon/evidence_fields.py) -->\n"
END = "<!-- evidence fields: end -->\n"

NAMES = [f.name for f in EVIDENCE_FIELDS]
WORDED = [f for f in EVIDENCE_FIELDS if f.label is not None]

# A value of each format, and how people read it.
SAMPLES: dict[EvidenceFormat, tuple[object, str]] = {
    "ratio": (0.41, "41%"),
    "pct": (87.0, "87%"),
    "s": (0.84, "840ms"),
    "W": (212.4, "212 W"),
    "bytes": (2048, "2.0 KiB"),
    "Bps": (3 * 1024 * 1024, "3.0 MiB/s"),
    "int": (3, "3"),
    "f2": (1.5, "1.50"),
    "f1": (2.25, "2.2"),
    "gpu": (1, "GPU 1"),
    "act": ("loader_wait", "waiting on the loader"),
    "text": ("train.py:42 step", "train.py:42 step"),
}


def test_the_table_names_each_key_once() -> None:
    assert len(NAMES) == len(set(NAMES)), [n for n in NAMES if NAMES.count(n) > 1]


def test_the_types_hold_the_tables_keys() -> None:
    """mypy needs the keys written out; the table is the list they must match."""
    typed = Evidence.__required_keys__ | Evidence.__optional_keys__
    assert set(NAMES) == typed, set(NAMES) ^ typed
    assert set(NAMES) == set(get_args(EvidenceKey)), set(NAMES) ^ set(get_args(EvidenceKey))


def test_host_keys_are_the_tables_gap_means() -> None:
    marked = {f.name for f in EVIDENCE_FIELDS if f.host_window}
    assert set(get_args(HostKey)) == marked == set(KEYS)
    assert all(f.group == "host" for f in EVIDENCE_FIELDS if f.host_window)


def test_every_field_is_worded_or_kept_for_machines() -> None:
    """Words come from the table: a key neither worded nor kept quiet printed as its raw
    name (four did: the pauses' rhythm and the job's runnable processes)."""
    assert {k for k, _, _ in EVIDENCE} | QUIET_EVIDENCE == set(NAMES)
    assert not {k for k, _, _ in EVIDENCE} & QUIET_EVIDENCE
    for f in WORDED:
        assert f.label and not re.search(r"\w_\w", f.label), f"{f.name}: label {f.label!r}"


@pytest.mark.parametrize("field", WORDED, ids=lambda f: f.name)
def test_each_worded_field_prints_its_label_and_its_value_in_words(field: EvidenceField) -> None:
    """What watch shows (chips) and report and analyze print (a line), for each key."""
    value, words = SAMPLES[field.fmt]
    ev = {field.name: value}
    assert evidence_items(ev) == [(field.label, words)]
    assert evidence_line(ev) == f"{field.label} {words}"


def test_a_whole_evidence_prints_no_raw_name() -> None:
    """Every key at once, as a face gets them: each worded, in the table's order."""
    ev = {f.name: SAMPLES[f.fmt][0] for f in EVIDENCE_FIELDS}
    items = evidence_items(ev)
    assert [label for label, _ in items] == [f.label for f in WORDED]
    shown = " ".join(f"{label} {value}" for label, value in items) + evidence_line(ev)
    raw = {n for n in NAMES if n in shown and "_" in n}
    assert not raw, f"printed as raw names: {sorted(raw)}"


def test_quiet_fields_stay_out_of_the_words() -> None:
    ev = {f.name: SAMPLES[f.fmt][0] for f in EVIDENCE_FIELDS if f.label is None}
    assert evidence_items(ev) == [] and evidence_line(ev) == ""


def docs_table() -> str:
    """The table of evidence fields in Markdown, as docs/cli.md shows it."""
    rows = ["| Key | Unit | Shown as | About | Meaning |", "|---|---|---|---|---|"]
    for f in EVIDENCE_FIELDS:
        shown = f.label if f.label is not None else "(JSON and log only)"
        rows.append(f"| `{f.name}` | {f.unit} | {shown} | {f.group} | {f.description} |")
    return "\n".join(rows) + "\n"


def docs_with_table(text: str) -> str:
    head, sep, rest = text.partition(BEGIN)
    assert sep, f"docs/cli.md lost its marker {BEGIN.strip()}"
    _, sep, tail = rest.partition(END)
    assert sep, f"docs/cli.md lost its marker {END.strip()}"
    return head + BEGIN + docs_table() + END + tail


def test_the_docs_table_is_the_tables() -> None:
    text = DOCS.read_text()
    assert text == docs_with_table(text), (
        "docs/cli.md's table of evidence differs from gpumon/evidence_fields.py: "
        "run python3 tests/test_evidence_fields.py --write"
    )


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python3 tests/test_evidence_fields.py --write")
    DOCS.write_text(docs_with_table(DOCS.read_text()))
