"""Publisher-side transforms."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from podrace.sync.local import LocalPublisher
from podrace.sync.transforms import cast, compose, select


def test_select_and_cast_bf16_on_the_learner_device():
    params = {"params": {"policy": {"w": jnp.ones((2, 3)), "step": jnp.array(3)}, "value": {"w": jnp.ones(4)}}}
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
