#!/bin/bash
# Each case: run podrace with bad args in an empty cwd; report rc, stderr line count, stdout bytes, files created.
PY=/work/main/.venv/bin/python
export PYTHONPATH=/work/wt/attack3
run() {
  d=$(mktemp -d); cd $d
  $PY -m podrace.cli "$@" >out 2>err; rc=$?
  n=$(wc -l <err); o=$(wc -c <out); f=$(find . -mindepth 1 -not -name out -not -name err | head -3 | tr '\n' ' ')
  flag=""; { [ "$rc" != 2 ] || [ "$n" != 1 ] || [ "$o" != 0 ] || [ -n "$f" ]; } && flag="  <<<<<"
  echo "rc=$rc errlines=$n outbytes=$o files=[$f] :: $*$flag"
  [ -n "$flag" ] && { head -c 600 err; echo; head -c 300 out; echo; }
  [ -z "$flag" ] && echo "   $(head -c 250 err)"
  cd /; rm -rf $d
}
