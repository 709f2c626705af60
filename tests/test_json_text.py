"""JSON read from files a user can damage, and written for strict parsers."""

import json

import pytest

from podrace import json_text


@pytest.mark.timeout(10)
def test_non_finite_floats_are_written_as_null_at_any_depth():
    value = {
        "mean": float("nan"),
        "returns": [1.5, float("inf"), -float("inf")],
        "nested": {"x": (float("nan"),)},
    }
    text = json_text.dumps_strict(value, indent=2)
    assert json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} is not JSON")) == {
        "mean": None,
        "returns": [1.5, None, None],
        "nested": {"x": [None]},
    }


@pytest.mark.timeout(10)
@pytest.mark.parametrize("text", ["[" * 100_000, "1" * 5000], ids=["deep", "long-int"])
def test_undecodable_json_is_a_decode_error(text):
    with pytest.raises(json.JSONDecodeError):
        json_text.loads(text)
