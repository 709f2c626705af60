"""A recurrent policy's core state: what the actor carries step by step is what the learner
unrolls from the rollout's stamp, through episode ends inside rollouts and across rollout
boundaries, and the state is reset exactly at the first step of every new episode."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from podrace.actor import Actor, ActorSettings, make_policy_fns
from podrace.algos.impala import impala_loss
from podrace.algos.ppo import PPOBatch, ppo_loss
from podrace.config import ImpalaConfig, NetworkConfig, PPOConfig
from podrace.control import Control, Heartbeat, Lifetime
from podrace.networks import make_network
from podrace.types import EnvSpec
from tests.helpers.actors import FixedParams, ListSink, ScriptedEnv

T, ROLLOUTS, B = 4, 3, 3
# 1-based step numbers at which each env's episodes end. Row r of the run (0-based, rollout
# r // T) is step r + 1; the row after an end is the autoreset step (invalid), the row after
# that the first of the next episode.
ENDS = [
    {2: "terminated", 9: "truncated"},  # autoreset rows 2 and 9: inside rollouts 0 and 2
    {3: "terminated"},  # autoreset row 3: the last row of rollout 0, new episode from rollout 1
    {4: "truncated"},  # autoreset row 4: the first row of rollout 1 (its stamp is the old episode)
]


class VaryingObsEnv(ScriptedEnv):
    """B envs whose episodes end at the steps of ENDS (next-step autoreset), with
    observations that differ at every step and env, so the core's state carries information."""

    spec = EnvSpec(obs_shape=(2,), obs_dtype=np.float32, num_actions=2, action_shape=())
    num_envs = B

    def __init__(self):
        super().__init__(ENDS)

    def observe(self):
        t = np.full(B, self.steps, np.float32)
        return np.stack([np.sin(t + np.arange(B)), np.cos(0.5 * t)], axis=1).astype(np.float32)

    def reset(self):
        return self.observe()


def autoreset_rows(b: int) -> list[int]:
    return [step for step in ENDS[b] if step < T * ROLLOUTS]


def network():
    net = make_network(
        NetworkConfig(hidden_sizes=(16,), core="lstm", core_size=8), VaryingObsEnv.spec
    )
    params = jax.jit(net.init)(jax.random.PRNGKey(2), jnp.zeros((1, 2)))
    return net, params


def run_recording_actor(net, params):
    """The step-by-step actor on VaryingObsEnv; every policy step's (valid, state in, state
    out) recorded, host side."""
    policy = make_policy_fns(net.apply).on(jax.devices()[0])
    steps = []

    def recording_step(params, obs, valid, state, key):
        out = policy.step(params, obs, valid, state, key)
        steps.append(jax.device_get((valid, state, out[3])))
        return out

    settings = ActorSettings(0, T, ROLLOUTS, max_policy_lag=1, key=jax.random.PRNGKey(3))
    sink = ListSink()
    actor = Actor(
        settings,
        VaryingObsEnv(),
        dataclasses.replace(policy, step=recording_step),
        FixedParams(params),
        sink,
        Control(Lifetime(), Heartbeat("actor-0"), lambda _: None),
    )
    actor.run()
    return sink.rollouts, steps


def assert_trees_close(a, b, err_msg=""):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(
            np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6, err_msg=err_msg
        )


def norm(tree) -> np.ndarray:
    """Per env: the largest magnitude in the state."""
    return np.max([np.abs(np.asarray(x)).max(axis=-1) for x in jax.tree.leaves(tree)], axis=0)


@pytest.mark.timeout(120)
def test_learner_unrolls_the_states_the_actor_carried():
    net, params = network()
    rollouts, steps = run_recording_actor(net, params)
    assert len(rollouts) == ROLLOUTS and len(steps) == T * ROLLOUTS
    unroll = jax.jit(net.apply)
    for k, rollout in enumerate(rollouts):
        traj = jax.device_get(rollout.trajectory)
        # The stamp is the state the actor's first step of this rollout started from.
        assert_trees_close(traj.core_state, steps[k * T][1], f"rollout {k} stamp")
        dist, values, states = unroll(params, traj.obs, traj.valid, traj.core_state)
        for t in range(T):
            assert_trees_close(
                jax.tree.map(lambda s, t=t: s[t], states), steps[k * T + t][2], f"row {k * T + t}"
            )
        np.testing.assert_allclose(values, traj.values, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(dist.log_prob(traj.actions), traj.logprobs, rtol=1e-5, atol=1e-5)
        if k + 1 < ROLLOUTS:  # across the boundary: the next stamp is where this unroll ended
            next_stamp = rollouts[k + 1].trajectory.core_state
            assert_trees_close(jax.tree.map(lambda s: s[-1], states), next_stamp, f"after {k}")


@pytest.mark.timeout(120)
def test_the_state_is_reset_exactly_where_a_new_episode_begins():
    """Ground truth from the script, not from the shared reset function: the step after an
    autoreset step (the first of a new episode) starts from the initial (zero) state, and
    every other step, the autoreset step included, carries its episode's memory."""
    net, params = network()
    rollouts, steps = run_recording_actor(net, params)
    state_in = np.stack([norm(state) for _, state, _ in steps])  # [rows, B]
    valid = np.concatenate([np.asarray(r.trajectory.valid) for r in rollouts])
    for b in range(B):
        first_rows = {0} | {row + 1 for row in autoreset_rows(b)}
        for row in range(T * ROLLOUTS):
            if row in first_rows:
                assert state_in[row, b] == 0.0, f"env {b}: row {row} begins an episode"
            else:
                assert state_in[row, b] > 1e-3, f"env {b}: row {row} continues an episode"
        assert not valid[autoreset_rows(b), b].any()
    # The stamps: env 1's episode began with rollout 1; env 2's autoreset step opened it.
    stamp = norm(rollouts[1].trajectory.core_state)
    assert stamp[1] == 0.0 and stamp[2] > 1e-3


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_losses_recompute_the_behaviour_exactly_on_policy():
    """The learners' own code (PPO's loss on a whole-sequence minibatch, IMPALA's loss with
    its bootstrap step) unroll from the stamps: with the behaviour params every ratio is 1."""
    net, params = network()
    rollouts, _ = run_recording_actor(net, params)
    for rollout in rollouts:
        traj = jax.device_get(rollout.trajectory)
        batch = PPOBatch(
            traj.obs,
            traj.actions,
            traj.logprobs,
            traj.values,
            np.ones_like(traj.values),
            traj.values,
            traj.valid,
            traj.core_state,
        )
        _, ppo = jax.jit(lambda p, b: ppo_loss(p, net.apply, b, PPOConfig(), None))(params, batch)
        assert abs(float(ppo["approx_kl"])) < 1e-6 and float(ppo["clip_frac"]) == 0.0
        assert float(ppo["value_loss"]) < 1e-10  # returns = behaviour values
        _, impala = jax.jit(lambda p, t: impala_loss(p, net.apply, t, ImpalaConfig(), None))(
            params, traj
        )
        assert abs(float(impala["approx_kl"])) < 1e-6 and float(impala["rho_truncated"]) == 0.0
