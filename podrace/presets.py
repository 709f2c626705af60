"""Named, ready-to-run configurations (`podrace train <preset>`); every field can be overridden.

Device ids default to (0,) so every preset runs as is on one CPU device; on a GPU machine
pass e.g. `--layout.actor-device-ids 0 --layout.learner-device-ids 1 2 3`.
"""

from __future__ import annotations

import dataclasses

from podrace.config import (
    ConfigError,
    EnvConfig,
    EvalConfig,
    ImpalaConfig,
    LayoutConfig,
    NetworkConfig,
    NormalizeConfig,
    PPOConfig,
    TrainConfig,
)


def atari_env(env_id: str = "Breakout-v5", num_envs: int = 64) -> EnvConfig:
    """envpool Atari with the standard settings written out, not left to defaults.

    Frame skip 4, 84x84 grey, 4 stacked frames, sticky actions 0.25 (Machado et al. 2018),
    minimal action set, up to 30 no-ops, episodic life and sign-clipped rewards for learning
    (reported episode returns are raw game scores), 108k frames (27k agent steps) per episode.
    """
    return EnvConfig(
        id=env_id,
        backend="envpool",
        num_envs=num_envs,
        max_episode_steps=27_000,
        frame_skip=4,
        frame_stack=4,
        image_size=84,
        sticky_action_prob=0.25,
        full_action_space=False,
        episodic_life=True,
        reward_clip=True,
        noop_max=30,
    )


def cleanba_atari_env(env_id: str = "Breakout-v5", num_envs: int = 64) -> EnvConfig:
    """The envs of Cleanba's cleanba_impala.py (Machado et al. 2018's protocol): sticky
    actions 0.25, the full 18-action set, no episodic life, no no-ops (noop_max=1), sign-clipped
    rewards, 27k agent steps per episode; frame skip 4, 84x84 grey, 4 stacked frames."""
    return dataclasses.replace(
        atari_env(env_id, num_envs), full_action_space=True, episodic_life=False, noop_max=1
    )


MLP_NETWORK = NetworkConfig(torso="mlp", hidden_sizes=(64, 64), activation="tanh")
"""Two 64-unit tanh layers, one torso for the policy and the value: the classic-control
presets' network."""


def cleanrl_ppo(
    *,
    learning_rate: float,
    num_epochs: int,
    num_minibatches: int,
    clip_coef: float,
    ent_coef: float,
) -> PPOConfig:
    """CleanRL's PPO written out, not left to defaults: Adam with its lr annealed to 0,
    gamma 0.99, GAE lambda 0.95, the value loss clipped like the policy, value 0.5, grad
    norm 0.5, advantages normalized; the arguments are what its scripts set per task."""
    return PPOConfig(
        learning_rate=learning_rate,
        anneal_lr=True,
        gamma=0.99,
        gae_lambda=0.95,
        num_epochs=num_epochs,
        num_minibatches=num_minibatches,
        clip_coef=clip_coef,
        clip_value_loss=True,
        vf_coef=0.5,
        ent_coef=ent_coef,
        max_grad_norm=0.5,
        norm_adv=True,
    )


def cleanba_impala(learning_rate: float) -> ImpalaConfig:
    """Cleanba's cleanba_impala.py written out, not left to defaults, at `learning_rate`:
    PyTorch-style RMSProp (eps 0.01 outside the square root, decay 0.99) on the summed loss
    after clipping its gradient to global norm 40, lr annealed to 0 once per update,
    entropy 0.01, value 0.5, gamma 0.99, rho-bar = c-bar = 1 (V-trace lambda 1), 4
    minibatches per update."""
    return ImpalaConfig(
        learning_rate=learning_rate,
        anneal_lr=True,
        gamma=0.99,
        vtrace_lambda=1.0,
        rho_bar=1.0,
        c_bar=1.0,
        vf_coef=0.5,
        ent_coef=0.01,
        max_grad_norm=40.0,
        rmsprop_decay=0.99,
        rmsprop_eps=0.01,
        rmsprop_style="torch",
        num_minibatches=4,
    )


