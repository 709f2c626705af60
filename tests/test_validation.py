"""validate() called from Python: values the CLI cannot pass, every float field, every preset,
and Ray settings that must be refused before Ray starts."""

import re

import numpy as np
import pytest

from podrace.config import ConfigError, PPOConfig, TrainConfig, replace
from podrace.config import leaves as _leaves
from podrace.validation import validate

# Values only the Python API can pass (tyro refuses them on the command line).
PYTHON_ONLY = [
    ({"layout.platform": "xpu"}, "layout.platform must be one of cpu, gpu, tpu, None, got 'xpu'"),
    ({"algo": "dqn"}, "algo must be one of ppo, impala, got 'dqn'"),
    ({"log.console": "fancy"}, "log.console must be one of progress, lines, none"),
    ({"safety.on_nonfinite": "ignore"}, "safety.on_nonfinite must be one of stop, skip"),
    ({"log.run_dir": "runs\0x"}, "log.run_dir must not contain a NUL character"),
    ({"log.run_name": ""}, "log.run_name must be a plain folder name"),
    ({"log.run_name": "a\\b"}, "log.run_name must be a plain folder name"),
    ({"log.run_name": "a\nb"}, "log.run_name must not contain control characters"),
    ({"log.run_name": "a\tb"}, "log.run_name must not contain control characters"),
    ({"log.run_name": "\x1b[31m"}, "log.run_name must not contain control characters"),
    ({"log.run_name": "\u00e9" * 101}, "log.run_name is 202 bytes long"),
    ({"ppo.learning_rate": float("inf")}, "ppo.learning_rate must be a finite number"),
    # Wrong types from the Python API: a ConfigError here, not a TypeError deep in the
    # set-up or a run that goes on with them.
    ({"seed": "1"}, "seed must be int, got '1'"),
    ({"seed": np.int64(1)}, "seed must be int, got np.int64(1)"),  # config.json could not hold it
    ({"env.id": None}, "env.id must be str, got None"),
    ({"ppo.anneal_lr": "no"}, "ppo.anneal_lr must be bool, got 'no'"),
    ({"ppo.anneal_lr": 1}, "ppo.anneal_lr must be bool, got 1"),
    ({"total_steps": 1e6}, "total_steps must be int, got 1000000.0"),
    (
        {"network.hidden_sizes": [64, 64]},
        "network.hidden_sizes must be tuple[int, ...], got [64, 64]",
    ),
    (
        {"layout.actor_device_ids": (0, "1")},
        "layout.actor_device_ids must be tuple[int, ...], got (0, '1')",
    ),
    ({"env.num_threads": 2.0}, "env.num_threads must be int | None, got 2.0"),
    ({"env": {"id": "CartPole-v1"}}, "env must be EnvConfig, got dict"),
    ({"eval": PPOConfig()}, "eval must be EvalConfig, got PPOConfig"),
    # a ConfigError, not a raw ValueError from comparing an array
    (
        {"algo": np.array(["ppo", "ppo"])},
        "algo must be one of ppo, impala, got array(['ppo', 'ppo']",
    ),
    # refused, though the array compares equal to a valid choice
    (
        {"log.console": np.array("none")},
        "log.console must be one of progress, lines, none, got array('none'",
    ),
]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("changes,message", PYTHON_ONLY, ids=[str(c) for c, _ in PYTHON_ONLY])
def test_bad_config_from_python(changes, message):
    with pytest.raises(ConfigError) as exc:
        validate(replace(TrainConfig(), **changes))
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)


@pytest.mark.timeout(10)
def test_a_config_that_is_no_train_config_is_one_line():
    with pytest.raises(
        ConfigError,
        match=r"^the config must be a TrainConfig \(e.g. podrace.presets.get\(name\)\), got dict$",
    ):
        validate({"seed": 1})


@pytest.mark.timeout(60)
def test_podrace_train_checks_types_before_it_reads_the_config(tmp_path):
    import podrace

    cfg = replace(TrainConfig(), **{"log.run_dir": str(tmp_path), "env": "CartPole-v1"})
    with pytest.raises(ConfigError, match="^env must be EnvConfig, got str$"):
        podrace.train(cfg, env_factory=lambda n, s: None)
    assert not list(tmp_path.iterdir())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", [" ", "   ", "\u3000\u00a0"])
