"""Values an env reports in its `info` as an episode ends: kept per episode by the adapter
(`take_episode_info`), nothing of the steps where no episode ended."""

import numpy as np

from podrace.envs.source import from_factory
from tests.helpers.info_envs import OFFSET, true_objective_envs


def test_the_adapter_keeps_each_ended_episodes_info_value():
    env = from_factory(true_objective_envs, 4, 0)
    try:
        env.reset()
        lengths = []
        rng = np.random.default_rng(0)
        while len(lengths) < 6:
            step = env.step(rng.integers(0, 2, 4).astype(np.int32))
            lengths.extend(step.episode_length[step.episode_done].tolist())
        info = env.take_episode_info()
        assert list(info) == ["true_objective"]
        assert info["true_objective"].tolist() == [OFFSET + n for n in lengths]
        assert env.take_episode_info() == {}  # taken: nothing until another episode ends
    finally:
        env.close()
