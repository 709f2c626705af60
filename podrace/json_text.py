"""JSON from files a user can damage (config.json, metrics.jsonl, checkpoint manifests),
and JSON for results that strict parsers read.

`json.loads` raises RecursionError on nesting deeper than the interpreter's recursion limit
and a plain ValueError on an integer too long to convert, not a JSONDecodeError: every
reader here turns a JSONDecodeError into one clear line, so these are made one too.
"""

from __future__ import annotations

import json
import math
from typing import Any


def loads(data: str | bytes) -> Any:
    """`json.loads`; nesting too deep to decode, or an integer longer than Python converts
    (4300 digits), is raised as a `json.JSONDecodeError` too."""
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise
    except (RecursionError, ValueError) as error:
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        what = (
            "nested too deeply to decode"
            if isinstance(error, RecursionError)
            else str(error).split(";")[0]
        )
        raise json.JSONDecodeError(what, text[:80], 0) from None


def dumps_strict(value: Any, **kwargs: Any) -> str:
    """`json.dumps` with every non-finite float written as null: Python's NaN and Infinity
    are not JSON, and strict parsers (jq, JavaScript, most languages) reject the file."""
    return json.dumps(_finite_or_null(value), allow_nan=False, **kwargs)


def _finite_or_null(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_null(v) for v in value]
    return value
