"""Run configuration: frozen dataclasses, validated (podrace.validation) before any thread starts.

This module must not import JAX: the CLI reads the config first and only then decides
which XLA flags (e.g. forced CPU device count) to set before JAX is imported.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from podrace.pbt.config import PBTConfig


class ConfigError(ValueError):
    """A configuration that cannot run. The message is one line, meant for the user."""


JAX_PACKAGES = ("gymnax", "craftax")
"""Id prefixes naming a package of JAX envs (`podrace.envs.jax_envs`)."""


def names_jax_package(env_id: str) -> bool:
    """Whether `env_id` is 'gymnax:<name>' or 'craftax:<name>' (the jax backend's own ids)."""
    module, sep, _ = env_id.partition(":")
    return bool(sep) and module in JAX_PACKAGES


@dataclass(frozen=True)
class EnvConfig:
    """Which environment, how many copies per actor thread, and backend settings."""

    id: str = "CartPole-v1"
    """Environment id (envpool id or any registered Gymnasium id; with the jax backend
    `gymnax:<name>`, `craftax:<name>` or `module:factory`)."""
    backend: Literal["auto", "envpool", "gymnasium", "jax"] = "auto"
    """`auto` uses envpool when it knows the id, Gymnasium otherwise, and `jax` for
    `gymnax:` and `craftax:` ids; `jax`: envs written in JAX, stepped on the actor's device
    inside its compiled rollout (docs/guides/jax-envs.md)."""
    num_envs: int = 8
    """Environments stepped together by one actor thread."""
    num_threads: int | None = None
    """envpool: worker threads stepping one actor's (or the evaluator's) envs. None: with the
    thread runtime, each actor's share of this host's CPU cores after one kept for the
    learner, at least 1 (CartPole-sized envs step fastest on one: synchronising workers
    costs more than their physics); Ray workers keep envpool's default."""
    max_episode_steps: int | None = None
    """Override the env's own time limit (truncation); None keeps the env default."""
    workers: int = 0
    """Env worker processes per actor, each stepping num_envs / workers of its envs (a
    Python env then runs on a core of its own) while an inference server chooses the
    actions (--layout.inference); 0 steps them in the actor's thread."""
    worker_restarts: int = 3
    """How many times each env worker process may be restarted after it dies (each worker
    counts its own; fresh, derived seeds); one more death of that worker fails the run,
    naming it."""
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
    obs_indices: tuple[int, ...] | None = None
    """Keep only these entries of each observation, in this order, each once (a vector
    observation; any env, either backend); None keeps it whole. Hides part of the state to
    make an env partially observed: `--env.obs-indices 0 2` leaves CartPole's cart position and pole
    angle and removes both velocities (the `cartpole-po-*` presets)."""


@dataclass(frozen=True)
class NetworkConfig:
    """Actor-critic network."""

    torso: Literal["mlp", "nature_cnn", "impala_resnet", "minatar_cnn"] = "mlp"
    """Feature extractor shared by the policy and value heads: `nature_cnn` and
    `impala_resnet` for envpool's [C, H, W] uint8 frames, `minatar_cnn` for MinAtar's
    [10, 10, C] 0/1 planes."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """MLP layer widths (also the widths of the dense layer after a CNN torso)."""
    activation: Literal["tanh", "relu"] = "tanh"
    """MLP activation."""
    shared_torso: bool = False
    """MLP only: one torso for policy and value (CNN torsos are always shared; so is a torso
    with a recurrent core)."""
    core: Literal["none", "lstm", "gru"] = "none"
    """Recurrent core between torso and heads: `lstm` or `gru` give the policy a memory
    (partially observed envs); `none` is a feed-forward policy. A core is shared by both heads,
    and its state is reset where an episode ended (see `podrace.networks.recurrent`)."""
    core_size: int = 128
    """Width of the recurrent core's state (with `core` lstm or gru)."""


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
    """IMPALA / V-trace hyperparameters (used when `algo` is `impala`).

    The defaults are Cleanba's cleanba_impala.py. The optimizer sees the gradient of the
    loss SUMMED over a minibatch's valid samples, as in the paper, scalable_agent, TorchBeast
    and Cleanba, so rmsprop_eps and max_grad_norm mean what they mean there whatever the
    batch size (the reported losses are means).
    """

    learning_rate: float = 6e-4
    """RMSProp step size (start value when annealed)."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to zero over the run, one step per update (Cleanba)."""
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
    """Global-norm clip of the summed-loss gradient (paper and Cleanba: 40)."""
    rmsprop_decay: float = 0.99
    """RMSProp decay of the squared-gradient average."""
    rmsprop_eps: float = 0.01
    """RMSProp epsilon, on the summed-loss scale (paper and Cleanba: 0.01)."""
    rmsprop_style: Literal["tf", "torch"] = "torch"
    """torch: g / (sqrt(ms) + eps), ms from 0 (PyTorch; Cleanba, TorchBeast). tf: g / sqrt(ms
    + eps), ms from 1 (TF1 RMSPropOptimizer; the paper's scalable_agent)."""
    num_minibatches: int = 1
    """Minibatches per update (whole env sequences; one pass over the data)."""


@dataclass(frozen=True)
class NormalizeConfig:
    """Observation normalization and reward scaling, both computed by the learner.

    Observation statistics (running mean and variance) are published with the params in
    the same versioned snapshot, so every actor and the evaluator acting with version v
    normalize with version v's statistics. Reward scaling only changes what the learner
    trains on (rewards divided by the running std of each env's discounted return).
    """

    obs: bool = False
    """Normalize observations: (obs - running mean) / running std, then clip."""
    obs_clip: float = 10.0
    """Normalized observations are clipped to [-obs_clip, obs_clip]."""
    reward: bool = False
    """Scale rewards by the running std of the discounted return (gamma of the algorithm)."""
    reward_clip: float = 10.0
    """Scaled rewards are clipped to [-reward_clip, reward_clip]."""


@dataclass(frozen=True)
class LayoutConfig:
    """Where actors and learners run. Device ids index `jax.devices(platform)`."""

    platform: Literal["cpu", "gpu", "tpu"] | None = None
    """JAX platform; None uses JAX's default backend."""
    actor_platform: Literal["cpu", "gpu", "tpu"] | None = None
    """Platform of the actor and evaluator devices (`actor_device_ids` and `eval.device_id`
    index its devices); None: `platform`. `cpu` with a GPU learner keeps a small policy's
    per-step inference off the accelerator, whose round trip per env step costs more than
    the policy (CartPole's actors ran 5x faster on the CPUs of an H200 machine)."""
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
    inference: Literal["actor", "server"] = "actor"
    """With env workers (--env.workers): `actor` gives each actor an inference thread of its
    own for its workers; `server` one per actor device, batching the requests of every
    actor on it into one policy call (settings under --inference.*)."""


@dataclass(frozen=True)
class InferenceConfig:
    """How the inference threads of env workers (--env.workers) batch their requests."""

    max_batch: int = 0
    """Most envs per policy call; 0: every env the thread serves."""
    max_wait_ms: float = 0.0
    """Once a request is ready, how long to wait for more while workers still step (0:
    serve what is ready at once; the deterministic mode always waits for every worker)."""
    params_timeout_s: float | None = None
    """Fail the run when a request has waited this long for params within the lag bound
    (max_policy_lag); None waits as long as it takes, as an actor does."""


@dataclass(frozen=True)
class RayConfig:
    """The Ray runtime (`--runtime ray`): actors as Ray workers on any node of a cluster."""

    num_workers: int | Literal["auto"] = 2
    """Ray workers, each one actor (its own envs, policy on its own CPU device); `auto`: as
    many as the cluster's nodes hold (one CPU and the worker resources each), more as nodes
    join (with --ray.data-order elastic and --ray.rollouts-per-update)."""
    max_workers: int | None = None
    """With --ray.num-workers auto: at most this many workers (None: as many as fit)."""
    data_order: Literal["fixed", "elastic"] = "fixed"
    """`fixed`: update k takes rollout k of every worker, in worker order (reproducible; a
    restarting worker holds up learning). `elastic`: each update takes the next
    --ray.rollouts-per-update rollouts from whichever workers delivered them, so a lost worker
    or node costs only its in-flight rollouts and workers may come and go."""
    rollouts_per_update: int | None = None
    """Elastic order: rollouts (of env.num_envs envs each) every update takes, from any
    workers; None: --ray.num-workers. The batch of an update never changes with the workers."""
    node_relay: bool = True
    """Weights reach each node's workers through one relay on that node: one fetch per node
    per version from the learner's node, instead of one per worker."""
    no_workers_timeout_s: float = 60.0
    """Elastic order: the run fails once no worker has been alive for this long."""
    address: str | None = None
    """Cluster to join (`HOST:PORT` of a `ray start --head`); None starts a local Ray on
    127.0.0.1 for this run and stops it at the end. A joined cluster is left running."""
    envs_per_worker: int | None = None
    """Envs stepped together by one worker; None uses env.num_envs."""
    worker_resources: tuple[str, ...] = ()
    """Custom resources each worker needs, `NAME=AMOUNT` (e.g. `actor_node=1`): workers run
    only on nodes started with them (`ray start --resources '{"actor_node": 4}'`)."""
    max_restarts: int = 3
    """Restarts allowed per worker; one more failure stops the run with that worker's error."""
    start_timeout_s: float = 120.0
    """Seconds a worker may take to be placed on a node and compile its policy."""
    log_to_console: bool = False
    """Print Ray's own output on the console: its workers' logs and the messages its
    daemons send the driver (a raylet's report of a killed worker, with its state dump).
    Off: the messages go to `ray.log` in the run directory and a local Ray's logs are
    copied to its `ray-logs/` when the run ends; podrace prints one line of its own per
    worker lost, restarted or joined."""


@dataclass(frozen=True)
class EvalConfig:
    """The evaluator thread: deterministic policy on its own envs and device."""

    every_updates: int = 0
    """Evaluate every N learner updates (0: only at the end)."""
    episodes: int = 16
    """Episodes per evaluation."""
    num_envs: int = 8
    """Evaluation envs stepped together (no more than `episodes` are made)."""
    device_id: int | None = None
    """Device for evaluation inference; None uses the first actor device."""


@dataclass(frozen=True)
class SafetyConfig:
    """What the run does when something goes wrong."""

    watchdog_s: float = 60.0
    """Fail the run when an env.step (actor or evaluator) has not returned for this long (a
    rollout compiled into one call, `podrace.fused_rollout`, is allowed this per env step)."""
    on_nonfinite: Literal["stop", "skip"] = "stop"
    """NaN/inf loss or gradients: stop with an error, or skip that update and count it.
    Non-finite params are never published either way."""
    max_skipped_fraction: float = 0.1
    """With on_nonfinite=skip: fail the run once more than this fraction of its updates
    were skipped (a run that mostly skips has not trained)."""


@dataclass(frozen=True)
class CheckpointConfig:
    """When the run saves its state (into <run dir>/checkpoints) and how many it keeps."""

    every_updates: int = 0
    """Save every N learner updates (0: only at the end and when stopped by a signal)."""
    keep: int = 3
    """Checkpoints kept; older ones are deleted only after a newer one is complete."""


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
    """Where metrics go: the run directory (config.json, metrics.jsonl), console, loggers."""

    run_dir: str = "runs"
    """Parent folder of run directories."""
    run_name: str | None = None
    """Run directory name; default <preset>-s<seed>-<timestamp>."""
    interval_s: float = 2.0
    """Seconds between metric lines (console and metrics.jsonl)."""
    tensorboard: bool = False
    """Also write TensorBoard event files into the run directory."""
    console: Literal["progress", "lines", "none"] = "progress"
    """Live progress bar, plain lines, or nothing on the console (the bar falls back to
    plain lines when the console is not a terminal)."""
    wandb: bool = False
    """Also log to Weights & Biases (`pip install 'podrace[wandb]'`); same metric names."""
    wandb_project: str = "podrace"
    """Weights & Biases project of the run."""


@dataclass(frozen=True)
class TrainConfig:
    """A training run."""

    name: str = "custom"
    """Preset name (used in the run directory name)."""
    runtime: Literal["threads", "ray"] = "threads"
    """Where actors run: threads of this process, or Ray workers (`pip install podrace[ray]`,
    settings under --ray.*)."""
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
    normalize: NormalizeConfig = field(default_factory=NormalizeConfig)
    layout: LayoutConfig = field(default_factory=LayoutConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    safety: SafetyConfig = field(default_factory=SafetyConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    pbt: PBTConfig = field(default_factory=PBTConfig)

    # Derived sizes -------------------------------------------------------------------
    @property
    def num_actors(self) -> int:
        """Actor threads of this process; with Ray, the rollouts one update takes (one per
        worker in the fixed order)."""
        if self.runtime == "ray":
            # The rollouts of one update (validation refuses `auto` without a batch size).
            if self.ray.rollouts_per_update is not None:
                return self.ray.rollouts_per_update
            return self.ray.num_workers  # type: ignore[return-value]
        return len(self.layout.actor_device_ids) * self.layout.actors_per_device

    @property
    def num_processes(self) -> int:
        return self.distributed.num_processes or 1

    @property
    def steps_per_update(self) -> int:
        """Env steps consumed by one learner update (one rollout from every actor of every
        process)."""
        return self.num_processes * self.num_actors * self.env.num_envs * self.rollout_length

    @property
    def num_updates(self) -> int:
        return max(1, self.total_steps // self.steps_per_update)

    @property
    def max_policy_lag(self) -> int:
        return 0 if self.synchronous else self.layout.max_policy_lag

    @property
    def gamma(self) -> float:
        """Discount factor of the configured algorithm."""
        return self.ppo.gamma if self.algo == "ppo" else self.impala.gamma

    @property
    def synchronous(self) -> bool:
        return self.layout.synchronous or self.deterministic


def distributed_requested(cfg: TrainConfig) -> bool:
    """Several processes: a --distributed.* field is set, or JAX's coordinator variable is
    (then JAX also detects the process count and id from SLURM, Open MPI, Kubernetes...)."""
    return cfg.distributed.requested or bool(os.environ.get("JAX_COORDINATOR_ADDRESS"))


def leaves(cfg: object, prefix: str = "") -> Iterator[tuple[str, object, object]]:
    """(dotted name, value, annotated type) of every field of a config, nested ones included."""
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            yield from leaves(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", value, hints[f.name]


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


def resolved(cfg: TrainConfig) -> TrainConfig:
    """The config as the run will use it, so that config.json says what actually ran: what
    `deterministic` implies written into the layout (synchronous, lag bound 0), and the
    shorthand `--ray.envs-per-worker` written as env.num_envs."""
    if cfg.runtime == "ray" and cfg.ray.envs_per_worker is not None:
        cfg = replace(cfg, **{"env.num_envs": cfg.ray.envs_per_worker, "ray.envs_per_worker": None})
    return replace(
        cfg, **{"layout.synchronous": cfg.synchronous, "layout.max_policy_lag": cfg.max_policy_lag}
    )
