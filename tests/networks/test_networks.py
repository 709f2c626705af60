from functools import cache

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from podrace.algos.distributions import Categorical, Gaussian
from podrace.config import NetworkConfig
from podrace.networks import ActorCritic, make_network
from podrace.networks.torsos import ImpalaResNet, MinAtarCNN, NatureCNN, PatchConv
from podrace.types import EnvSpec

VECTOR_DISCRETE = EnvSpec((4,), np.float32, 2, ())
VECTOR_CONTINUOUS = EnvSpec((3,), np.float32, None, (2,))
ATARI = EnvSpec((4, 84, 84), np.uint8, 6, ())
SMALL_FRAMES = EnvSpec((4, 36, 36), np.uint8, 6, ())
MINATAR = EnvSpec((10, 10, 6), np.uint8, 4, ())


@cache
def _built(cfg: NetworkConfig, spec: EnvSpec):
    net = make_network(cfg, spec)
    params = jax.jit(net.init)(jax.random.PRNGKey(0), jnp.zeros(spec.obs_shape, spec.obs_dtype))
    return net, params


def _obs(spec, batch_shape, seed=0):
    rng = np.random.default_rng(seed)
    if spec.obs_dtype == np.uint8:
        return jnp.asarray(rng.integers(0, 256, batch_shape + spec.obs_shape, dtype=np.uint8))
    return jnp.asarray(rng.normal(size=batch_shape + spec.obs_shape).astype(np.float32))


