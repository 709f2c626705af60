"""Reading RUN/pbt.jsonl: a kill can cut only its last line."""

import pytest

from podrace.pbt.lineage import LINEAGE, read_lines


def test_only_a_torn_last_line_is_left_out(tmp_path):
    (tmp_path / LINEAGE).write_text('{"a": 1}\n{"a": 2}\n{"a"')
    assert read_lines(tmp_path) == [{"a": 1}, {"a": 2}]
    (tmp_path / LINEAGE).write_text('{"a": 1}\ngarbage\n{"a": 3}\n')
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        read_lines(tmp_path)
