#!/bin/bash
# sweep_orphans() SIGKILLs any of this user's processes that mention an orphaned podrace Ray
# temp dir on their command line or hold a file open in it, and all their descendants:
# a `tail -f` / `less` on the orphan's logs, or a script given the path, is killed.
# Setup: a fake orphan (owner pid dead), a log viewer and a script mentioning it.
export PYTHONPATH=${PYTHONPATH:-/work/wt/attack3}
O=$(mktemp -d /tmp/podrace-ray-XXXXXXXX); mkdir -p $O/logs; echo hi > $O/logs/raylet.out
bash -c 'exit 0' & wait $!; echo "$! 1" > $O/owner          # owner: a pid that has exited
tail -f $O/logs/raylet.out >/dev/null 2>&1 & T=$!           # a user reading the orphan's log
bash -c "sleep 600; echo $O" & B=$!                          # a script given the path
sleep 0.5
/work/main/.venv/bin/python -c "from podrace.runtime.ray_cluster import sweep_orphans; print(sweep_orphans())"
sleep 0.5
for p in $T $B; do kill -0 $p 2>/dev/null && echo "$p alive (ok)" || echo "$p KILLED by sweep_orphans (bug)"; done
kill $T $B 2>/dev/null; rm -rf $O
