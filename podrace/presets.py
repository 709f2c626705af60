"""Named, ready-to-run configurations (`podrace train <preset>`); every field can be overridden."""

from __future__ import annotations

from podrace.config import EnvConfig, EvalConfig, LayoutConfig, NetworkConfig, PPOConfig, TrainConfig

PRESETS: dict[str, tuple[str, TrainConfig]] = {
    "cartpole-ppo": (
        "PPO on CartPole-v1 (envpool), 500k steps, 2 actor threads and a learner on device 0.",
        TrainConfig(
            name="cartpole-ppo",
            algo="ppo",
            total_steps=500_000,
            rollout_length=32,
            env=EnvConfig(id="CartPole-v1", num_envs=8),
            network=NetworkConfig(torso="mlp", hidden_sizes=(64, 64), activation="tanh"),
            ppo=PPOConfig(learning_rate=2.5e-3, num_epochs=4, num_minibatches=4, ent_coef=0.0),
            layout=LayoutConfig(actors_per_device=2),
            eval=EvalConfig(every_updates=200, episodes=16, num_envs=8),
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
            network=NetworkConfig(torso="mlp", hidden_sizes=(64, 64), activation="tanh"),
            ppo=PPOConfig(
                learning_rate=1e-3, gamma=0.95, num_epochs=10, num_minibatches=8, ent_coef=0.0, max_grad_norm=0.5
            ),
            layout=LayoutConfig(actors_per_device=2),
            eval=EvalConfig(every_updates=100, episodes=8, num_envs=8),
        ),
    ),
}
