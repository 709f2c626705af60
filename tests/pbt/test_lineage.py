"""RUN/pbt.jsonl: a kill can cut only its last line; a restarted member supersedes its own
later lines."""

import json

import pytest

from podrace.pbt.lineage import LINEAGE, SUPERSEDED, Lineage, read_lines


def test_only_a_torn_last_line_is_left_out(tmp_path):
    (tmp_path / LINEAGE).write_text('{"a": 1}\n{"a": 2}\n{"a"')
    assert read_lines(tmp_path) == [{"a": 1}, {"a": 2}]
    (tmp_path / LINEAGE).write_text('{"a": 1}\ngarbage\n{"a": 3}\n')
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        read_lines(tmp_path)


def test_a_restarted_member_supersedes_only_its_own_later_lines(tmp_path):
    lineage = Lineage(tmp_path)
    lines = [
        {"member": m, "member_step": s, "version": s // 10} for s in (10, 20, 30) for m in (0, 1)
    ]
    for line in lines:
        lineage.write(line)
    kept = lineage.keep_member_until(1, 20)
    assert kept == [x for x in lines if x["member"] == 1 and x["member_step"] <= 20]
    assert read_lines(tmp_path) == [x for x in lines if x["member"] == 0 or x["member_step"] <= 20]
    superseded = (tmp_path / SUPERSEDED).read_text().splitlines()
    assert [json.loads(t) for t in superseded] == [{"member": 1, "member_step": 30, "version": 3}]
