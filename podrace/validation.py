"""Everything that checks a config before a run starts, kept out of podrace.config so that
it holds only the config types; like them it imports no JAX, since the CLI validates before
it sets XLA flags."""

from __future__ import annotations

import dataclasses
import math
import re
import threading
import typing

from podrace.config import (
    ConfigError,
    DistributedConfig,
    RayConfig,
    TrainConfig,
    leaves,
    names_jax_package,
    resolved,
)
from podrace.config_dict import fits, type_name
from podrace.pbt.validation import validate_pbt

INT32_MAX = 2**31 - 1
"""Sizes, ids and counters end up in int32 arrays (shapes, env seeds, step counters)."""
FLOAT32_MAX = 3.4028234663852886e38
"""Every float setting reaches JAX as float32: a larger one would become inf there."""
MAX_TOTAL_STEPS = 2**53
"""Env-step counters are float64 in the metrics: exact up to 2**53."""
MAX_CPU_DEVICES = 1024
MAX_ENV_THREADS = 1024
"""envpool starts one OS thread per `env.num_threads`: more than this is a typo (2**31 of
them aborted the process instead of failing as a config error)."""
MAX_ENV_WORKERS = 1024
"""Each env worker is a process; more than this per actor is a typo."""
MAX_ACTORS_PER_DEVICE = 256
"""Each actor is an OS thread with its own envs; more than this is a typo, not a layout."""
MAX_RAY_WORKERS = 65_536
"""Ray workers (and rollouts per update): each is a process with a CPU; more is a typo."""
MIN_LOG_INTERVAL_S = 0.05
MIN_WATCHDOG_S = 0.1
MAX_WAIT_S = threading.TIMEOUT_MAX
"""Longest timeout a thread can wait on (larger ones raise OverflowError)."""
MAX_NAME_BYTES = 200
"""A run directory name, leaving room in a 255-byte file name for a uniqueness suffix."""


def _check_every_field(cfg: TrainConfig) -> None:
    """Checks that hold for every field: finite floats, ints that fit int32."""
    for name, value, _ in leaves(cfg):
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, float) and not math.isfinite(item):
                raise ConfigError(f"{name} must be a finite number, got {item}")
            if isinstance(item, float) and abs(item) > FLOAT32_MAX:
                raise ConfigError(
                    f"{name} must be at most {FLOAT32_MAX:.4g} in magnitude (float32), got {item:g}"
                )
            if isinstance(item, int) and not isinstance(item, bool) and name != "total_steps":
                if abs(item) > INT32_MAX:
                    raise ConfigError(
                        f"{name} must be at most {INT32_MAX:,} in magnitude, got {item:,}"
                    )
            if isinstance(item, str) and "\0" in item:
                raise ConfigError(f"{name} must not contain a NUL character")


def check_seed(name: str, seed: int) -> None:
    """Seeds end up in int32 env seeds and keys: [0, 2**31 - 1] (train's --seed, eval's --seed)."""
    if not 0 <= seed <= INT32_MAX:
        raise ConfigError(f"{name} must be in [0, 2**31 - 1], got {seed}")


def _check_folder_name(name: str, value: str) -> None:
    """A single folder name: no path separators, not '.' or '..', not only whitespace, not too
    long, and no control characters (a newline or escape in a path breaks logs, shells and
    scripts)."""
    if value in ("", ".", "..") or "/" in value or "\\" in value:
        raise ConfigError(
            f"{name} must be a plain folder name (no '/' or '\\', not '.' or '..'), got {value!r}"
        )
    if any(ord(char) < 32 or ord(char) == 127 for char in value):
        raise ConfigError(
            f"{name} must not contain control characters (newline, tab, escape...), got {value!r}"
        )
    if not value.strip():
        raise ConfigError(f"{name} must not be only whitespace, got {value!r}")
    size = len(value.encode("utf-8", "surrogateescape"))
    if size > MAX_NAME_BYTES:
        raise ConfigError(f"{name} is {size} bytes long, at most {MAX_NAME_BYTES} are allowed")


