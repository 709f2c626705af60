"""Counts in messages, worded as a reader says them."""

from __future__ import annotations


def times(count: int) -> str:
    """'1 time', '2 times', '0 times'."""
    return f"{count} time" if count == 1 else f"{count} times"


__all__ = ["times"]
