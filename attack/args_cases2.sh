source /work/wt/attack3/attack/args_battery.sh
P=cartpole-ppo
run train $P --total-steps
run train $P --total-steps abc
run train $P --env.backend foo
run train $P --runtime kubernetes
run train $P --deterministic maybe
run train $P --deterministic True
run train $P --deterministic --no-deterministic x
run train $P --env.max-episode-steps notanint
run train $P --rollout-length 1.5
run train $P --layout.learner-device-ids a b
run train $P --layout.learner-device-ids
run train $P --log.run-name
run train $P --ppo.clip-coef
run train $P --algo sac
run train $P --seed 1 --seed
run train $P --total-steps 1e3
run train $P --env.id "" --total-steps nope
COLUMNS=5 run train $P --runtime kubernetes
COLUMNS=10000 run train $P --runtime kubernetes
COLUMNS=0 run train $P --runtime kubernetes
COLUMNS=-3 run train $P --runtime kubernetes
LANG=C LC_ALL=C PYTHONIOENCODING=ascii run train $P --runtime kubernetes
PYTHONIOENCODING=latin-1 run train $P --runtime kubernetes
run train $P --resume
run train --resume /nonexistent --total-steps x