PRESETS: dict[str, tuple[str, TrainConfig]] = {
    "cartpole-ppo": (
        "PPO on CartPole-v1 (envpool), 500k steps, one actor thread (64 envs) and a learner on "
        "device 0.",
        # 512 samples per update as 64 envs x 8 steps in one actor thread. Rollouts compile
        # into XLA calls, so on 2 CPU cores the learner's update is the limit, not the actors'
        # layout; every layout tried solved CartPole (eval 500).
        TrainConfig(
            name="cartpole-ppo",
            algo="ppo",
            total_steps=500_000,
            rollout_length=8,
            env=EnvConfig(id="CartPole-v1", num_envs=64),
            network=MLP_NETWORK,
            ppo=PPOConfig(learning_rate=2.5e-3, num_epochs=4, num_minibatches=4, ent_coef=0.0),
            layout=LayoutConfig(actors_per_device=1),
            eval=EvalConfig(every_updates=250, episodes=16, num_envs=16),
        ),
    ),
    "pendulum-ppo": (
        "PPO with a Gaussian policy on Pendulum-v1 (envpool), continuous actions.",
        TrainConfig(
            name="pendulum-ppo",
            algo="ppo",
            total_steps=1_000_000,
            rollout_length=64,
            env=EnvConfig(id="Pendulum-v1", num_envs=16),
            network=MLP_NETWORK,
            ppo=PPOConfig(
                learning_rate=1e-3,
                gamma=0.95,
                num_epochs=10,
                num_minibatches=8,
                ent_coef=0.0,
                max_grad_norm=0.5,
            ),
            layout=LayoutConfig(actors_per_device=2),
            eval=EvalConfig(every_updates=100, episodes=8, num_envs=8),
        ),
    ),
    "cartpole-impala": (
        "IMPALA (V-trace) on CartPole-v1 (envpool), 300k steps, 2 actor threads and a learner on "
        "device 0; Cleanba's optimizer, tuned here to learn in well under a minute on 2 CPU cores.",
        # The optimizer is atari-impala's (PyTorch-style RMSProp, eps 0.01, clip 40 on the
        # summed loss) at a larger lr; 4 minibatches of 8 envs x 32 steps; no entropy bonus.
        # Measured (2 CPU cores, seeds 1-3): final eval 496.3, 500, 500; with ent_coef 0.01
        # 500, 467.6, 500; with lr 1e-3 and 2 minibatches 447.7 (seed 1).
        TrainConfig(
            name="cartpole-impala",
            algo="impala",
            total_steps=300_000,
            rollout_length=32,
            env=EnvConfig(id="CartPole-v1", num_envs=16),
            network=MLP_NETWORK,
            impala=dataclasses.replace(cleanba_impala(learning_rate=2e-3), ent_coef=0.0),
            layout=LayoutConfig(actors_per_device=2, scan_unroll=4),
            eval=EvalConfig(every_updates=100, episodes=16, num_envs=8),
        ),
    ),
    # Atari PPO. Per-update hyperparameters of CleanRL's ppo_atari_envpool.py (Nature CNN,
    # Adam lr 2.5e-4 annealed to 0, T=128, 4 minibatches x 4 epochs, clip 0.1 on the policy
    # and the value, entropy 0.01, value 0.5, grad norm 0.5, gamma 0.99, GAE lambda 0.95)
    # at the 200M-frame scale of Cleanba's cleanba_ppo.py (50M agent steps, 2 actor threads
    # x 64 envs, so 16384 samples per update).
    "atari-ppo": (
        "PPO on Atari (Breakout-v5, envpool; --env.id for another game) with the Nature CNN: "
        "CleanRL's Atari PPO hyperparameters at Cleanba's scale, 50M agent steps = 200M frames.",
        TrainConfig(
            name="atari-ppo",
            algo="ppo",
            total_steps=50_000_000,
            rollout_length=128,
            env=atari_env(num_envs=64),
            network=NetworkConfig(torso="nature_cnn", hidden_sizes=(512,), activation="relu"),
            ppo=cleanrl_ppo(
                learning_rate=2.5e-4,
                num_epochs=4,
                num_minibatches=4,
                clip_coef=0.1,
                ent_coef=0.01,
            ),
            # For CPU runs: scan_unroll=4 unrolls both the epoch and the minibatch loop; with
            # lax.scan this update ran 15x slower on XLA:CPU (2 cores, jax 0.10.2: 13.7 vs
            # 204 samples/s for 4x4 minibatches of a 32x8 batch). Costs only compile time on GPUs.
            layout=LayoutConfig(actors_per_device=2, scan_unroll=4),
            eval=EvalConfig(every_updates=500, episodes=8, num_envs=8),
        ),
    ),
    # Atari IMPALA: Cleanba's cleanba_impala.py (which follows the paper, Espeholt et al.
    # 2018, Table G.1, except for the optimizer convention): IMPALA ResNet (16, 32, 32) with a
    # 256-unit dense layer, T=20, 2 actor threads x 64 envs, 4 minibatches of 32 envs (640
    # samples) per update, PyTorch-style RMSProp (eps 0.01 outside the square root, decay
    # 0.99, momentum 0) on the summed loss after clipping its gradient to global norm 40, lr
    # 6e-4 decayed linearly once per update to 0 over 50M agent steps, entropy 0.01, value
    # 0.5, gamma 0.99, rho-bar = c-bar = 1, and Cleanba's envs (cleanba_atari_env). Not
    # reproduced: Cleanba's conv init (LeCun normal; podrace uses orthogonal) and its fixed,
    # unshuffled assignment of envs to minibatches.
    "atari-impala": (
        "IMPALA (V-trace) on Atari (Breakout-v5, envpool; --env.id for another game) with the "
        "IMPALA ResNet: Cleanba's cleanba_impala.py settings, 50M agent steps = 200M frames.",
        TrainConfig(
            name="atari-impala",
            algo="impala",
            total_steps=50_000_000,
            rollout_length=20,
            env=cleanba_atari_env(num_envs=64),
            network=NetworkConfig(torso="impala_resnet", hidden_sizes=(256,), activation="relu"),
            impala=cleanba_impala(learning_rate=6e-4),
            # For CPU runs: the minibatch loop fully unrolled; on XLA:CPU lax.scan made this
            # ResNet's update 11-26x slower (benchmarks/atari.py, learner_only vs
            # learner_only_unroll1). Costs only compile time on GPUs.
            layout=LayoutConfig(actors_per_device=2, scan_unroll=4),
            eval=EvalConfig(every_updates=1000, episodes=8, num_envs=8),
        ),
    ),
}


