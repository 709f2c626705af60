"""Table of bad configurations: each is one clear line on stderr, exit code 2, nothing written."""

import dataclasses
import json

import pytest

from podrace.cli import main
from podrace.config import ConfigError, TrainConfig, replace, resolved

BAD = [
    (["--env.num-envs", "0"], "env.num_envs must be positive"),
    (["--rollout-length", "-1"], "rollout_length must be positive"),
    (["--total-steps", "0"], "total_steps must be positive"),
    (["--total-steps", "100"], "less than one update"),
    (["--layout.actors-per-device", "0"], "layout.actors_per_device must be positive"),
    (["--layout.queue-size", "0"], "layout.queue_size must be positive"),
    (["--layout.max-policy-lag", "-1"], "layout.max_policy_lag must be >= 0"),
    (["--layout.actor-device-ids", "9"], "device 9 does not exist, cpu has"),
    (["--layout.learner-device-ids", "11"], "device 11 does not exist"),
    (["--eval.device-id", "7"], "eval.device_id [7]: device 7 does not exist"),
    (["--layout.learner-device-ids", "0", "0"], "repeated device ids"),
    (["--layout.actor-device-ids", "-1"], "non-negative device ids"),
    (["--layout.actor-device-ids"], "layout.actor_device_ids must name at least one device"),
    (
        ["--layout.cpu-devices", "3", "--layout.learner-device-ids", "0", "1", "2"],
        "divisible by the number of learner devices",
    ),
    (["--layout.cpu-devices", "0"], "layout.cpu_devices must be positive"),
    (["--env.id", "NoSuchEnv-v0"], "unknown env id 'NoSuchEnv-v0'"),
    (["--env.id", "Taxi-v4", "--env.backend", "envpool"], "envpool"),
    (["--ppo.num-minibatches", "7"], "ppo.num_minibatches (7) must divide"),
    (["--ppo.num-epochs", "0"], "ppo.num_epochs must be positive"),
    (["--ppo.learning-rate", "-0.1"], "ppo.learning_rate must be positive"),
    (["--eval.episodes", "0"], "eval.episodes must be positive"),
    (["--eval.every-updates", "-2"], "eval.every_updates must be >= 0"),
    (["--log.interval-s", "0"], "log.interval_s must be in [0.05,"),
    (["--safety.watchdog-s", "0"], "safety.watchdog_s must be in [0.1,"),
    (["--network.hidden-sizes", "64", "0"], "network.hidden_sizes must be positive widths"),
    (["--env.sticky-action-prob", "1.5"], "env.sticky_action_prob must be in [0, 1]"),
    (["--env.max-episode-steps", "0"], "max_episode_steps"),
    (["--layout.platform", "tpu"], "layout.platform 'tpu' is not available"),
    (["--layout.actor-platform", "gpu"], "layout.actor_platform 'gpu' is not available"),
    (
        ["--layout.actor-platform", "cpu", "--layout.actor-device-ids", "6"],
        "device 6 does not exist, cpu has 4",
    ),
    (
        ["--layout.actor-platform", "cpu", "--eval.device-id", "6"],
        "eval.device_id [6]: device 6 does not exist",
    ),
    # conftest.py forces 4 CPU devices through XLA_FLAGS: the error names that setting.
    (
        ["--layout.actor-device-ids", "5"],
        "XLA_FLAGS already sets --xla_force_host_platform_device_count=4",
    ),
    # seeds, counts and sizes that overflow
    (["--seed", "-1"], "seed must be in [0, 2**31 - 1], got -1"),
    (["--seed", str(2**31)], "seed must be in [0, 2**31 - 1]"),
    (["--total-steps", str(10**12)], "more than the int32 step counter holds"),
    (["--total-steps", str(2**60)], "total_steps must be at most 2**53"),
    (["--env.num-envs", str(2**32)], "env.num_envs must be at most 2,147,483,647"),
    (["--rollout-length", "100000", "--env.num-envs", "100000"], "does not fit an int32 array"),
    (["--network.hidden-sizes", str(2**31)], "network.hidden_sizes must be at most"),
    (["--network.hidden-sizes", "200000", "200000"], "host memory has"),
    (
        ["--network.torso", "nature_cnn"],
        "network.torso nature_cnn cannot take observations of shape (4,)",
    ),
    (["--layout.cpu-devices", "100000"], "layout.cpu_devices must be at most 1024"),
    (["--layout.scan-unroll", "0"], "layout.scan_unroll must be positive"),
    (["--layout.actors-per-device", "100000"], "layout.actors_per_device must be at most 256"),
    # non-finite floats, wherever they are
    (["--ppo.learning-rate", "nan"], "ppo.learning_rate must be a finite number, got nan"),
    (["--log.interval-s", "inf"], "log.interval_s must be a finite number, got inf"),
    (["--safety.watchdog-s", "nan"], "safety.watchdog_s must be a finite number, got nan"),
    (["--env.sticky-action-prob", "nan"], "env.sticky_action_prob must be a finite number"),
    (["--impala.rho-bar", "inf"], "impala.rho_bar must be a finite number"),
    (["--ppo.ent-coef", "-inf"], "ppo.ent_coef must be a finite number"),
    (
        ["--safety.max-skipped-fraction", "nan"],
        "safety.max_skipped_fraction must be a finite number",
    ),
    # finite in Python, inf as the float32 JAX computes with
    (
        ["--ppo.max-grad-norm", "1e39"],
        "ppo.max_grad_norm must be at most 3.403e+38 in magnitude (float32), got 1e+39",
    ),
    (
        ["--ppo.learning-rate", "-1e39"],
        "ppo.learning_rate must be at most 3.403e+38 in magnitude (float32)",
    ),
    # out-of-range hyperparameters (the unused algorithm's too)
    (["--ppo.gamma", "1.5"], "ppo.gamma must be in [0, 1], got 1.5"),
    (["--ppo.gamma", "-0.1"], "ppo.gamma must be in [0, 1]"),
    (["--ppo.gae-lambda", "2"], "ppo.gae_lambda must be in [0, 1]"),
    (["--impala.vtrace-lambda", "-1"], "impala.vtrace_lambda must be in [0, 1]"),
    (["--impala.gamma", "1.01"], "impala.gamma must be in [0, 1]"),
    (["--ppo.clip-coef", "0"], "ppo.clip_coef must be positive"),
    (["--ppo.clip-coef", "-0.2"], "ppo.clip_coef must be positive"),
    (["--ppo.max-grad-norm", "0"], "ppo.max_grad_norm must be positive"),
    (["--ppo.vf-coef", "-1"], "ppo.vf_coef must be >= 0"),
    (["--ppo.ent-coef", "-0.01"], "ppo.ent_coef must be >= 0"),
    (["--impala.learning-rate", "0"], "impala.learning_rate must be positive"),
    (["--impala.rmsprop-decay", "1.5"], "impala.rmsprop_decay must be in [0, 1)"),
    (["--impala.rmsprop-eps", "0"], "impala.rmsprop_eps must be positive"),
    (["--impala.c-bar", "0"], "impala.c_bar must be positive"),
    (["--impala.num-minibatches", "0"], "impala.num_minibatches must be positive"),
    # timers too small or too large to wait on, limits outside their range
    (["--log.interval-s", "0.001"], "log.interval_s must be in [0.05,"),
    (["--log.interval-s", "1e12"], "log.interval_s must be in [0.05,"),
    (["--safety.watchdog-s", "1e-6"], "safety.watchdog_s must be in [0.1,"),
    (["--safety.max-skipped-fraction", "1.5"], "safety.max_skipped_fraction must be in [0, 1]"),
    (["--safety.max-skipped-fraction", "-0.1"], "safety.max_skipped_fraction must be in [0, 1]"),
    # names that would leave the run folder, or cannot be a file name
    (["--log.run-name", "../escape"], "log.run_name must be a plain folder name"),
    (["--log.run-name", "a/b"], "log.run_name must be a plain folder name"),
    (["--log.run-name", ".."], "log.run_name must be a plain folder name"),
    (["--log.run-name", "x" * 300], "log.run_name is 300 bytes long, at most 200"),
    (["--name", "../up"], "name must be a plain folder name"),
    (["--log.wandb-project", " "], "log.wandb_project must not be empty"),
    # Atari settings that make no sense for any env
    (["--env.frame-skip", "0"], "env.frame_skip must be positive"),
    (["--env.frame-stack", "-1"], "env.frame_stack must be positive"),
    (["--env.image-size", "0"], "env.image_size must be positive"),
    (["--env.noop-max", "-1"], "env.noop_max must be >= 0"),
    (["--env.max-episode-steps", "-5"], "env.max_episode_steps must be positive"),
    (["--env.id", " "], "env.id must not be empty"),
    # env worker processes and their inference threads
    (["--env.workers", "-1"], "env.workers must be >= 0, got -1"),
    (["--env.workers", "3"], "env.num_envs (64) must be a multiple of env.workers (3)"),
    (["--env.workers", "2", "--env.worker-restarts", "-1"], "env.worker_restarts must be >= 0"),
    (["--layout.inference", "server"], "layout.inference server serves env worker processes"),
    (
        ["--env.workers", "2", "--inference.max-batch", "8"],
        "inference.max_batch (8) must be at least one worker's envs (32), or 0",
    ),
    (["--env.workers", "2", "--inference.max-wait-ms", "-1"], "inference.max_wait_ms must be"),
    (["--env.workers", "2", "--inference.params-timeout-s", "0"], "must be positive, got 0.0"),
    (
        ["--env.workers", "2", "--normalize.obs"],
        "--normalize.obs with --env.workers needs --layout.synchronous",
    ),
    (
        ["--env.workers", "2", "--runtime", "ray"],
        "env.workers with --runtime ray needs --layout.inference server",
    ),
    (["--env.workers", "2048"], "env.workers must be at most 1024, got 2048"),
    (
        ["--env.workers", "2", "--network.core", "gru"],
        "env.workers does not carry a recurrent core's state (network.core gru)",
    ),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("flags,message", BAD, ids=[" ".join(f) for f, _ in BAD])
def test_bad_config(capsys, tmp_path, flags, message):
    runs = tmp_path / "runs"
    code = main(["train", "cartpole-ppo", "--log.run-dir", str(runs), *flags])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err
    assert len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.iterdir())


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "name", ["a" * 5000, "sub/" + "b" * 300], ids=["path-too-long", "name-too-long"]
)
def test_run_dir_the_file_system_cannot_hold_is_refused(capsys, tmp_path, name):
    code = main(["train", "cartpole-ppo", "--log.run-dir", str(tmp_path / name)])
    err = capsys.readouterr().err
    assert code == 2, err
    (line,) = err.strip().splitlines()
    assert (
        "cannot create run directory" in line and "File name too long" in line and len(line) < 300
    )
    assert not list(tmp_path.iterdir())


