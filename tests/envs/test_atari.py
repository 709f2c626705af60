"""envpool Atari with EnvConfig's settings: uint8 stacked frames, episodic life, raw returns.

Returns are checked against a twin env built with reward_clip=False: same seed and
actions give the same game (clipping does not touch the dynamics), and its rewards are
the raw game score.
"""

import dataclasses

import numpy as np

from podrace.config import EnvConfig
from podrace.envs import env_spec

from .contract import run_checked


def random_policy(num_actions: int, num_envs: int):
    actions = np.random.default_rng(0).integers(0, num_actions, (10_000, num_envs)).astype(np.int32)
    return lambda obs, t: actions[t]


def run_with_twin(make, cfg: EnvConfig, num_steps: int):
    env = make(cfg, 2, seed=3)
    twin = make(dataclasses.replace(cfg, reward_clip=False), 2, seed=3)
    policy = random_policy(env.spec.num_actions, 2)
    twin.reset()
    twin_rewards = []

    def raw_reward(t, step):
        twin_step = twin.step(policy(None, t))
        np.testing.assert_array_equal(twin_step.obs, step.obs)
        np.testing.assert_array_equal(np.sign(twin_step.reward), step.reward)
        twin_rewards.append(twin_step.reward)
        return twin_step.reward

    rec = run_checked(env, policy, num_steps, raw_reward=raw_reward, episode_is_life=False)
    return env, rec, np.array(twin_rewards)


def test_breakout_episodic_life_and_game_over(make):
    cfg = EnvConfig(id="Breakout-v5")
    assert cfg.episodic_life and cfg.reward_clip and cfg.sticky_action_prob == 0.25
    spec = env_spec(cfg)
    assert spec.obs_shape == (4, 84, 84) and spec.obs_dtype == np.uint8 and spec.num_actions == 4

    env, rec, _ = run_with_twin(make, cfg, 320)  # random play loses a game in ~170-220 steps
    assert env.spec == spec
    for i in range(2):
        # Breakout has 5 lives: four terminated steps that leave the game running (each
        # followed by an autoreset step, checked by run_checked), then game over.
        game_end = next(t for t, s in enumerate(rec.steps) if s.episode_done[i])
        game = rec.steps[: game_end + 1]
        assert [s.episode_done[i] for s in game if s.terminated[i]] == [False] * 4 + [True]
        assert not any(s.truncated[i] for s in game)
        length = next(length for j, _, length in rec.episodes if j == i)
        assert length == game_end + 1 - 4  # the 4 autoreset steps are not agent steps


def test_raw_return_is_unclipped_game_score(make):
    """Ms. Pac-Man pellets score 10: the reported return must be the raw score."""
    cfg = EnvConfig(id="MsPacman-v5", max_episode_steps=150)
    _, rec, raw = run_with_twin(make, cfg, 155)
    assert rec.episodes
    clipped_sums = [float(np.sign(raw[:, i]).sum()) for i in range(2)]
    for i, ret, _ in rec.episodes:
        assert ret > clipped_sums[i] > 0  # raw points, not the clipped learning reward
