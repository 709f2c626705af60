"""Flax networks: torsos and the actor-critic built from a NetworkConfig and an EnvSpec."""

from __future__ import annotations

from podrace.config import NetworkConfig
from podrace.networks.actor_critic import ActorCritic
from podrace.networks.recurrent import RecurrentActorCritic, RecurrentNetwork, zero_state
from podrace.networks.torsos import MLP, ImpalaResNet, MinAtarCNN, NatureCNN
from podrace.types import EnvSpec, PyTree

__all__ = [
    "ActorCritic",
    "ImpalaResNet",
    "MLP",
    "MinAtarCNN",
    "NatureCNN",
    "RecurrentActorCritic",
    "RecurrentNetwork",
    "initial_core_state",
    "make_network",
]


def initial_core_state(cfg: NetworkConfig, batch: int) -> PyTree:
    """The state a rollout of `batch` envs is stamped with when nothing has happened yet
    (host arrays): the core's zero state, or () for a feed-forward network."""
    return () if cfg.core == "none" else zero_state(cfg.core, cfg.core_size, batch)


def make_network(cfg: NetworkConfig, spec: EnvSpec) -> ActorCritic | RecurrentNetwork:
    """The actor-critic for `spec`: Categorical head if discrete, Gaussian otherwise.

    For CNN torsos `cfg.hidden_sizes` are the dense widths after the convolutions (e.g.
    (512,) for NatureCNN, (256,) for ImpalaResNet, (128,) for MinAtarCNN) and the torso is
    always shared; for the MLP, `shared_torso=False` builds separate policy and value MLPs.
    With a recurrent `cfg.core` the network is a `RecurrentNetwork` (torso, core and heads;
    torso and core shared by both heads) whose `apply` is a `podrace.algos.base.RecurrentApply`.
    """
    if cfg.core != "none":
        return _recurrent_network(cfg, spec)
    if cfg.torso == "mlp":
        torso = MLP(tuple(cfg.hidden_sizes), cfg.activation)
        value_torso = None if cfg.shared_torso else MLP(tuple(cfg.hidden_sizes), cfg.activation)
    elif cfg.torso == "nature_cnn":
        torso, value_torso = NatureCNN(tuple(cfg.hidden_sizes)), None
    elif cfg.torso == "impala_resnet":
        torso, value_torso = ImpalaResNet(dense_sizes=tuple(cfg.hidden_sizes)), None
    elif cfg.torso == "minatar_cnn":
        torso, value_torso = MinAtarCNN(dense_sizes=tuple(cfg.hidden_sizes)), None
    else:
        raise ValueError(f"unknown torso {cfg.torso!r}")
    if spec.discrete:
        return ActorCritic(
            torso, value_torso, tuple(spec.obs_shape), num_actions=int(spec.num_actions)
        )
    if len(spec.action_shape) != 1:
        raise ValueError(
            f"continuous actions must be a vector, got action_shape {spec.action_shape}"
        )
    return ActorCritic(
        torso, value_torso, tuple(spec.obs_shape), action_dim=int(spec.action_shape[0])
    )


def _recurrent_network(cfg: NetworkConfig, spec: EnvSpec) -> RecurrentNetwork:
    if cfg.torso == "mlp":
        torso = MLP(tuple(cfg.hidden_sizes), cfg.activation)
    elif cfg.torso == "nature_cnn":
        torso = NatureCNN(tuple(cfg.hidden_sizes))
    elif cfg.torso == "impala_resnet":
        torso = ImpalaResNet(dense_sizes=tuple(cfg.hidden_sizes))
    elif cfg.torso == "minatar_cnn":
        torso = MinAtarCNN(dense_sizes=tuple(cfg.hidden_sizes))
    else:
        raise ValueError(f"unknown torso {cfg.torso!r}")
    heads = {"num_actions": int(spec.num_actions)} if spec.discrete else {}
    if not spec.discrete:
        if len(spec.action_shape) != 1:
            raise ValueError(
                f"continuous actions must be a vector, got action_shape {spec.action_shape}"
            )
        heads = {"action_dim": int(spec.action_shape[0])}
    module = RecurrentActorCritic(
        torso, tuple(spec.obs_shape), core=cfg.core, core_size=cfg.core_size, **heads
    )
    return RecurrentNetwork(module)