def _optimizer_steps_per_update(cfg: TrainConfig) -> int:
    if cfg.algo == "ppo":
        return cfg.ppo.num_epochs * cfg.ppo.num_minibatches
    return cfg.impala.num_minibatches


def _is_host_port(address: str) -> bool:
    host, sep, port = address.rpartition(":")
    return bool(sep and host.strip() and port.isdigit() and 0 < int(port) < 65536)


def _validate_ray(cfg: TrainConfig) -> None:
    ray = cfg.ray
    elastic = ray.data_order == "elastic"
    if ray.num_workers == "auto":
        if not elastic:
            raise ConfigError(
                "--ray.num-workers auto needs --ray.data-order elastic: the fixed order takes "
                "one rollout of every worker per update, so its workers cannot come and go"
            )
        if ray.rollouts_per_update is None:
            raise ConfigError(
                "--ray.num-workers auto needs --ray.rollouts-per-update N: the rollouts every "
                "update takes, whatever the number of workers"
            )
    elif ray.num_workers <= 0:
        raise ConfigError(f"ray.num_workers must be positive, got {ray.num_workers}")
    if ray.num_workers != "auto" and ray.num_workers > MAX_RAY_WORKERS:
        raise ConfigError(
            f"ray.num_workers must be at most {MAX_RAY_WORKERS}, got {ray.num_workers:,}"
        )
    if ray.max_workers is not None:
        if ray.num_workers != "auto":
            raise ConfigError(
                "--ray.max-workers caps --ray.num-workers auto; with a number of workers, "
                "leave it out"
            )
        if not 0 < ray.max_workers <= MAX_RAY_WORKERS:
            raise ConfigError(
                f"ray.max_workers must be in 1..{MAX_RAY_WORKERS}, got {ray.max_workers:,}"
            )
    if ray.rollouts_per_update is not None:
        if not elastic:
            raise ConfigError(
                "--ray.rollouts-per-update needs --ray.data-order elastic: the fixed order "
                "takes one rollout of every worker per update"
            )
        if not 0 < ray.rollouts_per_update <= MAX_RAY_WORKERS:
            raise ConfigError(
                f"ray.rollouts_per_update must be in 1..{MAX_RAY_WORKERS}, "
                f"got {ray.rollouts_per_update:,}"
            )
    if elastic and cfg.deterministic:
        raise ConfigError(
            "--deterministic needs --ray.data-order fixed: the elastic order takes rollouts "
            "in the order they arrive"
        )
    if elastic and cfg.normalize.reward:
        raise ConfigError(
            "--normalize.reward needs --ray.data-order fixed: its return tracker follows each "
            "env column from one update to the next, and in the elastic order a column holds "
            "whichever worker's rollout arrived"
        )
    if not 0 < ray.no_workers_timeout_s <= MAX_WAIT_S:
        raise ConfigError(
            f"ray.no_workers_timeout_s must be in (0, {MAX_WAIT_S:g}], "
            f"got {ray.no_workers_timeout_s}"
        )
    if ray.envs_per_worker is not None and ray.envs_per_worker <= 0:
        raise ConfigError(f"ray.envs_per_worker must be positive, got {ray.envs_per_worker}")
    if ray.max_restarts < 0:
        raise ConfigError(f"ray.max_restarts must be >= 0, got {ray.max_restarts}")
    if ray.start_timeout_s <= 0:
        raise ConfigError(f"ray.start_timeout_s must be positive, got {ray.start_timeout_s}")
    if ray.address is not None and not _is_host_port(ray.address):
        raise ConfigError(f"ray.address must be HOST:PORT of a Ray head node, got {ray.address!r}")
    worker_resources(ray)


