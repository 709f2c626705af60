"""Table of bad configurations: each is one clear line on stderr, exit code 2, nothing written."""

import pytest

from podrace.cli import main

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
    (["--layout.cpu-devices", "3", "--layout.learner-device-ids", "0", "1", "2"], "divisible by the number of learner devices"),
    (["--layout.cpu-devices", "0"], "layout.cpu_devices must be positive"),
    (["--env.id", "NoSuchEnv-v0"], "unknown env id 'NoSuchEnv-v0'"),
    (["--env.id", "Taxi-v4", "--env.backend", "envpool"], "envpool"),
    (["--ppo.num-minibatches", "7"], "ppo.num_minibatches (7) must divide"),
    (["--ppo.num-epochs", "0"], "ppo.num_epochs must be positive"),
    (["--ppo.learning-rate", "-0.1"], "ppo.learning_rate must be positive"),
    (["--eval.episodes", "0"], "eval.episodes must be positive"),
    (["--eval.every-updates", "-2"], "eval.every_updates must be >= 0"),
    (["--log.interval-s", "0"], "log.interval_s must be positive"),
    (["--safety.watchdog-s", "0"], "safety.watchdog_s must be positive"),
    (["--network.hidden-sizes", "64", "0"], "network.hidden_sizes must be positive widths"),
    (["--env.sticky-action-prob", "1.5"], "env.sticky_action_prob must be in [0, 1]"),
    (["--env.max-episode-steps", "0"], "max_episode_steps"),
    (["--layout.platform", "tpu"], "layout.platform 'tpu' is not available"),
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
    assert not runs.exists()


def test_run_dir_under_a_file_is_refused(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code = main(["train", "cartpole-ppo", "--log.run-dir", str(blocker / "runs")])
    err = capsys.readouterr().err
    assert code == 2 and "not a writable directory" in err
    assert blocker.read_text() == "not a directory"


def test_unparsable_flag_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["train", "cartpole-ppo", "--env.num-envs", "many"])
    assert exc.value.code == 2


BAD_IMPALA = [
    # 2 actors x 16 envs on one learner shard: 3 minibatches do not divide 32 envs.
    (["--impala.num-minibatches", "3"], "impala.num_minibatches (3) must divide the envs per learner shard (32)"),
    (["--impala.num-minibatches", "0"], "impala.num_minibatches must be positive"),
    (["--impala.max-grad-norm", "0"], "impala.max_grad_norm must be positive"),
    (["--impala.rmsprop-eps", "-1"], "impala.rmsprop_eps must be >= 0"),
    (["--impala.rmsprop-decay", "1"], "impala.rmsprop_decay must be in [0, 1)"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("flags,message", BAD_IMPALA, ids=[" ".join(f) for f, _ in BAD_IMPALA])
def test_bad_impala_config(capsys, tmp_path, flags, message):
    """The same contract for the IMPALA preset's own settings."""
    runs = tmp_path / "runs"
    code = main(["train", "cartpole-impala", "--log.run-dir", str(runs), *flags])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err
    assert len(err.strip().splitlines()) == 1, err
    assert not runs.exists()