def test_a_run_name_of_only_whitespace_is_refused_before_anything_is_created(
    capsys, tmp_path, name
):
    from podrace.cli import main

    with pytest.raises(
        ConfigError, match=re.escape(f"log.run_name must not be only whitespace, got {name!r}")
    ):
        validate(replace(TrainConfig(), **{"log.run_name": name}))
    code = main(["train", "cartpole-ppo", "--log.run-dir", str(tmp_path), "--log.run-name", name])
    err = capsys.readouterr().err
    assert (
        code == 2
        and err == f"podrace: error: log.run_name must not be only whitespace, got {name!r}\n"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(10)
def test_every_float_field_is_checked_for_finiteness():
    """Walk the config generically: a NaN in any float field (present or future) is refused."""
    floats = [name for name, value, _ in _leaves(TrainConfig()) if isinstance(value, float)]
    assert len(floats) > 20
    for name in floats:
        with pytest.raises(ConfigError, match=f"{name} must be a finite number"):
            validate(replace(TrainConfig(), **{name: float("nan")}))
        with pytest.raises(
            ConfigError, match=f"{name} must be at most .* in magnitude \\(float32\\)"
        ):
            validate(replace(TrainConfig(), **{name: -1e39}))


@pytest.mark.timeout(10)
def test_every_preset_is_valid():
    from podrace.presets import PRESETS

    for _, cfg in PRESETS.values():
        validate(cfg)


@pytest.mark.timeout(30)
def test_ray_values_that_would_reach_ray_are_config_errors():
    """A non-finite resource amount and an address whose host is empty or whose port is not
    a port fail validation, before anything starts (or hangs joining) Ray."""
    from podrace.presets import PRESETS

    base = replace(PRESETS["cartpole-ppo"][1], runtime="ray")
    for changes, expected in [
        ({"ray.worker_resources": ("x=nan",)}, "positive amount"),
        ({"ray.worker_resources": ("x=inf",)}, "positive amount"),
        ({"ray.address": ":"}, "HOST:PORT"),
        ({"ray.address": ":6379"}, "HOST:PORT"),
        ({"ray.address": "127.0.0.1:99999"}, "HOST:PORT"),
        ({"ray.address": "127.0.0.1:0"}, "HOST:PORT"),
        ({"ray.address": "127.0.0.1:port"}, "HOST:PORT"),
    ]:
        with pytest.raises(ConfigError, match=expected) as caught:
            validate(replace(base, **changes))
        assert "\n" not in str(caught.value)


RECURRENT = [
    ({"network.core": "rnn"}, "network.core must be one of none, lstm, gru, got 'rnn'"),
    ({"network.core": "lstm", "network.core_size": 0}, "network.core_size must be positive"),
    ({"env.obs_indices": ()}, "env.obs_indices must name at least one entry, each >= 0, got []"),
    ({"env.obs_indices": (0, -1)}, "env.obs_indices must name at least one entry"),
    ({"env.obs_indices": (2, 0, 2)}, "env.obs_indices names entry 2 twice, got [2, 0, 2]"),
    ({"env.obs_indices": [0, 2]}, "env.obs_indices must be tuple[int, ...] | None"),
    # TrainConfig(): 2 actors x 8 envs on one learner, rollouts of 32
    (
        {"network.core": "lstm", "ppo.num_minibatches": 32},
        "ppo.num_minibatches (32) must divide the envs per learner shard (16): with a "
        "recurrent core (network.core lstm) every minibatch takes whole env sequences",
    ),
]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("changes,message", RECURRENT, ids=[str(c) for c, _ in RECURRENT])
def test_recurrent_settings_that_cannot_run(changes, message):
    with pytest.raises(ConfigError) as exc:
        validate(replace(TrainConfig(), **changes))
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)


@pytest.mark.timeout(10)
def test_recurrent_ppo_minibatches_split_envs_not_steps():
    """Without a core PPO deals every env's steps to the minibatches; with one, whole envs
    (2 actors x 8 envs: 16 of them)."""
    base = replace(TrainConfig(), **{"rollout_length": 32, "env.num_envs": 8})
    validate(replace(base, **{"ppo.num_minibatches": 32}))
    validate(replace(base, **{"network.core": "gru", "ppo.num_minibatches": 16}))
    with pytest.raises(ConfigError, match="must divide rollout_length"):
        validate(replace(base, **{"ppo.num_minibatches": 3}))