# MuJoCo PPO, one preset for envpool's MuJoCo tasks (HalfCheetah-v4 by default; --env.id
# Hopper-v4, Walker2d-v4, Ant-v4, ...), never tuned per task: CleanRL's
# ppo_continuous_action.py, whose settings serve all its MuJoCo tasks, hyperparameter for
# hyperparameter: one env, T=2048, Adam lr 3e-4 annealed to 0, 10 epochs x 32 minibatches
# of 64 steps, clip 0.2 on the policy and the value, entropy 0, value 0.5, grad norm 0.5,
# gamma 0.99, GAE lambda 0.95, separate 64-64 tanh MLPs and a state-independent log-std, 1M
# steps. CleanRL normalizes observations and scales rewards with gymnasium wrappers; here the
# learner does both (podrace.algos.normalizer), the observation statistics published with
# the params.
PRESETS["mujoco-ppo"] = (
    "PPO on MuJoCo (HalfCheetah-v4, envpool; --env.id for Hopper-v4 and the other envpool "
    "MuJoCo tasks), 1M steps, with CleanRL's ppo_continuous_action hyperparameters (one "
    "env, 2048-step rollouts, 10 epochs x 32 minibatches, observation normalization and "
    "reward scaling).",
    TrainConfig(
        name="mujoco-ppo",
        algo="ppo",
        total_steps=1_000_000,
        rollout_length=2048,
        env=EnvConfig(id="HalfCheetah-v4", backend="envpool", num_envs=1),
        network=dataclasses.replace(MLP_NETWORK, shared_torso=False),
        ppo=cleanrl_ppo(
            learning_rate=3e-4,
            num_epochs=10,
            num_minibatches=32,
            clip_coef=0.2,
            ent_coef=0.0,
        ),
        # CleanRL wraps the env in NormalizeObservation and NormalizeReward(gamma), each
        # clipped at 10; here the learner computes both and publishes the observation
        # statistics with the params.
        normalize=NormalizeConfig(obs=True, obs_clip=10.0, reward=True, reward_clip=10.0),
        layout=LayoutConfig(actors_per_device=1),
        eval=EvalConfig(every_updates=50, episodes=8, num_envs=8),
    ),
)


