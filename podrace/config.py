"""Run configuration: frozen dataclasses, validated before any thread starts.

This module must not import JAX: the CLI reads the config first and only then decides
which XLA flags (e.g. forced CPU device count) to set before JAX is imported.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal


class ConfigError(ValueError):
    """A configuration that cannot run. The message is one line, meant for the user."""


@dataclass(frozen=True)
class EnvConfig:
    """Which environment, how many copies per actor thread, and backend settings."""

    id: str = "CartPole-v1"
    """Environment id (envpool id or any registered Gymnasium id)."""
    backend: Literal["auto", "envpool", "gymnasium"] = "auto"
    """`auto` uses envpool when it knows the id, Gymnasium otherwise."""
    num_envs: int = 8
    """Environments stepped together by one actor thread."""
    max_episode_steps: int | None = None
    """Override the env's own time limit (truncation); None keeps the env default."""
    # Atari (envpool *-v5 ids); ignored by other envs.
    frame_skip: int = 4
    """Atari: emulator frames per agent step."""
    frame_stack: int = 4
    """Atari: stacked grey frames per observation."""
    image_size: int = 84
    """Atari: observation height and width (grey)."""
    sticky_action_prob: float = 0.25
    """Atari: probability of repeating the previous action (repeat_action_probability)."""
    full_action_space: bool = False
    """Atari: use all 18 actions instead of the game's minimal set."""
    episodic_life: bool = True
    """Atari: a lost life ends the learning episode (reported returns stay per game)."""
    reward_clip: bool = True
    """Atari: clip rewards to their sign for learning (reported returns stay raw)."""
    noop_max: int = 30
    """Atari: up to this many no-op actions after reset."""


@dataclass(frozen=True)
class NetworkConfig:
    """Actor-critic network."""

    torso: Literal["mlp", "nature_cnn", "impala_resnet"] = "mlp"
    """Feature extractor shared by the policy and value heads."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """MLP layer widths (also the widths of the dense layer after a CNN torso)."""
    activation: Literal["tanh", "relu"] = "tanh"
    """MLP activation."""
    shared_torso: bool = False
    """MLP only: one torso for policy and value (CNN torsos are always shared)."""


@dataclass(frozen=True)
class PPOConfig:
    """PPO hyperparameters (used when `algo` is `ppo`)."""

    learning_rate: float = 2.5e-4
    """Adam step size (start value when annealed)."""
    anneal_lr: bool = True
    """Linearly decay the learning rate to zero over the run."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda (bias/variance trade-off of advantages)."""
    num_epochs: int = 4
    """Passes over each batch."""
    num_minibatches: int = 4
    """Minibatches per epoch, per learner shard."""
    clip_coef: float = 0.2
    """Surrogate ratio clipping (and value clipping) range."""
    clip_value_loss: bool = True
    """Clip the value loss around the behaviour values."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.01
    """Weight of the entropy bonus."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clipping threshold."""
    norm_adv: bool = True
    """Normalise advantages per minibatch (global statistics across shards)."""


