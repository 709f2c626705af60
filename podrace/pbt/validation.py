"""Checks of `--pbt.*` before anything starts (called by `podrace.validation.validate`)."""

from __future__ import annotations

from podrace.config import ConfigError, TrainConfig, distributed_requested
from podrace.pbt.config import MUTABLE

MAX_POPULATION = 256
"""Each member is a learner in this process (and its actor threads or Ray workers): more is
a typo."""


def validate_pbt(cfg: TrainConfig) -> None:
    """ConfigError (one line) for `--pbt.*` values that cannot run; population 1 (no PBT)
    checks only that the population is positive."""
    pbt = cfg.pbt
    if not 1 <= pbt.population <= MAX_POPULATION:
        raise ConfigError(f"pbt.population must be in [1, {MAX_POPULATION}], got {pbt.population}")
    if pbt.population == 1:
        return
    if pbt.member is not None and not 0 <= pbt.member < pbt.population:
        raise ConfigError(f"pbt.member must be in [0, {pbt.population - 1}], got {pbt.member}")
    if distributed_requested(cfg) or (cfg.runtime == "threads" and cfg.env.workers):
        what = "--distributed.*" if distributed_requested(cfg) else "--env.workers"
        raise ConfigError(
            f"--pbt.population runs its members in one process (no {what} yet): actor "
            "threads (--runtime threads) or Ray workers (--runtime ray)"
        )
    if cfg.runtime == "ray":
        _validate_ray_population(cfg)
    if cfg.seed + pbt.population - 1 > 2**31 - 1:
        raise ConfigError(
            f"seed must be at most 2**31 - {pbt.population} with --pbt.population "
            f"{pbt.population} (member i runs with seed + i), got {cfg.seed}"
        )
    if pbt.interval_steps < cfg.steps_per_update:
        raise ConfigError(
            f"pbt.interval_steps must be at least one update's env steps "
            f"({cfg.steps_per_update:,}), got {pbt.interval_steps:,}"
        )
    if pbt.interval_steps > cfg.total_steps:
        raise ConfigError(
            f"pbt.interval_steps must be at most total_steps ({cfg.total_steps:,}): a member "
            f"is ranked at the end of each of its intervals, got {pbt.interval_steps:,}"
        )
    if not pbt.metric.strip() or pbt.metric.strip() == "info/":
        raise ConfigError("pbt.metric must name a metric, e.g. eval/return")
    if not is_metric_name(pbt.metric):
        raise ConfigError(
            f"pbt.metric {pbt.metric} is not a metric a run logs: eval/return, "
            "episode/return, info/<key> or another name of docs/guides/metrics.md"
        )
    if pbt.metric == "eval/return" and not cfg.eval.every_updates:
        raise ConfigError(
            "pbt.metric eval/return needs evaluations during the run: set --eval.every-updates "
            "(or rank on another metric, e.g. --pbt.metric episode/return)"
        )
    if not 0 < pbt.bottom_fraction <= 0.5:
        raise ConfigError(f"pbt.bottom_fraction must be in (0, 0.5], got {pbt.bottom_fraction}")
    if not pbt.perturb_factors or any(f <= 0 for f in pbt.perturb_factors):
        raise ConfigError(
            f"pbt.perturb_factors must be positive numbers, got {list(pbt.perturb_factors)}"
        )
    if not 0 <= pbt.resample_probability <= 1:
        raise ConfigError(
            f"pbt.resample_probability must be in [0, 1], got {pbt.resample_probability}"
        )
    allowed = MUTABLE[cfg.algo]
    names = pbt.mutated(cfg.algo)
    unknown = [name for name in names if name not in allowed]
    if unknown or not names or len(set(names)) < len(names):
        raise ConfigError(
            f"pbt.mutate must name {cfg.algo} hyperparameters, each once, of: "
            f"{', '.join(allowed)}; got {list(names)}"
        )
    algo_cfg = cfg.ppo if cfg.algo == "ppo" else cfg.impala
    for name in names:
        value, bounds = getattr(algo_cfg, name), allowed[name]
        if not bounds.low <= value <= bounds.high:
            raise ConfigError(
                f"{cfg.algo}.{name} must be in [{bounds.low:g}, {bounds.high:g}] for a "
                f"population to change it, got {value:g} (or leave it out of --pbt.mutate)"
            )


TOP_LEVEL_METRICS = frozenset({"env_steps", "sps", "time_s", "version", "episodes"})
"""The metric names a run logs outside a family (`family/name`)."""

METRIC_FAMILIES = frozenset(
    {"learner", "lag", "actor", "server", "env", "sync", "checkpoint", "ray", "pbt", "info"}
)
"""Families (`family/...`) of metric names; `eval/` and `episode/` are checked by name."""

EVAL_AND_EPISODE_METRICS = frozenset(
    {"eval/return", "eval/version", "eval/dropped_requests", "episode/return", "episode/length"}
)


def is_metric_name(metric: str) -> bool:
    """Whether a run's metric lines can hold `metric` (docs/guides/metrics.md): a typo
    would leave every member unranked, a population that never exploits."""
    family, _, rest = metric.partition("/")
    if not rest:
        return metric in TOP_LEVEL_METRICS
    return metric in EVAL_AND_EPISODE_METRICS or family in METRIC_FAMILIES


def _validate_ray_population(cfg: TrainConfig) -> None:
    """A Ray population: every member has --ray.num-workers Ray workers of its own."""
    if cfg.layout.inference == "server":
        raise ConfigError(
            "--pbt.population with --runtime ray runs each member's actors as Ray workers: "
            "leave out --layout.inference server"
        )
    if cfg.ray.num_workers == "auto":
        raise ConfigError(
            "--pbt.population with --runtime ray needs a number of workers per member: "
            "--ray.num-workers N (not auto)"
        )


def check_info_metric(cfg: TrainConfig, backend: str | None) -> None:
    """ConfigError when `--pbt.metric info/<key>` names a value envs of `backend` never
    report (None: the caller's env factory, whose info is read)."""
    metric = cfg.pbt.metric
    if cfg.pbt.population > 1 and metric.startswith("info/") and backend in ("envpool", "jax"):
        raise ConfigError(
            f"pbt.metric {metric} ranks on a value the env reports in its info, which only "
            f"Gymnasium envs and env factories report; {cfg.env.id!r} runs on {backend} "
            "(try --env.backend gymnasium)"
        )


__all__ = ["MAX_POPULATION", "check_info_metric", "is_metric_name", "validate_pbt"]