def check_types(cfg: object, where: str = "") -> None:
    """Every field holds a value of its annotated type: a config built in Python (the CLI's
    parser and config.json are checked already) may hold anything, and a wrong type would
    fail later with a TypeError in the middle of the run's set-up, or not at all."""
    if not where and not isinstance(cfg, TrainConfig):
        raise ConfigError(
            "the config must be a TrainConfig (e.g. podrace.presets.get(name)), "
            f"got {type(cfg).__name__}"
        )
    hints = typing.get_type_hints(type(cfg))
    for field in dataclasses.fields(cfg):
        name, value, hint = f"{where}{field.name}", getattr(cfg, field.name), hints[field.name]
        if dataclasses.is_dataclass(hint):
            if type(value) is not hint:
                raise ConfigError(f"{name} must be {hint.__name__}, got {type(value).__name__}")
            check_types(value, f"{name}.")
        elif not fits(value, hint):
            raise ConfigError(f"{name} must be {type_name(hint)}, got {value!r:.80}")


def validate(cfg: TrainConfig) -> None:
    """Raise ConfigError for anything that cannot run; needs no devices and no JAX."""
    check_types(cfg)
    if cfg.runtime == "ray":
        _validate_ray(cfg)
    cfg = resolved(cfg)

    def positive(name: str, value: float) -> None:
        if value <= 0:
            raise ConfigError(f"{name} must be positive, got {value}")

    def non_negative(name: str, value: float) -> None:
        if value < 0:
            raise ConfigError(f"{name} must be >= 0, got {value}")

    def within(name: str, value: float, low: float, high: float) -> None:
        if not low <= value <= high:
            raise ConfigError(f"{name} must be in [{low:g}, {high:g}], got {value}")

    check_seed("seed", cfg.seed)
    _check_every_field(cfg)
    positive("total_steps", cfg.total_steps)
    if cfg.total_steps > MAX_TOTAL_STEPS:
        raise ConfigError(f"total_steps must be at most 2**53, got {cfg.total_steps:,}")
    _check_folder_name("name", cfg.name)
    positive("rollout_length", cfg.rollout_length)
    positive("env.num_envs", cfg.env.num_envs)
    if cfg.env.num_threads is not None:
        positive("env.num_threads", cfg.env.num_threads)
        if cfg.env.num_threads > MAX_ENV_THREADS:
            raise ConfigError(
                f"env.num_threads must be at most {MAX_ENV_THREADS}, got {cfg.env.num_threads:,}"
            )
    positive("layout.actors_per_device", cfg.layout.actors_per_device)
    if cfg.layout.actors_per_device > MAX_ACTORS_PER_DEVICE:
        raise ConfigError(
            f"layout.actors_per_device must be at most {MAX_ACTORS_PER_DEVICE} (one thread each), "
            f"got {cfg.layout.actors_per_device}"
        )
    positive("layout.queue_size", cfg.layout.queue_size)
    positive("layout.scan_unroll", cfg.layout.scan_unroll)
    positive("layout.cpu_devices", cfg.layout.cpu_devices)
    if cfg.layout.cpu_devices > MAX_CPU_DEVICES:
        raise ConfigError(
            f"layout.cpu_devices must be at most {MAX_CPU_DEVICES}, got {cfg.layout.cpu_devices}"
        )
    positive("eval.episodes", cfg.eval.episodes)
    positive("eval.num_envs", cfg.eval.num_envs)
    within("log.interval_s", cfg.log.interval_s, MIN_LOG_INTERVAL_S, MAX_WAIT_S)
    within("safety.watchdog_s", cfg.safety.watchdog_s, MIN_WATCHDOG_S, MAX_WAIT_S)
    within("safety.max_skipped_fraction", cfg.safety.max_skipped_fraction, 0.0, 1.0)
    if cfg.log.run_name is not None:
        _check_folder_name("log.run_name", cfg.log.run_name)
    if not cfg.log.wandb_project.strip():
        raise ConfigError("log.wandb_project must not be empty")
    positive("normalize.obs_clip", cfg.normalize.obs_clip)
    positive("normalize.reward_clip", cfg.normalize.reward_clip)
    if not cfg.log.run_dir.strip():  # Path("") is the working directory: say "." for that
        raise ConfigError(
            'log.run_dir must name a folder ("." for the working directory), '
            f"got {cfg.log.run_dir!r}"
        )
    positive("checkpoint.keep", cfg.checkpoint.keep)
    non_negative("checkpoint.every_updates", cfg.checkpoint.every_updates)
    non_negative("eval.every_updates", cfg.eval.every_updates)
    non_negative("layout.max_policy_lag", cfg.layout.max_policy_lag)
    if not cfg.env.id.strip():
        raise ConfigError("env.id must not be empty")
    if cfg.env.max_episode_steps is not None:
        positive("env.max_episode_steps", cfg.env.max_episode_steps)
    positive("env.frame_skip", cfg.env.frame_skip)
    positive("env.frame_stack", cfg.env.frame_stack)
    positive("env.image_size", cfg.env.image_size)
    non_negative("env.noop_max", cfg.env.noop_max)
    within("env.sticky_action_prob", cfg.env.sticky_action_prob, 0.0, 1.0)
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
        raise ConfigError(
            f"eval.device_id must be a non-negative device id, got {cfg.eval.device_id}"
        )
    if not cfg.network.hidden_sizes or any(h <= 0 for h in cfg.network.hidden_sizes):
        raise ConfigError(
            f"network.hidden_sizes must be positive widths, got {list(cfg.network.hidden_sizes)}"
        )
    positive("network.core_size", cfg.network.core_size)
    indices = cfg.env.obs_indices
    if indices is not None and (not indices or min(indices) < 0):
        raise ConfigError(
            f"env.obs_indices must name at least one entry, each >= 0, got {list(indices)}"
        )
    if indices is not None and len(set(indices)) < len(indices):
        twice = next(i for i in indices if indices.count(i) > 1)
        raise ConfigError(
            f"env.obs_indices names entry {twice} twice, got {list(indices)}: each entry is kept "
            "once"
        )
    _validate_algos(cfg)
    _validate_sizes(cfg)
    _validate_workers(cfg)
    validate_pbt(cfg)