@pytest.mark.parametrize("shared", [True, False])
def test_mlp_discrete_shapes_and_leading_dims(shared):
    net, params = _built(NetworkConfig(shared_torso=shared), VECTOR_DISCRETE)
    apply = jax.jit(net.apply)
    obs = _obs(VECTOR_DISCRETE, (5, 3))
    dist, value = apply(params, obs)
    assert (
        isinstance(dist, Categorical) and dist.logits.shape == (5, 3, 2) and value.shape == (5, 3)
    )
    flat_dist, flat_value = apply(params, obs.reshape(15, 4))
    np.testing.assert_allclose(dist.logits.reshape(15, 2), flat_dist.logits, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(value.reshape(15), flat_value, rtol=1e-6, atol=1e-6)
    single_dist, single_value = apply(params, obs[0, 0])
    assert single_dist.logits.shape == (2,) and single_value.shape == ()
    assert ("value_torso" in params["params"]) is (not shared)


def test_mlp_continuous_gaussian_head():
    net, params = _built(NetworkConfig(), VECTOR_CONTINUOUS)
    np.testing.assert_array_equal(params["params"]["log_std"], np.zeros(2))
    dist, value = jax.jit(net.apply)(params, _obs(VECTOR_CONTINUOUS, (6, 4)))
    assert isinstance(dist, Gaussian)
    assert dist.mean.shape == dist.log_std.shape == (6, 4, 2) and value.shape == (6, 4)
    actions = dist.sample(jax.random.PRNGKey(0))
    assert actions.shape == (6, 4, 2) and dist.log_prob(actions).shape == (6, 4)


def test_initial_policy_is_near_uniform():
    """Policy head init gain 0.01 keeps the initial logits tiny (CleanRL convention)."""
    net, params = _built(NetworkConfig(), VECTOR_DISCRETE)
    dist, _ = net.apply(params, _obs(VECTOR_DISCRETE, (64,)))
    assert float(jnp.max(jnp.abs(dist.logits))) < 0.1
    kernel = np.asarray(params["params"]["policy_head"]["kernel"])  # orthogonal columns, norm 0.01
    np.testing.assert_allclose(np.linalg.norm(kernel, axis=0), 0.01, rtol=1e-4)
    value_kernel = np.asarray(params["params"]["value_head"]["kernel"])
    np.testing.assert_allclose(np.linalg.norm(value_kernel), 1.0, rtol=1e-4)


@pytest.mark.parametrize("torso,width", [("nature_cnn", 512), ("impala_resnet", 256)])
def test_cnn_torsos_on_uint8_atari_frames(torso, width):
    net, params = _built(NetworkConfig(torso=torso, hidden_sizes=(width,)), ATARI)
    apply = jax.jit(net.apply)
    obs = _obs(ATARI, (2, 3))  # [T, B, 4, 84, 84] uint8
    dist, value = apply(params, obs)
    assert dist.logits.shape == (2, 3, 6) and value.shape == (2, 3)
    assert bool(jnp.all(jnp.isfinite(value)))
    flat_dist, _ = apply(params, obs.reshape((6,) + ATARI.obs_shape))
    np.testing.assert_allclose(dist.logits.reshape(6, 6), flat_dist.logits, rtol=1e-5, atol=1e-6)
    assert params["params"]["torso"]["Dense_0"]["kernel"].shape[-1] == width
    assert "value_torso" not in params["params"]


def test_nature_cnn_scales_and_transposes_frames():
    """Recompute NatureCNN by hand on obs/255 in NHWC: catches a missing scale or a wrong layout."""
    obs = _obs(ATARI, (2,), seed=1)
    module = NatureCNN()
    params = jax.jit(module.init)(jax.random.PRNGKey(0), obs)["params"]
    x = jnp.transpose(obs.astype(jnp.float32) / 255.0, (0, 2, 3, 1))
    for i, stride in enumerate((4, 2, 1)):
        conv = params[f"Conv_{i}"]
        x = jax.lax.conv_general_dilated(
            x, conv["kernel"], (stride, stride), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        x = jax.nn.relu(x + conv["bias"])
    assert x.shape == (2, 7, 7, 64)
    expected = jax.nn.relu(
        x.reshape(2, -1) @ params["Dense_0"]["kernel"] + params["Dense_0"]["bias"]
    )
    np.testing.assert_allclose(
        module.apply({"params": params}, obs), expected, rtol=1e-4, atol=1e-5
    )


def test_image_torsos_take_float_observations_as_they_are():
    """Standardized observations (--normalize.obs) are not divided by 255 a second time.
    Frames of 36x36, the least Nature CNN takes: the scaling does not depend on the size."""
    frames = _obs(SMALL_FRAMES, (2,), seed=2)
    standardized = (frames.astype(jnp.float32) - 128.0) / 64.0
    for module in (NatureCNN(), ImpalaResNet()):
        params = jax.jit(module.init)(jax.random.PRNGKey(0), frames)
        apply = jax.jit(module.apply)
        scaled = apply(params, frames)
        np.testing.assert_allclose(
            apply(params, frames.astype(jnp.float32) / 255.0), scaled, rtol=1e-5, atol=1e-6
        )
        assert not np.allclose(apply(params, standardized), apply(params, standardized / 255.0))


def test_impala_resnet_structure():
    obs = _obs(ATARI, (1,))
    params = jax.jit(ImpalaResNet().init)(jax.random.PRNGKey(0), obs)["params"]
    stem = [params[f"Conv_{i}"]["kernel"].shape for i in range(3)]
    assert stem == [(3, 3, 4, 16), (3, 3, 16, 32), (3, 3, 32, 32)]
    assert sum(name.startswith("ResidualBlock") for name in params) == 6
    # 84 -> 42 -> 21 -> 11 after three stride-2 SAME max-pools.
    assert params["Dense_0"]["kernel"].shape == (11 * 11 * 32, 256)


def test_wrong_observation_shape_is_rejected():
    net, params = _built(NetworkConfig(), VECTOR_DISCRETE)
    with pytest.raises(ValueError, match="does not end with"):
        net.apply(params, jnp.zeros((2, 5)))


def test_make_network_heads():
    assert isinstance(make_network(NetworkConfig(), VECTOR_DISCRETE), ActorCritic)
    assert make_network(NetworkConfig(), VECTOR_DISCRETE).num_actions == 2
    assert make_network(NetworkConfig(), VECTOR_CONTINUOUS).action_dim == 2
    with pytest.raises(ValueError):
        make_network(NetworkConfig(), EnvSpec((3,), np.float32, None, (2, 2)))


def _planes(batch: int, channels: int, seed: int = 0) -> jax.Array:
    """MinAtar observations: [N, 10, 10, C] uint8 0/1."""
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.integers(0, 2, (batch, 10, 10, channels), dtype=np.uint8))


def test_minatar_cnn_is_the_papers_network_on_channels_last_planes():
    """One 3x3 conv of 16 (stride 1, no padding: 10x10 -> 8x8), 128 dense units, recomputed
    by hand on the planes as they are (0/1, channels last, not scaled by 1/255)."""
    obs = _planes(3, 6, seed=1)
    module = MinAtarCNN()
    params = jax.jit(module.init)(jax.random.PRNGKey(0), obs)["params"]
    assert params["Conv_0"]["kernel"].shape == (3, 3, 6, 16)
    assert params["Dense_0"]["kernel"].shape == (8 * 8 * 16, 128)
    x = jax.lax.conv_general_dilated(
        obs.astype(jnp.float32),
        params["Conv_0"]["kernel"],
        (1, 1),
        "VALID",
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )
    x = jax.nn.relu(x + params["Conv_0"]["bias"]).reshape(3, -1)
    expected = jax.nn.relu(x @ params["Dense_0"]["kernel"] + params["Dense_0"]["bias"])
    features = module.apply({"params": params}, obs)
    assert features.shape == (3, 128) and features.dtype == jnp.float32
    np.testing.assert_allclose(features, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(
        module.apply({"params": params}, obs.astype(bool)), features, rtol=1e-6
    )


def test_minatar_cnn_in_an_actor_critic():
    net, params = _built(
        NetworkConfig(torso="minatar_cnn", hidden_sizes=(128,), activation="relu"), MINATAR
    )
    dist, value = jax.jit(net.apply)(params, _planes(10, 6).reshape(2, 5, 10, 10, 6))
    assert dist.logits.shape == (2, 5, 4) and value.shape == (2, 5)
    assert dist.logits.dtype == jnp.float32 and value.dtype == jnp.float32
    assert "value_torso" not in params["params"]


def test_minatar_cnn_refuses_observations_without_planes():
    with pytest.raises(ValueError, match=r"expects \[N, H, W, C\] observations"):
        MinAtarCNN().init(jax.random.PRNGKey(0), jnp.zeros((2, 400), jnp.uint8))


@pytest.mark.parametrize("shape, kernel", [((2, 10, 10, 4), 3), ((3, 7, 9, 2), 2)])
def test_patch_conv_is_nn_conv_with_the_same_parameters(shape, kernel):
    """Same parameter tree and initial values as flax's unpadded stride-1 `nn.Conv`, the
    same outputs and the same gradients."""
    x = jax.random.normal(jax.random.PRNGKey(3), shape)
    conv = nn.Conv(
        8, (kernel, kernel), padding="VALID", kernel_init=nn.initializers.orthogonal(np.sqrt(2))
    )
    patch = PatchConv(8, kernel)
    params = conv.init(jax.random.PRNGKey(0), x)
    assert jax.tree.map(np.shape, patch.init(jax.random.PRNGKey(0), x)) == jax.tree.map(
        np.shape, params
    )
    np.testing.assert_array_equal(
        patch.init(jax.random.PRNGKey(0), x)["params"]["kernel"], params["params"]["kernel"]
    )
    np.testing.assert_allclose(patch.apply(params, x), conv.apply(params, x), atol=1e-5)
    grads = [jax.grad(lambda p, m=m: (m.apply(p, x) ** 2).sum())(params) for m in (patch, conv)]
    for a, b in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1])):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