@dataclass(frozen=True)
class ImpalaConfig:
    """IMPALA / V-trace hyperparameters (used when `algo` is `impala`)."""

    learning_rate: float = 6e-4
    """RMSProp step size (start value when annealed)."""
    anneal_lr: bool = True
    """Linearly decay the learning rate to zero over the run."""
    gamma: float = 0.99
    """Discount factor."""
    vtrace_lambda: float = 1.0
    """V-trace lambda (1.0 is the paper's V-trace)."""
    rho_bar: float = 1.0
    """Truncation of importance weights in the V-trace targets and policy gradient."""
    c_bar: float = 1.0
    """Truncation of the trace-cutting coefficients."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.01
    """Weight of the entropy bonus."""
    max_grad_norm: float = 40.0
    """Global gradient-norm clipping threshold. podrace's loss is a mean over samples, so
    the paper's value for a summed loss (40) corresponds to 40 / N for N samples per
    minibatch (presets.mean_loss_rmsprop converts)."""
    rmsprop_decay: float = 0.99
    """RMSProp decay of the squared-gradient average."""
    rmsprop_eps: float = 0.01
    """RMSProp epsilon (inside the square root). With podrace's mean loss the paper's
    summed-loss eps (0.01) corresponds to 0.01 / N**2 for N samples per minibatch; larger
    values make eps dominate and steps tiny (presets.mean_loss_rmsprop converts)."""
    num_minibatches: int = 1
    """Minibatches per update, per learner shard (one pass over the data)."""


@dataclass(frozen=True)
class LayoutConfig:
    """Where actors and learners run. Device ids index `jax.devices(platform)`."""

    platform: Literal["cpu", "gpu", "tpu"] | None = None
    """JAX platform; None uses JAX's default backend."""
    cpu_devices: int = 1
    """XLA CPU devices to create (the CLI appends --xla_force_host_platform_device_count
    to XLA_FLAGS before JAX starts); lets several actor/learner devices share one CPU."""
    actor_device_ids: tuple[int, ...] = (0,)
    """Devices that run actor policies."""
    actors_per_device: int = 2
    """Actor threads per actor device, each with its own envs."""
    learner_device_ids: tuple[int, ...] = (0,)
    """Devices of the learner mesh (data-parallel over the env axis)."""
    queue_size: int = 1
    """Rollouts buffered per actor before the actor blocks (back-pressure)."""
    max_policy_lag: int = 1
    """Largest allowed (learner version - behaviour version) of a consumed rollout."""
    synchronous: bool = False
    """Actors wait for the newest params before every rollout (policy lag 0)."""
    scan_unroll: int = 1
    """Unroll factor of the learner's minibatch scan (large values help conv nets on CPU)."""


@dataclass(frozen=True)
class EvalConfig:
    """The evaluator thread: deterministic policy on its own envs and device."""

    every_updates: int = 0
    """Evaluate every N learner updates (0: only at the end)."""
    episodes: int = 16
    """Episodes per evaluation."""
    num_envs: int = 8
    """Evaluation envs stepped together."""
    device_id: int | None = None
    """Device for evaluation inference; None uses the first actor device."""


@dataclass(frozen=True)
class SafetyConfig:
    """What the run does when something goes wrong."""

    watchdog_s: float = 60.0
    """Fail the run when an env.step (actor or evaluator) has not returned for this long."""
    on_nonfinite: Literal["stop", "skip"] = "stop"
    """NaN/inf loss or gradients: stop with an error, or skip that update and count it.
    Non-finite params are never published either way."""


@dataclass(frozen=True)
class DistributedConfig:
    """Several processes (hosts) sharing one learner mesh through jax.distributed.

    Give the same command to every process, changing only the process id. Unset fields
    come from JAX's own sources: JAX_COORDINATOR_ADDRESS, or a cluster JAX detects
    (SLURM, Open MPI, Kubernetes, TPU pods). Device ids in `layout` index each process's
    local devices; every process runs `layout` (its own actors, learner shards).
    """

    coordinator: str | None = None
    """HOST:PORT where process 0 serves jax.distributed (reachable from every process)."""
    num_processes: int | None = None
    """Processes in the run (one per host, typically)."""
    process_id: int | None = None
    """This process's index, 0 .. num_processes - 1; process 0 writes metrics and evaluates."""
    init_timeout_s: int = 300
    """Seconds to wait for every process to join (initialization and the config check)."""
    peer_timeout_s: float = 30.0
    """A process not heard from for this long is lost and the run stops (a process that
    exits or is killed is noticed at once, from its closed connection)."""

    @property
    def requested(self) -> bool:
        """Any field set: run distributed (the others may come from JAX's detection)."""
        return any(v is not None for v in (self.coordinator, self.num_processes, self.process_id))