def _validate_algos(cfg: TrainConfig) -> None:
    """Hyperparameters of both algorithms (an unused one must still make sense)."""
    ppo, impala = cfg.ppo, cfg.impala
    checks = [
        ("ppo.learning_rate", ppo.learning_rate, "positive"),
        ("ppo.gamma", ppo.gamma, "unit"),
        ("ppo.gae_lambda", ppo.gae_lambda, "unit"),
        ("ppo.num_epochs", ppo.num_epochs, "positive"),
        ("ppo.num_minibatches", ppo.num_minibatches, "positive"),
        ("ppo.clip_coef", ppo.clip_coef, "positive"),
        ("ppo.vf_coef", ppo.vf_coef, "non-negative"),
        ("ppo.ent_coef", ppo.ent_coef, "non-negative"),
        ("ppo.max_grad_norm", ppo.max_grad_norm, "positive"),
        ("impala.learning_rate", impala.learning_rate, "positive"),
        ("impala.gamma", impala.gamma, "unit"),
        ("impala.vtrace_lambda", impala.vtrace_lambda, "unit"),
        ("impala.rho_bar", impala.rho_bar, "positive"),
        ("impala.c_bar", impala.c_bar, "positive"),
        ("impala.vf_coef", impala.vf_coef, "non-negative"),
        ("impala.ent_coef", impala.ent_coef, "non-negative"),
        ("impala.max_grad_norm", impala.max_grad_norm, "positive"),
        ("impala.rmsprop_decay", impala.rmsprop_decay, "below one"),
        ("impala.rmsprop_eps", impala.rmsprop_eps, "positive"),
        ("impala.num_minibatches", impala.num_minibatches, "positive"),
    ]
    for name, value, rule in checks:
        if rule == "positive" and value <= 0:
            raise ConfigError(f"{name} must be positive, got {value}")
        if rule == "non-negative" and value < 0:
            raise ConfigError(f"{name} must be >= 0, got {value}")
        if rule == "unit" and not 0 <= value <= 1:
            raise ConfigError(f"{name} must be in [0, 1], got {value}")
        if rule == "below one" and not 0 <= value < 1:
            raise ConfigError(f"{name} must be in [0, 1), got {value}")


