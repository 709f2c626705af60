"""PPO deals its batch into minibatches anew every epoch, as a plain-Python reference does.

Feed-forward: each env column shuffles its T steps with `fold_in(its key, epoch)` and deals
T / num_minibatches of them to every minibatch. Recurrent: every block of num_minibatches
envs deals one whole env sequence to each minibatch, ranked by a uniform draw from
`fold_in(the env's key, epoch)`. The reference runs the epochs as Python loops over those
minibatches with the same loss and optimizer; a split drawn once and reused every epoch
gives other params, which the test checks it can tell apart.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from podrace.algos.advantages import gae
from podrace.algos.ppo import PPOBatch, make_ppo, ppo_loss
from podrace.config import PPOConfig
from tests.algos.helpers import random_trajectory, small_network

T, B = 8, 4
CFG = PPOConfig(num_epochs=3, num_minibatches=2, anneal_lr=False, learning_rate=3e-3)


def feed_forward_minibatches(batch: PPOBatch, keys: jax.Array, epoch: int) -> list[PPOBatch]:
    """Minibatch m holds steps order_b[m*T/mb : (m+1)*T/mb] of every env column b."""
    rows = T // CFG.num_minibatches
    orders = [np.asarray(jax.random.permutation(jax.random.fold_in(k, epoch), T)) for k in keys]
    out = []
    for m in range(CFG.num_minibatches):
        ts = np.concatenate([orders[b][m * rows : (m + 1) * rows] for b in range(B)])
        bs = np.repeat(np.arange(B), rows)
        out.append(PPOBatch(*(np.asarray(x)[ts, bs] for x in batch[:-1])))
    return out


def recurrent_minibatches(batch: PPOBatch, keys: jax.Array, epoch: int) -> list[PPOBatch]:
    """Minibatch m holds, from each block of num_mb envs, the env whose draw ranks m-th."""
    num_mb = CFG.num_minibatches
    draws = [float(jax.random.uniform(jax.random.fold_in(k, epoch))) for k in keys]
    envs = [[] for _ in range(num_mb)]
    for start in range(0, B, num_mb):
        block = list(range(start, start + num_mb))
        for rank, env in enumerate(sorted(block, key=lambda e: draws[e])):
            envs[rank].append(env)
    out = []
    for chosen in envs:
        fields = (np.asarray(x)[:, chosen] for x in batch[:-1])
        core = jax.tree.map(lambda x, c=chosen: np.asarray(x)[c], batch.core_state)
        out.append(PPOBatch(*fields, core_state=core))
    return out


OPTIMIZER = optax.chain(
    optax.clip_by_global_norm(CFG.max_grad_norm), optax.adam(CFG.learning_rate, eps=1e-5)
)


def optimizer_step(net):
    """One optimizer step on one minibatch, with PPO's loss and optimizer."""

    def step(params, opt_state, minibatch):
        grads = jax.grad(lambda p: ppo_loss(p, net.apply, minibatch, CFG, None)[0])(params)
        updates, opt_state = OPTIMIZER.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return jax.jit(step)


def reference_update(step, params, traj, keys, recurrent: bool, same_split_every_epoch: bool):
    """The params after one PPO update, minibatch by minibatch in Python."""
    advantages, returns = gae(
        traj.rewards,
        traj.values,
        traj.last_value,
        traj.terminated,
        traj.truncated,
        traj.valid,
        CFG.gamma,
        CFG.gae_lambda,
    )
    batch = PPOBatch(
        traj.obs,
        traj.actions,
        traj.logprobs,
        traj.values,
        advantages,
        returns,
        traj.valid,
        traj.core_state if recurrent else (),
    )
    opt_state = OPTIMIZER.init(params)
    deal = recurrent_minibatches if recurrent else feed_forward_minibatches
    for epoch in range(CFG.num_epochs):
        for minibatch in deal(batch, keys, 0 if same_split_every_epoch else epoch):
            params, opt_state = step(params, opt_state, minibatch)
    return params


def max_difference(a, b) -> float:
    pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b))
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in pairs)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("core", ["none", pytest.param("lstm", marks=pytest.mark.slow)])
def test_each_epoch_deals_new_minibatches_as_the_reference(core):
    net, params = small_network(True, core=core)
    traj = random_trajectory(net, params, True, T=T, B=B, seed=5)
    keys = jax.random.split(jax.random.PRNGKey(11), B)
    algo = make_ppo(dataclasses.replace(CFG), net.apply, 10, None)
    state, metrics = jax.jit(algo.update)(algo.init(params), traj, keys)
    assert bool(metrics["finite"])

    recurrent = core != "none"
    step = optimizer_step(net)
    expected = reference_update(step, params, traj, keys, recurrent, same_split_every_epoch=False)
    frozen = reference_update(step, params, traj, keys, recurrent, same_split_every_epoch=True)
    assert max_difference(expected, frozen) > 1e-3  # the split's change is visible in params
    assert max_difference(state.params, expected) < 1e-5