def test_run_dir_under_a_file_is_refused(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code = main(["train", "cartpole-ppo", "--log.run-dir", str(blocker / "runs")])
    err = capsys.readouterr().err
    assert code == 2 and "not a writable directory" in err
    assert blocker.read_text() == "not a directory"


def test_unparsable_flag_exits_2_in_one_line(capsys):
    code = main(["train", "cartpole-ppo", "--env.num-envs", "many"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "Error parsing --env.num-envs: invalid literal for int() with base 10: 'many'" in err


@pytest.mark.timeout(10)
def test_resolved_config_writes_what_deterministic_implies():
    cfg = replace(TrainConfig(), deterministic=True, **{"layout.max_policy_lag": 3})
    written = json.loads(json.dumps(dataclasses.asdict(resolved(cfg))))
    assert written["layout"]["synchronous"] is True
    assert written["layout"]["max_policy_lag"] == 0
    assert resolved(cfg).max_policy_lag == cfg.max_policy_lag == 0


BAD_PRESET = [
    # 2 actors x 16 envs on one learner shard: 3 minibatches do not divide 32 envs.
    (
        "cartpole-impala",
        ["--impala.num-minibatches", "3"],
        "impala.num_minibatches (3) must divide the envs per learner shard (32)",
    ),
    # 2 learner devices: 16 envs per shard.
    (
        "cartpole-impala",
        ["--impala.num-minibatches", "32", "--layout.learner-device-ids", "0", "1"],
        "impala.num_minibatches (32) must divide the envs per learner shard (16)",
    ),
    (
        "cartpole-impala",
        ["--impala.num-minibatches", "0"],
        "impala.num_minibatches must be positive",
    ),
    ("cartpole-impala", ["--impala.max-grad-norm", "0"], "impala.max_grad_norm must be positive"),
    ("cartpole-impala", ["--impala.rmsprop-eps", "-1"], "impala.rmsprop_eps must be positive"),
    ("cartpole-impala", ["--impala.rmsprop-decay", "1"], "impala.rmsprop_decay must be in [0, 1)"),
    # Image sizes the torso cannot see through, or the env cannot even describe.
    (
        "atari-ppo",
        ["--env.num-envs", "2", "--env.image-size", "35"],
        "network.torso nature_cnn cannot take observations of shape (4, 35, 35): its "
        "parameter params/torso/Dense_0/kernel would have shape (0, 512) (no inputs left)",
    ),
    (
        "atari-ppo",
        ["--env.num-envs", "2", "--env.image-size", "100000"],
        "env.image_size must be at most 1024 for Atari",
    ),
    (
        "atari-ppo",
        ["--env.num-envs", "2", "--env.frame-stack", "100000"],
        "env.frame_stack must be at most 256 for Atari, got 100000",
    ),
    (
        "atari-ppo",
        ["--env.num-envs", "65536", "--env.frame-stack", "64"],
        "(network.hidden_sizes, env.num_envs, rollout_length, env.image_size, env.frame_stack)",
    ),
]


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "preset,flags,message", BAD_PRESET, ids=[" ".join([p, *f]) for p, f, _ in BAD_PRESET]
)
def test_bad_preset_config(capsys, tmp_path, preset, flags, message):
    """The same contract for the other presets' own settings (IMPALA's optimizer, Atari's
    images)."""
    runs = tmp_path / "runs"
    code = main(["train", preset, "--log.run-dir", str(runs), *flags])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err
    assert len(err.strip().splitlines()) == 1, err
    assert not runs.exists()


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "section,field,value,message",
    [
        ("env", "num_envs", "lots", "config.env.num_envs must be int"),
        ("env", "num_envs", True, "config.env.num_envs must be int"),
        ("ppo", "learning_rate", "fast", "config.ppo.learning_rate must be float"),
        ("network", "hidden_sizes", [64, "x"], "config.network.hidden_sizes must be tuple"),
        ("layout", "synchronous", 1, "config.layout.synchronous must be bool"),
    ],
)
def test_a_stored_config_with_a_value_of_the_wrong_type_is_a_config_error(
    section, field, value, message
):
    """A damaged config.json or checkpoint meta: one line naming the field, not a TypeError
    later."""
    import dataclasses
    import json

    from podrace.config_dict import config_from_dict
    from podrace.presets import get

    data = json.loads(json.dumps(dataclasses.asdict(get("cartpole-ppo"))))
    data[section][field] = value
    with pytest.raises(ConfigError, match=message):
        config_from_dict(data)