# Partially observed CartPole: the observation keeps the cart position and the pole angle
# (env.obs_indices 0 2) and loses both velocities, which a policy must now infer from how
# the positions change. The recurrent preset gives PPO an LSTM for that memory; the other is
# the same run without the core (a feed-forward policy on the same observations), to
# compare. Observation normalization scales the pole angle (std ~0.05 rad) up to where a
# step's change in it is visible to the network (without it, at T=8, lr 2.5e-3 and 1M steps:
# final eval 500, 447, 362 for seeds 1-3; with it 417, 391, 500). At T=8 and lr 2.5e-3 the
# updates were large (approx_kl 0.04-0.09, clip fraction 0.2-0.37) and the eval return swung
# between evaluations to the end: 2M steps gave 500, 500, 500 once, and 160.5 and 123.6 for
# seed 1 in two other runs. T=16 and lr 1e-3 (this preset), measured on 2 shared CPU cores,
# seeds 1-3 twice each: final eval 500 in all six runs, 500 from 1.28-1.54M steps on
# (evaluations every 256k steps; one run at 456 and 481 on the way); cartpole-po-ppo (no
# core): 37.2, 41.1, 37.5. Runs are not bit-reproducible (the actors' policy lag depends on
# timing).
_CARTPOLE_PO = TrainConfig(
    name="cartpole-po-ppo-lstm",
    algo="ppo",
    total_steps=2_000_000,
    rollout_length=16,
    env=EnvConfig(id="CartPole-v1", num_envs=64, obs_indices=(0, 2)),
    network=dataclasses.replace(MLP_NETWORK, core="lstm", core_size=64),
    ppo=PPOConfig(learning_rate=1e-3, num_epochs=4, num_minibatches=4, ent_coef=0.0),
    normalize=NormalizeConfig(obs=True),
    layout=LayoutConfig(actors_per_device=1),
    eval=EvalConfig(every_updates=250, episodes=16, num_envs=16),
)
PRESETS["cartpole-po-ppo-lstm"] = (
    "PPO with an LSTM core on partially observed CartPole-v1 (positions only: velocities "
    "removed by --env.obs-indices 0 2), 2M steps; minibatches of whole env sequences.",
    _CARTPOLE_PO,
)
PRESETS["cartpole-po-ppo"] = (
    "PPO with a feed-forward policy on partially observed CartPole-v1 (positions only): "
    "cartpole-po-ppo-lstm without its core, for comparison.",
    dataclasses.replace(
        _CARTPOLE_PO,
        name="cartpole-po-ppo",
        network=dataclasses.replace(_CARTPOLE_PO.network, core="none"),
    ),
)

# atari-impala with an LSTM core of 256 between the ResNet's dense layer and the heads, as
# the IMPALA paper's deep agent (without its last action and reward as inputs): the core's
# state crosses rollouts (T=20, truncated backpropagation through time over each) and is
# reset where a learning episode ends (a lost life with episodic life, here a game over).
PRESETS["atari-impala-lstm"] = (
    "IMPALA (V-trace) on Atari with an LSTM core (256) between the IMPALA ResNet and the "
    "heads; atari-impala's settings otherwise.",
    dataclasses.replace(
        PRESETS["atari-impala"][1],
        name="atari-impala-lstm",
        network=dataclasses.replace(PRESETS["atari-impala"][1].network, core="lstm", core_size=256),
    ),
)


# MinAtar (the `minatar` package's Gymnasium ids, its defaults: minimal action set, sticky
# actions 0.1, difficulty ramping) with the MinAtar paper's network: one 3x3 conv of 16
# channels and 128 dense relu units (Young & Tian 2019). One preset per algorithm serves all
# five games (--env.id MinAtar/<Game>-v1); none is tuned per game.
def minatar_env(env_id: str = "MinAtar/Breakout-v1", num_envs: int = 64) -> EnvConfig:
    """The `minatar` package's env through Gymnasium, its defaults unchanged."""
    return EnvConfig(id=env_id, backend="gymnasium", num_envs=num_envs)


MINATAR_NETWORK = NetworkConfig(torso="minatar_cnn", hidden_sizes=(128,), activation="relu")

