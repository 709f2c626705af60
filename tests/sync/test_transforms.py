"""Publisher-side transforms."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from podrace.sync.local import LocalPublisher
from podrace.sync.transforms import cast, compose, select

pytestmark = pytest.mark.timeout(60)


def test_select_and_cast_bf16_on_the_learner_device():
    params = {
        "params": {
            "policy": {"w": jnp.ones((2, 3)), "step": jnp.array(3)},
            "value": {"w": jnp.ones(4)},
        }
    }
    pub = LocalPublisher(transform=compose(select("params", "policy"), cast(jnp.bfloat16)))
    sub = pub.subscribe(jax.devices()[1])
    pub.publish(params)
    got = sub.get(0).params
    assert set(got) == {"w", "step"}
    assert got["w"].dtype == jnp.bfloat16 and got["step"].dtype == jnp.int32
    assert got["w"].devices() == {jax.devices()[1]}
    pub.close()


def test_select_by_index_and_attribute():
    class State:
        params = ({"a": np.zeros(2)}, {"b": np.ones(1)})

    assert select("params", 1, "b")(State())[0] == 1.0
    assert cast(np.float16, floating_only=False)({"i": np.arange(2)})["i"].dtype == np.float16


def test_cast_handles_python_scalar_leaves():
    out = cast(np.float16)({"lr": 0.5, "step": 3, "w": np.ones(2)})
    assert np.asarray(out["lr"]).dtype == np.float16 and float(out["lr"]) == 0.5
    assert out["step"] == 3 and out["w"].dtype == np.float16
    assert (
        np.asarray(cast(np.float16, floating_only=False)({"step": 3})["step"]).dtype == np.float16
    )
