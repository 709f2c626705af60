"""Any Gymnasium vector env in next-step autoreset mode, as a podrace BatchedEnv.

Gymnasium's NEXT_STEP mode (the default of `SyncVectorEnv`, `AsyncVectorEnv` and
`gymnasium.make_vec`) matches podrace's convention: the step after a done one resets,
ignores its action and reports reward 0, terminated/truncated False. The other modes
cannot be converted without stepping an env that should only have been reset, so they
are refused. Episode statistics are counted here, so the vector env needs no wrappers.

The numeric values the envs report in `info` on the last step of an episode are kept per
episode (`take_episode_info`): the run logs them as `info/<key>` metrics (an objective a
population can be ranked on, `--pbt.metric info/<key>`).
"""

from __future__ import annotations

import gymnasium
import numpy as np

from podrace.config import ConfigError
from podrace.envs.base import env_seeds
from podrace.envs.episode_stats import EpisodeStats
from podrace.envs.spaces import ActionPreparer, ObsIndices, OneHotObs, spec_from_spaces
from podrace.types import EnvStep


def check_next_step_autoreset(env: gymnasium.vector.VectorEnv, name: str) -> None:
    """ConfigError unless `env` autoresets on the step after a done one."""
    mode = env.metadata.get("autoreset_mode", gymnasium.vector.AutoresetMode.NEXT_STEP)
    if mode != gymnasium.vector.AutoresetMode.NEXT_STEP:
        raise ConfigError(
            f"env {name!r}: vector env autoreset_mode is {mode}; podrace needs "
            "gymnasium.vector.AutoresetMode.NEXT_STEP (Gymnasium's default)"
        )


class VectorEnvAdapter:
    """BatchedEnv over a Gymnasium VectorEnv; takes ownership (closes it). `obs_indices`:
    keep only these entries of each observation (`EnvConfig.obs_indices`)."""

    def __init__(
        self,
        env: gymnasium.vector.VectorEnv,
        seed: int,
        name: str,
        obs_indices: tuple[int, ...] | None = None,
        seeds: list[int] | None = None,
    ) -> None:
        """`seeds`: each env's seed for the first reset (default: derived from `seed`)."""
        check_next_step_autoreset(env, name)
        self._env = env
        self.num_envs = int(env.num_envs)
        self.spec = spec_from_spaces(name, env.single_observation_space, env.single_action_space)
        self._prepare = ActionPreparer(self.spec, self.num_envs, env.single_action_space.dtype)
        self._one_hot = OneHotObs.of(env.single_observation_space)
        self._select = ObsIndices.of(obs_indices, self.spec, name)
        if self._select is not None:
            self.spec = self._select.spec(self.spec)
        self._seeds: list[int] | None = (
            env_seeds(seed, self.num_envs) if seeds is None else list(seeds)
        )
        self._stats = EpisodeStats(self.num_envs)
        self._episode_info: dict[str, list[np.ndarray]] = {}
        self._started = False
        self._closed = False

    def reset(self) -> np.ndarray:
        # Seed only the first reset; later resets continue each env's random stream.
        obs, _ = self._env.reset(seed=self._seeds)
        self._seeds = None
        self._stats.reset()
        self._episode_info = {}
        self._started = True
        return self._own(obs)

    def step(self, actions: np.ndarray) -> EnvStep:
        if not self._started:
            raise RuntimeError("call reset() before step()")
        obs, reward, terminated, truncated, info = self._env.step(self._prepare(actions))
        terminated = np.array(terminated, bool)
        truncated = np.array(truncated, bool)
        episode_done = terminated | truncated
        if info and episode_done.any():
            self._keep_episode_info(info, episode_done)
        episode_return, episode_length = self._stats.update(
            np.asarray(reward), terminated, truncated, episode_done
        )
        return EnvStep(
            obs=self._own(obs),
            reward=np.array(reward, np.float32),
            terminated=terminated,
            truncated=truncated,
            episode_done=episode_done,
            episode_return=episode_return,
            episode_length=episode_length,
        )

    def take_episode_info(self) -> dict[str, np.ndarray]:
        """key -> the values of `info[key]` reported on the last step of each episode that
        ended since the last call (in the order they ended), for every numeric key; then
        forgets them."""
        taken = {key: np.concatenate(parts) for key, parts in self._episode_info.items()}
        self._episode_info = {}
        return taken

    def _keep_episode_info(self, info: dict, episode_done: np.ndarray) -> None:
        """Keep the numeric per-env values of Gymnasium's vector `info` (an array over the
        envs, and `_key` saying which envs reported it) of the envs whose episode ended."""
        for key, values in info.items():
            if key.startswith("_") or not isinstance(values, np.ndarray):
                continue
            if values.shape != (self.num_envs,) or values.dtype.kind not in "biuf":
                continue
            reported = info.get(f"_{key}")
            ended = episode_done if reported is None else episode_done & np.asarray(reported)
            if ended.any():
                self._episode_info.setdefault(key, []).append(values[ended].astype(np.float64))

    def _own(self, obs) -> np.ndarray:
        """A fresh array as the spec has it: vector envs may reuse one obs buffer (copy=False)."""
        if self._one_hot is not None:
            obs = self._one_hot(obs)  # a new array
        elif self._select is None:
            return np.array(obs, dtype=self.spec.obs_dtype, copy=True)
        if self._select is not None:
            obs = self._select(np.asarray(obs, self.spec.obs_dtype))  # np.take: a new array
        return obs

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._env.close()