def _validate_sizes(cfg: TrainConfig) -> None:
    """Sizes that depend on several fields: divisibility, and counters that fit int32."""
    num_learners = len(cfg.layout.learner_device_ids)
    if cfg.env.num_envs % num_learners:
        raise ConfigError(
            f"env.num_envs ({cfg.env.num_envs}) must be divisible by the number of learner "
            f"devices ({num_learners}): each actor's rollout is split evenly across them"
        )
    if cfg.steps_per_update > INT32_MAX:
        raise ConfigError(
            f"one update of {cfg.num_actors} actors x {cfg.env.num_envs} envs x "
            f"{cfg.rollout_length} steps = {cfg.steps_per_update:,} samples does not fit an "
            "int32 array"
        )
    validate_distributed(cfg.distributed)
    if cfg.total_steps < cfg.steps_per_update:
        processes = f"{cfg.num_processes} processes x " if cfg.num_processes > 1 else ""
        raise ConfigError(
            f"total_steps ({cfg.total_steps}) is less than one update "
            f"({processes}{cfg.num_actors} actors x {cfg.env.num_envs} envs x "
            f"{cfg.rollout_length} steps = {cfg.steps_per_update})"
        )
    optimizer_steps = cfg.num_updates * _optimizer_steps_per_update(cfg)
    if optimizer_steps > INT32_MAX:
        raise ConfigError(
            f"total_steps ({cfg.total_steps:,}) means {optimizer_steps:,} optimizer steps, more "
            f"than the int32 step counter holds ({INT32_MAX:,}); use fewer steps or larger updates"
        )
    envs_per_shard = cfg.num_actors * cfg.env.num_envs // num_learners
    if cfg.algo == "ppo" and cfg.network.core != "none":
        if envs_per_shard % cfg.ppo.num_minibatches:
            raise ConfigError(
                f"ppo.num_minibatches ({cfg.ppo.num_minibatches}) must divide the envs per "
                f"learner shard ({envs_per_shard}): with a recurrent core (network.core "
                f"{cfg.network.core}) every minibatch takes whole env sequences from every shard"
            )
    elif cfg.algo == "ppo":
        if cfg.rollout_length % cfg.ppo.num_minibatches:
            raise ConfigError(
                f"ppo.num_minibatches ({cfg.ppo.num_minibatches}) must divide rollout_length "
                f"({cfg.rollout_length}): every env deals its steps evenly to the minibatches"
            )
    elif envs_per_shard % cfg.impala.num_minibatches:
        raise ConfigError(
            f"impala.num_minibatches ({cfg.impala.num_minibatches}) must divide the envs per "
            f"learner shard ({envs_per_shard}): every minibatch takes whole env sequences from "
            "every shard"
        )


