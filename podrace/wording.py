"""Counts in messages, worded as a reader says them: '1 time', '2 times'."""

from __future__ import annotations


def counted(count: int, noun: str) -> str:
    """`count` and `noun`, plural unless the count is one: '1 episode', '3 episodes'."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def times(count: int) -> str:
    """'1 time', '2 times', '0 times'."""
    return counted(count, "time")


__all__ = ["counted", "times"]