@dataclass(frozen=True)
class LogConfig:
    run_dir: str = "runs"
    """Parent folder of run directories."""
    run_name: str | None = None
    """Run directory name; default <preset>-<seed>-<timestamp>."""
    interval_s: float = 2.0
    """Seconds between metric lines (console and metrics.jsonl)."""
    tensorboard: bool = False
    """Also write TensorBoard event files into the run directory."""
    console: Literal["progress", "lines", "none"] = "progress"
    """Live progress bar, plain lines, or nothing on the console."""


@dataclass(frozen=True)
class TrainConfig:
    """A training run."""

    name: str = "custom"
    """Preset name (used in the run directory name)."""
    algo: Literal["ppo", "impala"] = "ppo"
    """Learning algorithm; its hyperparameters are under --ppo.* or --impala.*."""
    seed: int = 1
    """Run seed: params, learner keys, and every actor's key and env seeds derive from it."""
    deterministic: bool = False
    """Reproducible runs: synchronous actors (lag 0, fixed data order) and deterministic
    XLA ops; the same seed then gives bit-identical params on the same machine."""
    total_steps: int = 500_000
    """Environment steps to train for (all actors together)."""
    rollout_length: int = 32
    """Steps per rollout (T) of each actor thread."""
    env: EnvConfig = field(default_factory=EnvConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    impala: ImpalaConfig = field(default_factory=ImpalaConfig)
    layout: LayoutConfig = field(default_factory=LayoutConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    safety: SafetyConfig = field(default_factory=SafetyConfig)
    log: LogConfig = field(default_factory=LogConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)

    # Derived sizes -------------------------------------------------------------------
    @property
    def num_actors(self) -> int:
        """Actor threads of this process."""
        return len(self.layout.actor_device_ids) * self.layout.actors_per_device

    @property
    def num_processes(self) -> int:
        return self.distributed.num_processes or 1

    @property
    def steps_per_update(self) -> int:
        """Env steps consumed by one learner update (one rollout from every actor of every process)."""
        return self.num_processes * self.num_actors * self.env.num_envs * self.rollout_length

    @property
    def num_updates(self) -> int:
        return max(1, self.total_steps // self.steps_per_update)

    @property
    def max_policy_lag(self) -> int:
        return 0 if self.synchronous else self.layout.max_policy_lag

    @property
    def synchronous(self) -> bool:
        return self.layout.synchronous or self.deterministic


def replace(cfg, **changes):
    """`dataclasses.replace` that also accepts dotted keys, e.g. `**{"env.num_envs": 4}`."""
    nested: dict[str, dict] = {}
    flat = {}
    for key, value in changes.items():
        head, _, rest = key.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            flat[key] = value
    for head, sub in nested.items():
        flat[head] = replace(getattr(cfg, head), **sub)
    return dataclasses.replace(cfg, **flat)


def validate(cfg: TrainConfig) -> None:
    """Raise ConfigError for anything that cannot run; needs no devices and no JAX."""

    def positive(name: str, value: float) -> None:
        if value <= 0:
            raise ConfigError(f"{name} must be positive, got {value}")

    positive("total_steps", cfg.total_steps)
    positive("rollout_length", cfg.rollout_length)
    positive("env.num_envs", cfg.env.num_envs)
    positive("layout.actors_per_device", cfg.layout.actors_per_device)
    positive("layout.queue_size", cfg.layout.queue_size)
    positive("layout.scan_unroll", cfg.layout.scan_unroll)
    positive("layout.cpu_devices", cfg.layout.cpu_devices)
    positive("eval.episodes", cfg.eval.episodes)
    positive("eval.num_envs", cfg.eval.num_envs)
    positive("log.interval_s", cfg.log.interval_s)
    positive("safety.watchdog_s", cfg.safety.watchdog_s)
    if cfg.eval.every_updates < 0:
        raise ConfigError(f"eval.every_updates must be >= 0, got {cfg.eval.every_updates}")
    if cfg.layout.max_policy_lag < 0:
        raise ConfigError(f"layout.max_policy_lag must be >= 0, got {cfg.layout.max_policy_lag}")
    if not cfg.env.id:
        raise ConfigError("env.id must not be empty")
    for name, ids in (
        ("layout.actor_device_ids", cfg.layout.actor_device_ids),
        ("layout.learner_device_ids", cfg.layout.learner_device_ids),
    ):
        if not ids:
            raise ConfigError(f"{name} must name at least one device")
        if any(i < 0 for i in ids):
            raise ConfigError(f"{name} must be non-negative device ids, got {list(ids)}")
        if len(set(ids)) != len(ids):
            raise ConfigError(f"{name} has repeated device ids: {list(ids)}")
    if cfg.eval.device_id is not None and cfg.eval.device_id < 0:
        raise ConfigError(f"eval.device_id must be a non-negative device id, got {cfg.eval.device_id}")
    num_learners = len(cfg.layout.learner_device_ids)
    if cfg.env.num_envs % num_learners:
        raise ConfigError(
            f"env.num_envs ({cfg.env.num_envs}) must be divisible by the number of learner "
            f"devices ({num_learners}): each actor's rollout is split evenly across them"
        )
    validate_distributed(cfg.distributed)
    if cfg.total_steps < cfg.steps_per_update:
        processes = f"{cfg.num_processes} processes x " if cfg.num_processes > 1 else ""
        raise ConfigError(
            f"total_steps ({cfg.total_steps}) is less than one update "
            f"({processes}{cfg.num_actors} actors x {cfg.env.num_envs} envs x {cfg.rollout_length} steps "
            f"= {cfg.steps_per_update})"
        )
    envs_per_shard = cfg.num_actors * cfg.env.num_envs // num_learners
    if cfg.algo == "ppo":
        positive("ppo.num_minibatches", cfg.ppo.num_minibatches)
        positive("ppo.num_epochs", cfg.ppo.num_epochs)
        if cfg.rollout_length % cfg.ppo.num_minibatches:
            raise ConfigError(
                f"ppo.num_minibatches ({cfg.ppo.num_minibatches}) must divide rollout_length "
                f"({cfg.rollout_length}): every env deals its steps evenly to the minibatches"
            )
    else:
        positive("impala.num_minibatches", cfg.impala.num_minibatches)
        if envs_per_shard % cfg.impala.num_minibatches:
            raise ConfigError(
                f"impala.num_minibatches ({cfg.impala.num_minibatches}) must divide the envs per "
                f"learner shard ({envs_per_shard})"
            )
    for name in ("learning_rate",):
        positive(f"{cfg.algo}.{name}", getattr(cfg.ppo if cfg.algo == "ppo" else cfg.impala, name))
    if not 0 <= cfg.env.sticky_action_prob <= 1:
        raise ConfigError(f"env.sticky_action_prob must be in [0, 1], got {cfg.env.sticky_action_prob}")
    if not cfg.network.hidden_sizes or any(h <= 0 for h in cfg.network.hidden_sizes):
        raise ConfigError(f"network.hidden_sizes must be positive widths, got {list(cfg.network.hidden_sizes)}")


def validate_distributed(d: DistributedConfig) -> None:
    """The distributed fields that are set must make sense; unset ones are JAX's to detect."""
    if d.coordinator is not None:
        host, _, port = d.coordinator.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"distributed.coordinator must be HOST:PORT, got '{d.coordinator}'")
    if d.num_processes is not None and d.num_processes < 1:
        raise ConfigError(f"distributed.num_processes must be positive, got {d.num_processes}")
    if (d.num_processes is None) != (d.process_id is None):
        raise ConfigError("distributed.num_processes and distributed.process_id must be given together")
    if d.process_id is not None and not 0 <= d.process_id < d.num_processes:
        raise ConfigError(
            f"distributed.process_id must be in 0..{d.num_processes - 1}, got {d.process_id}"
        )
    if d.init_timeout_s <= 0:
        raise ConfigError(f"distributed.init_timeout_s must be positive, got {d.init_timeout_s}")
    if d.peer_timeout_s <= 0:
        raise ConfigError(f"distributed.peer_timeout_s must be positive, got {d.peer_timeout_s}")