# MinAtar PPO. Anchor: PureJaxRL's MinAtar PPO (64 envs, clip 0.2, entropy 0.01, gamma 0.99,
# GAE lambda 0.95, Adam annealed to 0, advantages normalized), with its 4 epochs x 8
# minibatches of 1024 cut down for 2 CPU cores: the conv net's update costs ~40 us of CPU per
# sample and epoch there, so the learner is the limit and epochs are the price. What decides
# learning at a fixed CPU budget is the number of gradient steps, so the batch is split
# finer: T=32 (2048 samples per update), 2 epochs x 8 minibatches of 256, one step per 128
# samples (PureJaxRL: one per 256). Measured on Breakout (seed 1, 2 shared CPU cores, mean
# training return of the last episodes): T=128 with 2 epochs x 4 minibatches of 2048 (lr
# 1e-3) 3.7 at 700k steps; PureJaxRL's 4 x 8 of 1024 (lr 1e-3) 3.8 at 250k; this preset at
# lr 1e-3 4.4 and at lr 2.5e-3 (kept; PureJaxRL's 5e-3 is for a 64-unit tanh MLP) 8.2 at
# 240k steps; on SpaceInvaders 17.7-24.5 at 150k. Full-budget scores are in docs/results.md.
PRESETS["minatar-ppo"] = (
    "PPO on MinAtar (MinAtar/Breakout-v1; --env.id for Asterix, Freeway, Seaquest or "
    "SpaceInvaders) with the MinAtar paper's network, 5M steps.",
    TrainConfig(
        name="minatar-ppo",
        algo="ppo",
        total_steps=5_000_000,
        rollout_length=32,
        env=minatar_env(num_envs=64),
        network=MINATAR_NETWORK,
        ppo=cleanrl_ppo(
            learning_rate=2.5e-3,
            num_epochs=2,
            num_minibatches=8,
            clip_coef=0.2,
            ent_coef=0.01,
        ),
        # scan_unroll 4: lax.scan makes conv updates many times slower on XLA:CPU (see
        # atari-ppo); one actor thread steps all 64 envs (the learner holds the other core).
        layout=LayoutConfig(actors_per_device=1, scan_unroll=4),
        eval=EvalConfig(every_updates=250, episodes=16, num_envs=16),
    ),
)

# MinAtar IMPALA. Anchor: Cleanba's cleanba_impala.py / the paper (Table G.1), as in
# atari-impala: T=20, 2 actor threads, PyTorch-style RMSProp (eps 0.01, decay 0.99) on the
# summed loss clipped to global norm 40, entropy 0.01, value 0.5, gamma 0.99, rho-bar =
# c-bar = 1, lr annealed to 0. Adapted to this small net and 2 CPU cores: 32 envs per actor
# thread and 4 minibatches of 320 samples (Cleanba: 640) for more gradient steps per sample,
# and Cleanba's lr 6e-4 raised to 2e-3 (cartpole-impala's, whose optimizer is the same).
# Measured on Breakout (seed 1, 2 shared CPU cores, mean training return of the last
# episodes): Cleanba's 2 minibatches of 640 at lr 6e-4 4.4 at 1M steps; 4 minibatches at lr
# 1e-3 3.8 at 250k and at lr 2e-3 (kept) 5.5 at 470k steps; on SpaceInvaders 21-29 at
# 130-355k.
PRESETS["minatar-impala"] = (
    "IMPALA (V-trace) on MinAtar (MinAtar/Breakout-v1; --env.id for the other games) with the "
    "MinAtar paper's network, 5M steps.",
    TrainConfig(
        name="minatar-impala",
        algo="impala",
        total_steps=5_000_000,
        rollout_length=20,
        env=minatar_env(num_envs=32),
        network=MINATAR_NETWORK,
        impala=cleanba_impala(learning_rate=2e-3),
        layout=LayoutConfig(actors_per_device=2, scan_unroll=2),
        eval=EvalConfig(every_updates=500, episodes=16, num_envs=16),
    ),
)


# Former names that still work (`podrace train NAME`, `get(NAME)`), giving the preset itself.
ALIASES: dict[str, str] = {"halfcheetah-ppo": "mujoco-ppo"}


def cli_presets() -> dict[str, tuple[str, TrainConfig]]:
    """The presets `podrace train` offers: every preset, then each alias of one."""
    aliases = {
        alias: (f"Alias of {name} (its former name).", PRESETS[name][1])
        for alias, name in ALIASES.items()
    }
    return {**PRESETS, **aliases}


def get(name: str) -> TrainConfig:
    """The preset `name` (or an alias of one), a frozen TrainConfig to change with
    `dataclasses.replace`."""
    name = ALIASES.get(name, name)
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; presets: {', '.join(sorted(PRESETS))}")
    return PRESETS[name][1]
