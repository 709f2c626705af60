"""Programs run once are compiled with XLA:CPU's optimizations off, elsewhere as JAX does."""

import jax
import jax.numpy as jnp
import numpy as np

from podrace.compile_once import RUN_ONCE_OPTIONS, compile_once


class RecordingLowered:
    def __init__(self):
        self.options = []

    def compile(self, options=None):
        self.options.append(options)
        return "compiled"


def test_options_only_on_cpu():
    on_cpu, on_gpu = RecordingLowered(), RecordingLowered()
    assert compile_once(on_cpu, "cpu") == compile_once(on_gpu, "gpu") == "compiled"
    assert on_cpu.options == [RUN_ONCE_OPTIONS] and on_gpu.options == [None]


def test_a_program_compiled_once_computes_what_jit_computes():
    def normals(key):
        return jnp.tanh(jax.random.normal(key, (16, 16)) @ jnp.ones((16, 4)))

    key = jax.random.PRNGKey(3)
    compiled = compile_once(jax.jit(normals).lower(key), "cpu")
    np.testing.assert_allclose(compiled(key), jax.jit(normals)(key), rtol=1e-5, atol=1e-6)
