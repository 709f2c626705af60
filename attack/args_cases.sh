source /work/wt/attack3/attack/args_battery.sh
run train --total-steps
run train --total-steps abc
run train --nonsense 3
run train nosuchpreset
run train --env.backend foo
run train --runtime kubernetes
run train --deterministic maybe
run train --deterministic True
run train --env.max-episode-steps
run train --env.max-episode-steps None --total-steps x
run train --rollout-length 1.5
run train --seed
run train cartpole --total-steps -- 5
run train --env.id
run train --log.run-name
run train --distributed.coordinator-address
run eval
run eval --nonsense
run eval /nonexistent --episodes x
run plot
run plot -o
run plot a --output
run train --ppo.clip-eps nan
run train --help --nonsense
run train --total-steps=
run train --layout.learner-devices x y
