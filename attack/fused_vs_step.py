"""Compare fused and step-by-step rollouts of an actor on the same env/seed/params."""
import sys, tempfile
import jax, numpy as np
from podrace.config import TrainConfig, EnvConfig, LogConfig, replace
from podrace.runtime.single_host import prepare
from podrace.sync.base import Snapshot

class Fixed:
    def __init__(s, snap): s.snap = snap
    def get(s, min_version, timeout=None): return s.snap
    def poll(s): return None
    acked_version = 0
    def close(s): pass

class Sink:
    def __init__(s): s.items = []
    def put(s, r): s.items.append(r); return 0.0

def collect(env_id, fused, n_rollouts, T, **envkw):
    cfg = TrainConfig(env=EnvConfig(id=env_id, num_envs=4, **envkw), rollout_length=T, total_steps=T*4*n_rollouts,
                      log=LogConfig(run_dir=tempfile.mkdtemp()))
    run = prepare(cfg)
    a = run.actors[0]
    print("fused available:", a.fused is not None)
    if not fused:
        a.fused = None
    snap = Snapshot(0, jax.device_put(run.learner.acting_params(), a.policy.device))
    a.params = Fixed(snap); sink = Sink(); a.out = sink
    a.settings = replace(a.settings, num_rollouts=n_rollouts) if False else a.settings.__class__(**{**a.settings.__dict__, "num_rollouts": n_rollouts})
    a.run()
    return sink.items

def main(env_id, n, T, **kw):
    f = collect(env_id, True, n, T, **kw); s = collect(env_id, False, n, T, **kw)
    bad = False
    for i, (x, y) in enumerate(zip(f, s)):
        for name in x.trajectory._fields:
            xa, ya = np.asarray(x.trajectory.__getattribute__(name)), np.asarray(y.trajectory.__getattribute__(name))
            if xa.shape != ya.shape or xa.dtype != ya.dtype or not np.array_equal(xa, ya):
                bad = True
                print(f"rollout {i} {name}: DIFF shape {xa.shape}/{ya.shape} dtype {xa.dtype}/{ya.dtype}",
                      "" if xa.shape != ya.shape else f"maxabs {np.max(np.abs(xa.astype(float)-ya.astype(float)))}")
        er = (x.episode_returns, y.episode_returns); el = (x.episode_lengths, y.episode_lengths)
        if not (np.array_equal(*er) and np.array_equal(*el) and er[0].dtype == er[1].dtype and el[0].dtype == el[1].dtype):
            bad = True
            print(f"rollout {i} episodes DIFF", er, el, er[0].dtype, er[1].dtype, el[0].dtype, el[1].dtype)
        else:
            print(f"rollout {i} ok episodes {list(zip(er[0], el[0]))}")
    print("RESULT", "DIFF" if bad else "SAME")

if __name__ == "__main__":
    import ast
    kw = {k: ast.literal_eval(v) for k, v in (a.split("=") for a in sys.argv[4:])}
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), **kw)
