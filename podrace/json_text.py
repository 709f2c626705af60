"""JSON from files a user can damage (config.json, metrics.jsonl, checkpoint manifests).

`json.loads` raises RecursionError, not a JSONDecodeError, on nesting deeper than the
interpreter's recursion limit: every reader here turns a JSONDecodeError into one clear line,
so too deep a nesting is made one too.
"""

from __future__ import annotations

import json
from typing import Any


def loads(data: str | bytes) -> Any:
    """`json.loads`, with nesting too deep to decode raised as a `json.JSONDecodeError`."""
    try:
        return json.loads(data)
    except RecursionError:
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        raise json.JSONDecodeError("nested too deeply to decode", text[:80], 0) from None
