"""Feature extractors. Each maps a flat batch [N, *obs_shape] to features [N, F].

Image torsos take envpool's uint8 [N, C, H, W] (frame stack as channels), scale to
[0, 1] float32 and transpose to NHWC themselves, so actors can ship raw uint8 frames.
The MinAtar torso takes [N, H, W, C] planes of 0/1 as they are (no scaling).
Weights use orthogonal init with gain sqrt(2) and zero biases, as in CleanRL (except the
residual branches, see ResidualBlock).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

TORSO_GAIN = math.sqrt(2.0)
ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {"tanh": nn.tanh, "relu": nn.relu}


def _dense(features: int, gain: float = TORSO_GAIN, name: str | None = None) -> nn.Dense:
    return nn.Dense(
        features,
        kernel_init=nn.initializers.orthogonal(gain),
        bias_init=nn.initializers.zeros,
        name=name,
    )


def _conv(
    features: int, kernel: int, stride: int = 1, padding: str = "VALID", gain: float = TORSO_GAIN
) -> nn.Conv:
    return nn.Conv(
        features,
        (kernel, kernel),
        (stride, stride),
        padding=padding,
        kernel_init=nn.initializers.orthogonal(gain),
        bias_init=nn.initializers.zeros,
    )


def _image_to_nhwc(obs: jax.Array) -> jax.Array:
    """[N, C, H, W] -> float32 [N, H, W, C]: integer pixels scaled to [0, 1]; float
    observations (those --normalize.obs has standardized, or an env's own floats) as they are."""
    if obs.ndim != 4:
        raise ValueError(f"image torsos expect [N, C, H, W] observations, got shape {obs.shape}")
    x = obs.astype(jnp.float32)
    if jnp.issubdtype(obs.dtype, jnp.integer):
        x = x / 255.0
    return jnp.transpose(x, (0, 2, 3, 1))


def _dense_stack(x: jax.Array, sizes: Sequence[int], activation) -> jax.Array:
    for size in sizes:
        x = activation(_dense(size)(x))
    return x


class MLP(nn.Module):
    """Dense layers over the flattened observation."""

    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = obs.reshape((obs.shape[0], -1)).astype(jnp.float32)
        return _dense_stack(x, self.hidden_sizes, ACTIVATIONS[self.activation])


class NatureCNN(nn.Module):
    """DQN Nature conv stack (32-8x8/4, 64-4x4/2, 64-3x3/1), then dense relu layers."""

    dense_sizes: Sequence[int] = (512,)

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = _image_to_nhwc(obs)
        for features, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
            x = nn.relu(_conv(features, kernel, stride)(x))
        x = x.reshape((x.shape[0], -1))
        return _dense_stack(x, self.dense_sizes, nn.relu)


class ResidualBlock(nn.Module):
    """relu-conv3x3-relu-conv3x3 plus the identity (IMPALA paper).

    The branch convs use gain 1, not sqrt(2): with sqrt(2) each block roughly doubles the
    activation variance and the six blocks leave ~25x larger features at init (measured),
    which inflates the initial value estimates.
    """

    channels: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        y = _conv(self.channels, 3, padding="SAME", gain=1.0)(nn.relu(x))
        y = _conv(self.channels, 3, padding="SAME", gain=1.0)(nn.relu(y))
        return x + y


class ImpalaResNet(nn.Module):
    """IMPALA deep torso: per stage conv3x3, maxpool 3x3/2, two residual blocks; then
    relu, flatten and dense relu layers."""

    channels: Sequence[int] = (16, 32, 32)
    dense_sizes: Sequence[int] = (256,)

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = _image_to_nhwc(obs)
        for channels in self.channels:
            x = _conv(channels, 3, padding="SAME")(x)
            x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
            x = ResidualBlock(channels)(x)
            x = ResidualBlock(channels)(x)
        x = nn.relu(x).reshape((x.shape[0], -1))
        return _dense_stack(x, self.dense_sizes, nn.relu)


class MinAtarCNN(nn.Module):
    """The MinAtar paper's network (Young & Tian 2019): one 3x3 conv of `channels` (stride 1,
    no padding: 10x10 -> 8x8) and relu, flatten, then dense relu layers (128 there).
    Observations are [N, H, W, C] planes of 0/1 (uint8 or bool; floats, e.g. standardized
    by --normalize.obs, are used as they are), channels last as the package gives them."""

    channels: int = 16
    dense_sizes: Sequence[int] = (128,)

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        if obs.ndim != 4:
            raise ValueError(
                f"the minatar_cnn torso expects [N, H, W, C] observations, got shape {obs.shape}"
            )
        x = nn.relu(PatchConv(self.channels, 3, name="Conv_0")(obs.astype(jnp.float32)))
        x = x.reshape((x.shape[0], -1))
        return _dense_stack(x, self.dense_sizes, nn.relu)


class PatchConv(nn.Module):
    """A stride-1, unpadded ("VALID") convolution computed as one matrix product over
    patches gathered by slicing: the same parameters (`kernel` [k, k, C, F], `bias` [F]) and
    the same result as `nn.Conv`, at 0.7x its CPU time on MinAtar's small planes.

    XLA:CPU's convolution is slow for so few channels: the torso's forward and backward
    pass on 10x10x6 planes took 56 us of CPU per sample with `nn.Conv`, 39 us in this form
    (benchmarks/minatar_torso.py; docs/benchmarks.md)."""

    features: int
    kernel: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        k, channels = self.kernel, x.shape[-1]
        kernel = self.param(
            "kernel", nn.initializers.orthogonal(TORSO_GAIN), (k, k, channels, self.features)
        )
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        height, width = x.shape[1] - k + 1, x.shape[2] - k + 1
        # Channels of the patch at (i, j) in the order kernel.reshape(k * k * C, F) reads them.
        patches = jnp.concatenate(
            [x[:, i : i + height, j : j + width, :] for i in range(k) for j in range(k)], axis=-1
        )
        return patches @ kernel.reshape(k * k * channels, self.features) + bias
