"""The report's JSON Schema (hartonomous/schemas/report.schema.json) and validation against it."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources


@lru_cache(maxsize=1)
def report_schema() -> dict:
    return json.loads(resources.files("hartonomous").joinpath("schemas/report.schema.json").read_text("utf-8"))


def validate_report(report: dict) -> None:
    """Raise jsonschema.ValidationError when the report does not match the schema."""
    import jsonschema

    jsonschema.Draft202012Validator(report_schema()).validate(report)


def schema_errors(report: dict) -> list[str]:
    """Every mismatch as 'path: message' (empty when the report is valid)."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(report_schema())
    return [f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
            for e in sorted(validator.iter_errors(report), key=lambda e: list(map(str, e.absolute_path)))]
