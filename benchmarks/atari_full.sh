#!/usr/bin/env bash
# Both Atari presets at full size (2 actor threads x 64 envs, as Cleanba runs them) for an
# accelerator machine: benchmarks/atari.py for atari-impala, then atari-ppo.
#
#     bash benchmarks/atari_full.sh [OUT_DIR] [TAG]
#
# writes OUT_DIR/atari_impala_TAG.json and OUT_DIR/atari_ppo_TAG.json (default
# benchmarks/results, TAG "full"). Every mode runs in its own process; they share one JAX
# compilation cache, so a mode after the first reads its programs from there (its
# compile_s says so) and the few minutes go to measuring. e2e runs right after env_only, so
# a run cut short by the time limits (IMPALA_TIMEOUT_S, PPO_TIMEOUT_S) keeps it: each mode's
# result is written as it arrives. NUM_ENVS (envs per actor thread), IMPALA_UPDATES and
# PPO_UPDATES change the sizes.
set -u
out=${1:-benchmarks/results}
tag=${2:-full}
here=$(dirname "$0")
python=${PYTHON:-python3}
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$(mktemp -d)}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
modes=(env_only e2e actor_only learner_only learner_only_unroll1)
status=0
timeout "${IMPALA_TIMEOUT_S:-300}" "$python" "$here/atari.py" --preset atari-impala --num-envs "${NUM_ENVS:-0}" \
    --updates "${IMPALA_UPDATES:-40}" --unroll1-updates "${IMPALA_UPDATES:-40}" --modes "${modes[@]}" \
    --out "$out/atari_impala_$tag.json" || status=$?
timeout "${PPO_TIMEOUT_S:-240}" "$python" "$here/atari.py" --preset atari-ppo --num-envs "${NUM_ENVS:-0}" \
    --updates "${PPO_UPDATES:-8}" --unroll1-updates "${PPO_UPDATES:-8}" --modes "${modes[@]}" \
    --out "$out/atari_ppo_$tag.json" || status=$?
exit "$status"
