"""One PureJaxRL CartPole PPO run, for `benchmarks/cartpole_ppo.py --purejaxrl DIR`.

Runs in PureJaxRL's own environment (its requirements: jax, flax, optax, distrax, gymnax
0.0.x, brax, navix): `PY benchmarks/purejaxrl_child.py DIR` with DIR a checkout of
github.com/luchris429/purejaxrl. It imports that checkout's `purejaxrl/ppo.py` and trains
with the config of that file's `__main__` (CartPole-v1, 4 envs x 128 steps, 4 epochs x 4
minibatches, 5e5 steps: the same 976 updates of 512 samples as the cartpole-ppo preset),
with DEBUG off (its per-episode printing would be timed too). Prints one JSON line: import,
compile and train seconds, and the mean episodic return of the last 20 updates.

`PY benchmarks/purejaxrl_child.py DIR '{"NUM_ENVS": 64, ...}'`: that config's entries
replaced (benchmarks/jax_envs.py gives it podrace's preset's hyperparameters).
"""

import json
import sys
import time

START = time.perf_counter()
sys.path.insert(0, f"{sys.argv[1]}/purejaxrl")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ppo  # noqa: E402  (PureJaxRL's module, from the checkout)

CONFIG = {
    "LR": 2.5e-4,
    "NUM_ENVS": 4,
    "NUM_STEPS": 128,
    "TOTAL_TIMESTEPS": 5e5,
    "UPDATE_EPOCHS": 4,
    "NUM_MINIBATCHES": 4,
    "GAMMA": 0.99,
    "GAE_LAMBDA": 0.95,
    "CLIP_EPS": 0.2,
    "ENT_COEF": 0.01,
    "VF_COEF": 0.5,
    "MAX_GRAD_NORM": 0.5,
    "ACTIVATION": "tanh",
    "ENV_NAME": "CartPole-v1",
    "ANNEAL_LR": True,
    "DEBUG": False,
}
if len(sys.argv) > 2:
    CONFIG.update(json.loads(sys.argv[2]))

imported = time.perf_counter()
train = jax.jit(ppo.make_train(CONFIG)).lower(jax.random.PRNGKey(30)).compile()
compiled = time.perf_counter()
out = jax.block_until_ready(train(jax.random.PRNGKey(30)))
trained = time.perf_counter()
done, returns = (
    out["metrics"]["returned_episode"][-20:],
    out["metrics"]["returned_episode_returns"][-20:],
)
final = float(jnp.sum(jnp.where(done, returns, 0.0)) / jnp.maximum(jnp.sum(done), 1))
print(
    json.dumps(
        {
            "mode": "purejaxrl",
            "import_s": imported - START,
            "compile_s": compiled - imported,
            "train_s": trained - compiled,
            "child_total_s": time.perf_counter() - START,
            "updates": int(CONFIG["TOTAL_TIMESTEPS"] // (CONFIG["NUM_ENVS"] * CONFIG["NUM_STEPS"])),
            "config": CONFIG,
            "final_return_last_20_updates": final,
        }
    )
)
