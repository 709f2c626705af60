"""The public Python API: cheap import, lazy names, presets.get, podrace.train's validation,
and the mujoco-ppo preset."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import podrace
from podrace.presets import PRESETS
from tests.helpers.cli import run_python


@pytest.mark.timeout(60)
def test_import_and_configs_do_not_import_jax():
    code = (
        "import sys, dataclasses, podrace, podrace.validation\n"
        "cfg = podrace.presets.get('cartpole-ppo')\n"
        "cfg = dataclasses.replace(cfg, env=podrace.EnvConfig(id='CartPole-v1'), "
        "layout=podrace.LayoutConfig())\n"
        "podrace.validation.validate(cfg); podrace.TrainConfig; podrace.ConfigError\n"
        "heavy = sorted({'jax', 'numpy', 'gymnasium', 'envpool', 'flax'} & set(sys.modules))\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.timeout(60)
def test_every_public_name_resolves():
    for name in podrace.__all__:
        assert getattr(podrace, name) is not None, name
    assert podrace.TrainConfig is podrace.config.TrainConfig
    assert podrace.sync.LocalPublisher is not None and podrace.sync.Snapshot is not None
    assert set(podrace.__all__) <= set(dir(podrace))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        podrace.nope  # noqa: B018


@pytest.mark.timeout(30)
def test_presets_get_returns_a_config_to_replace():
    cfg = podrace.presets.get("cartpole-ppo")
    assert isinstance(cfg, podrace.TrainConfig) and cfg is PRESETS["cartpole-ppo"][1]
    changed = dataclasses.replace(cfg, seed=7, env=dataclasses.replace(cfg.env, num_envs=4))
    assert (changed.seed, changed.env.num_envs) == (7, 4)
    assert podrace.presets.get("cartpole-ppo").env.num_envs == 64  # the preset is untouched
    with pytest.raises(podrace.ConfigError) as info:
        podrace.presets.get("cartpole")
    assert str(info.value) == f"unknown preset 'cartpole'; presets: {', '.join(sorted(PRESETS))}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "change,factory,message",
    [
        ({"id": "NoSuchEnv-v0"}, None, "unknown env id"),
        ({"id": "no_such_user_module:Env-v0"}, None, "cannot import module 'no_such_user_module'"),
        ({}, lambda n, s: "not an env", "returned str"),
    ],
)
def test_train_raises_config_error_before_writing(tmp_path, change, factory, message):
    base = podrace.presets.get("cartpole-ppo")
    cfg = dataclasses.replace(
        base,
        env=dataclasses.replace(base.env, **change),
        log=dataclasses.replace(base.log, run_dir=str(tmp_path)),
    )
    with pytest.raises(podrace.ConfigError, match=message):
        podrace.train(cfg, env_factory=factory)
    assert not list(tmp_path.iterdir())


# --- mujoco-ppo -------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_mujoco_ppo_follows_cleanrl_ppo_continuous_action():
    cfg = podrace.presets.get("mujoco-ppo")
    ppo = cfg.ppo
    assert (cfg.env.id, cfg.env.backend, cfg.total_steps) == (
        "HalfCheetah-v4",
        "envpool",
        1_000_000,
    )
    assert (cfg.num_actors, cfg.env.num_envs, cfg.rollout_length) == (1, 1, 2048)
    assert (ppo.learning_rate, ppo.anneal_lr, ppo.num_epochs, ppo.num_minibatches) == (
        3e-4,
        True,
        10,
        32,
    )
    assert (ppo.clip_coef, ppo.clip_value_loss, ppo.ent_coef, ppo.vf_coef, ppo.max_grad_norm) == (
        0.2,
        True,
        0.0,
        0.5,
        0.5,
    )
    assert (ppo.gamma, ppo.gae_lambda, ppo.norm_adv) == (0.99, 0.95, True)
    assert cfg.normalize == podrace.NormalizeConfig(
        obs=True, obs_clip=10.0, reward=True, reward_clip=10.0
    )
    net = cfg.network
    assert (net.torso, net.hidden_sizes, net.activation, net.shared_torso) == (
        "mlp",
        (64, 64),
        "tanh",
        False,
    )
    spec = podrace.envs.env_spec(cfg.env)  # envpool ships MuJoCo: no mujoco package needed
    assert spec.obs_shape == (17,) and not spec.discrete and spec.action_shape == (6,)
    np.testing.assert_array_equal(spec.action_low, -np.ones(6))
    np.testing.assert_array_equal(spec.action_high, np.ones(6))


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("env_id", ["HalfCheetah-v4", "Hopper-v4"])
def test_mujoco_ppo_trains_on_envpool_mujoco(tmp_path, env_id):
    """The preset's env and network end to end, with a smaller rollout and shorter episodes,
    on its default task and on Hopper (which ends episodes when the hopper falls)."""
    cfg = podrace.presets.get("mujoco-ppo")
    cfg = dataclasses.replace(
        cfg,
        total_steps=512,
        rollout_length=256,
        env=dataclasses.replace(cfg.env, id=env_id, max_episode_steps=100),
        ppo=dataclasses.replace(cfg.ppo, num_epochs=2, num_minibatches=4),
        eval=dataclasses.replace(cfg.eval, episodes=1, num_envs=1),
        log=dataclasses.replace(cfg.log, run_dir=str(tmp_path), console="none"),
    )
    result = podrace.train(cfg)
    assert result.updates == 2 and result.env_steps == 512
    assert np.isfinite(result.final_eval.mean_return)
    (length,) = result.final_eval.lengths.tolist()
    assert length == 100 if env_id == "HalfCheetah-v4" else 0 < length <= 100


@pytest.mark.timeout(60)
def test_halfcheetah_ppo_is_an_alias_of_mujoco_ppo(capsys):
    from podrace.commands.train import parse_train

    assert podrace.presets.get("halfcheetah-ppo") is podrace.presets.get("mujoco-ppo")
    assert parse_train(["halfcheetah-ppo"]) == parse_train(["mujoco-ppo"])
    assert parse_train(["halfcheetah-ppo", "--env.id", "Hopper-v4"]).env.id == "Hopper-v4"
    assert "halfcheetah-ppo" not in podrace.presets.PRESETS  # listed once, as mujoco-ppo


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_train_with_a_vector_env_factory_learns_beyond_random(tmp_path):
    """Actors and the evaluator build their envs with the factory (the id is never used)."""
    import gymnasium

    from tests.envs.user_envs import MATCH_LENGTH, RANDOM_RETURN, MatchEnv

    def factory(num_envs: int, seed: int) -> gymnasium.vector.VectorEnv:
        return gymnasium.vector.SyncVectorEnv([MatchEnv] * num_envs)

    base = podrace.presets.get("cartpole-ppo")
    cfg = dataclasses.replace(
        base,
        total_steps=8192,
        env=dataclasses.replace(base.env, id="not-used-with-a-factory"),
        eval=dataclasses.replace(base.eval, episodes=16),
        log=dataclasses.replace(base.log, run_dir=str(tmp_path), console="none"),
    )
    result = podrace.train(cfg, env_factory=factory)
    assert result.final_eval.mean_return >= 0.75 * MATCH_LENGTH > 2 * RANDOM_RETURN


CTRL_C_FROM_PYTHON = textwrap.dedent(
    """
    import dataclasses, faulthandler, gc, json, os, signal, sys, threading, time
    from pathlib import Path
    import gymnasium, numpy as np
    import podrace
    from podrace.checkpoints.resume import Resume
    from podrace.runtime.run import train as train_threads

    root, handlers = Path(sys.argv[1]), []
    # A library caller's process as Python starts it: what this one inherited from the suite
    # is told (a SIGINT ignored or blocked would be), then set as Python's own.
    print("inherited", signal.getsignal(signal.SIGINT),
          sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])), file=sys.stderr, flush=True)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    faulthandler.dump_traceback_later(150, exit=True)  # a hang: every thread's stack, then exit 1

    class SlowEnv(gymnasium.Env):  # an actor's step takes 0.4 s: a stop lands inside one
        observation_space = gymnasium.spaces.Box(-1.0, 1.0, (4,), np.float32)
        action_space = gymnasium.spaces.Discrete(2)
        def reset(self, *, seed=None, options=None):
            return np.zeros(4, np.float32), {}
        def step(self, action):
            if threading.current_thread().name.startswith("actor"):
                time.sleep(0.4)
            return np.zeros(4, np.float32), 1.0, False, False, {}

    def envs(num_envs, seed):
        handlers.append(signal.getsignal(signal.SIGINT))  # the probe runs in this (main) thread
        return gymnasium.vector.SyncVectorEnv([SlowEnv] * num_envs)

    base = podrace.presets.get("cartpole-ppo")
    cfg = dataclasses.replace(base, total_steps=100_000, rollout_length=2,
                              env=dataclasses.replace(base.env, num_envs=2),
                              ppo=dataclasses.replace(base.ppo, num_minibatches=1),
                              eval=dataclasses.replace(base.eval, every_updates=0, episodes=1),
                              log=dataclasses.replace(base.log, console="none", run_dir=str(root),
                                                      interval_s=0.1))

    def ctrl_c_when(ready, *delays):
        def send():
            from tests.waiting import wait_until
            wait_until(ready, 140, interval=0.01)
            for delay in delays:  # the signals' spacing: the scenario, not a wait
                time.sleep(delay)
                os.kill(os.getpid(), signal.SIGINT)
        threading.Thread(target=send, daemon=True).start()

    def interrupted(**kwargs):
        try:
            train_threads(cfg, **kwargs) if kwargs else podrace.train(cfg, envs)
        except KeyboardInterrupt:
            return True
        return False

    # 1. While preparing (tracing, compiling): no run directory is left.
    ctrl_c_when(lambda: handlers, 0.0)
    print("preparing", interrupted(), sorted(p.name for p in root.iterdir()),
          handlers[-1] is signal.default_int_handler, flush=True)

    # 2. Twice, the second while the run stops (an actor inside its step): the run
    # directory is released, and resumed from this process from its checkpoint, with the
    # run's env factory (a function of this script, which a resume cannot import itself).
    def updated():
        metrics = [p / "metrics.jsonl" for p in root.iterdir() if (p / "metrics.jsonl").exists()]
        return metrics and any(json.loads(l).get("version", 0) >= 1
                               for l in metrics[0].read_text().splitlines()[:-1])
    ctrl_c_when(updated, 0.0, 0.15)
    twice = interrupted()
    (run,) = root.iterdir()
    steps = sorted(p.name for p in (run / "checkpoints").iterdir())
    # two more updates
    cfg = dataclasses.replace(cfg, total_steps=(int(steps[-1]) + 2) * cfg.steps_per_update)
    result = train_threads(cfg, envs=podrace.envs.EnvSource(cfg.env, envs), resume=Resume(run))
    # The interrupted run's checkpoint writer, whose shutdown the second Ctrl-C cut short,
    # ends when its executor is collected: collect it now rather than by chance.
    gc.collect()
    print("twice", twice, steps, result.updates,
          signal.getsignal(signal.SIGINT) is signal.default_int_handler,
          sorted(t.name for t in threading.enumerate()), flush=True)
    """
)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_ctrl_c_of_a_library_caller_stops_the_run_cleanly_then_raises_keyboard_interrupt(tmp_path):
    """Python's own SIGINT handling would raise KeyboardInterrupt wherever the main thread
    is: inside JAX's tracing (a segfault some calls later), or in the run's cleanup on a
    second Ctrl-C (the run directory would stay locked, so its resume says "in use" in this
    process, and a run stopped before its first update would stay behind, unresumable)."""
    proc = run_python("-W", "ignore", "-c", CTRL_C_FROM_PYTHON, str(tmp_path), timeout=220)
    assert proc.returncode == 0, proc.stderr[-3000:]
    preparing, twice = proc.stdout.splitlines()
    # podrace's handler while the run is prepared (the env probe saw it); Python's after
    assert preparing == "preparing True [] False", proc.stdout
    word, raised, steps, updates, restored, threads = twice.split(" ", 5)
    assert (word, raised, restored) == ("twice", "True", "True"), twice
    assert steps != "[]" and int(updates) == int(eval(steps)[-1]) + 2, twice
    assert threads == "['MainThread']", twice


QUIET_LIBRARY_RUN = """
import sys, threading
import podrace
from podrace.config import replace
cfg = replace(podrace.presets.get("cartpole-ppo"), total_steps=1024, rollout_length=16,
              **{"env.num_envs": 8, "eval.episodes": 1, "eval.num_envs": 1,
                 "log.console": "none", "log.run_dir": sys.argv[1]})
podrace.train(cfg)
print(sorted(t.name for t in threading.enumerate()))
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_library_run_warns_as_the_cli_does_and_leaves_no_thread_behind(tmp_path):
    """envpool's CartPole casts float64 Box bounds to float32: Gymnasium warns, in several
    lines, and the CLI silences that; so does `podrace.train`, and once it returns only the
    caller's threads remain."""
    proc = run_python("-c", QUIET_LIBRARY_RUN, str(tmp_path), timeout=110)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "precision lowered" not in proc.stderr and "Warning" not in proc.stderr, proc.stderr
    assert proc.stdout.strip() == "['MainThread']", proc.stdout
