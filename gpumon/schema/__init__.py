"""The published JSON Schemas of what gpumon writes.

``summary.schema.json`` is the run summary every face writes as JSON (`analyze --json`,
`watch --summary-json`, `report --json`, serve's summary log lines): a core built once in
``gpumon.engine.summary_json`` and each face's extras.  It ships in the package, so a
consumer validates against the schema of the gpumon it runs.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

SUMMARY_SCHEMA = "summary.schema.json"


def summary_schema() -> dict[str, Any]:
    """The run summary's JSON Schema (draft 2020-12), as shipped."""
    text = resources.files(__name__).joinpath(SUMMARY_SCHEMA).read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema
