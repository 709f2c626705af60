"""Pure learning algorithms: distributions, advantage estimators, PPO and IMPALA."""

from podrace.algos.advantages import gae, vtrace
from podrace.algos.base import Algorithm, TrainState
from podrace.algos.distributions import Categorical, Gaussian
from podrace.algos.impala import impala_loss, make_impala
from podrace.algos.ppo import PPOBatch, make_ppo, ppo_loss

__all__ = [
    "Algorithm",
    "Categorical",
    "Gaussian",
    "PPOBatch",
    "TrainState",
    "gae",
    "impala_loss",
    "make_impala",
    "make_ppo",
    "ppo_loss",
    "vtrace",
]