def _validate_workers(cfg: TrainConfig) -> None:
    """Env worker processes and the inference threads that serve them."""
    workers, inference = cfg.env.workers, cfg.inference
    if workers < 0:
        raise ConfigError(f"env.workers must be >= 0, got {workers}")
    if cfg.env.worker_restarts < 0:
        raise ConfigError(f"env.worker_restarts must be >= 0, got {cfg.env.worker_restarts}")
    if inference.max_batch < 0:
        raise ConfigError(f"inference.max_batch must be >= 0, got {inference.max_batch}")
    if not 0 <= inference.max_wait_ms <= MAX_WAIT_S * 1000:
        raise ConfigError(f"inference.max_wait_ms must be >= 0, got {inference.max_wait_ms}")
    if inference.params_timeout_s is not None and not (
        0 < inference.params_timeout_s <= MAX_WAIT_S
    ):
        raise ConfigError(
            f"inference.params_timeout_s must be positive, got {inference.params_timeout_s}"
        )
    if workers == 0:
        if cfg.layout.inference == "server":
            raise ConfigError(
                "layout.inference server serves env worker processes: set --env.workers >= 1"
            )
        return
    if workers > MAX_ENV_WORKERS:
        raise ConfigError(f"env.workers must be at most {MAX_ENV_WORKERS}, got {workers}")
    if cfg.env.backend == "jax" or names_jax_package(cfg.env.id):
        raise ConfigError(
            "env.workers steps host envs in processes; envs of the jax backend run on the "
            "actor's device, in its compiled rollout: use --env.workers 0"
        )
    if cfg.network.core != "none":
        # The inference threads' batched policy call is feed-forward: it keeps no core
        # state per env between requests.
        raise ConfigError(
            f"env.workers does not carry a recurrent core's state (network.core "
            f"{cfg.network.core}): use --env.workers 0 or --network.core none"
        )
    if cfg.env.num_envs % workers:
        raise ConfigError(
            f"env.num_envs ({cfg.env.num_envs}) must be a multiple of env.workers ({workers}): "
            "each env worker steps an equal part of an actor's envs"
        )
    if inference.max_batch and inference.max_batch < cfg.env.num_envs // workers:
        raise ConfigError(
            f"inference.max_batch ({inference.max_batch}) must be at least one worker's envs "
            f"({cfg.env.num_envs // workers}), or 0"
        )
    if cfg.runtime == "ray" and cfg.layout.inference != "server":
        raise ConfigError(
            "env.workers with --runtime ray needs --layout.inference server: env-only Ray "
            "workers served from the learner's host (Ray actor workers step their own envs)"
        )
    if cfg.normalize.obs and not cfg.synchronous:
        raise ConfigError(
            "--normalize.obs with --env.workers needs --layout.synchronous: the inference "
            "thread acts with the newest params at every step, and the learner normalizes a "
            "rollout with one version's statistics"
        )


def validate_distributed(d: DistributedConfig) -> None:
    """The distributed fields that are set must make sense; unset ones are JAX's to detect."""
    if d.coordinator is not None:
        host, _, port = d.coordinator.rpartition(":")
        if not host or not re.fullmatch(r"[0-9]{1,5}", port) or not 0 < int(port) < 65536:
            raise ConfigError(f"distributed.coordinator must be HOST:PORT, got '{d.coordinator}'")
    if d.num_processes is not None and d.num_processes < 1:
        raise ConfigError(f"distributed.num_processes must be positive, got {d.num_processes}")
    if (d.num_processes is None) != (d.process_id is None):
        raise ConfigError(
            "distributed.num_processes and distributed.process_id must be given together"
        )
    if d.process_id is not None and not 0 <= d.process_id < d.num_processes:
        raise ConfigError(
            f"distributed.process_id must be in 0..{d.num_processes - 1}, got {d.process_id}"
        )
    if d.init_timeout_s <= 0:
        raise ConfigError(f"distributed.init_timeout_s must be positive, got {d.init_timeout_s}")
    if d.peer_timeout_s <= 0:
        raise ConfigError(f"distributed.peer_timeout_s must be positive, got {d.peer_timeout_s}")


def worker_resources(ray: RayConfig) -> dict[str, float]:
    """`--ray.worker-resources` as a dict; ConfigError for a malformed entry."""
    out: dict[str, float] = {}
    for entry in ray.worker_resources:
        name, sep, amount = entry.partition("=")
        try:
            value = float(amount)
        except ValueError:
            value = -1.0
        if not sep or not name or not 0 < value < math.inf or name in ("CPU", "GPU", "memory"):
            raise ConfigError(
                "ray.worker_resources entries must be NAME=AMOUNT with a custom resource name "
                f"and a positive amount, got {entry!r}"
            )
        out[name] = value
    return out
