#!/usr/bin/env bash
# One maze curriculum process (benchmarks/maze_curriculum.py) for a whole device lease, and the calls that watch it.
# Why: a command runs 10 minutes and a lease about 28. Run per command, each call paid a restart (imports, the
# model's load, the SFT builders' start, a warm-up from a fresh AdamW, the eval, the pack: 15-22 s before the first
# step alone in chain_v14) and cut one level's lr schedule into several. A process started in a new session (setsid)
# runs on between commands until the machine goes back (the device README), so the first call starts it and every
# call brings back what it has left so far: the log, the small result files and, packed, the newest weights it wrote
# (a level's end or a snapshot: pass --snapshot-seconds) that no earlier call brought back.
# Usage (device tool, carry [".whl"], which a watch call may leave out; calls back to back, since an idle machine goes
# back after 30 s):
#   LIMIT=s bash benchmarks/device/lease.sh start TAG [maze_curriculum.py args]   starts it, then watches
#   LIMIT=s bash benchmarks/device/lease.sh watch TAG                             a later call: watches
#   bash benchmarks/device/lease.sh stop TAG       ends it (its process group) and brings back what it left
# A call watches LIMIT seconds (default 540) or until the run ends, prints each level's last metrics row (the log has
# a level's line only at its end) and the median split of its SFT steps' time, then packs (~20 s). It returns
# $OUT/TAG-N.log (the run's log so far), TAG-N.tgz (its run dirs without weights) and part.00-03 of the weights
# (tiny: 2 parts, small: 4); PACK=0 leaves them (a call whose own files need the room). PARTS=dir: the first level
# starts from parts carried into dir (as maze_curriculum.sh). The run's code is copied out of the working tree
# first, which a later call's checkout replaces. LEASE_LOCAL=1: no device env (tests). The first call may do more
# while the run goes:
#   LIMIT=0 PACK=0 bash benchmarks/device/lease.sh start TAG ARGS && bash benchmarks/device/gpu_suite.sh
set -uo pipefail
[ -n "${LEASE_LOCAL:-}" ] || source benchmarks/device/env.sh
source benchmarks/device/run_back.sh
verb=${1:-}; tag=${2:-}
shift 2 || { echo "usage: lease.sh start|watch|stop TAG [maze_curriculum.py args]"; exit 2; }
dir=${LEASE_DIR:-/tmp/lease}
mc=$dir/mc
running() {  # the run's process is there and not a zombie (a killed run whose parent was gone may stay one)
  local state
  state=$(awk '{print $3}' "/proc/$(cat "$dir/pid" 2>/dev/null)/stat" 2>/dev/null)
  [ -n "$state" ] && [ "$state" != Z ]
}
case $verb in
  start)
    if [ -f "$dir/pid" ] && [ ! -f "$dir/rc" ] && running; then
      echo "a lease run goes on here (pid $(cat "$dir/pid")): watch it, or stop it first"
      exit 1
    fi
    # an earlier run's dir stays as $dir.prev: a run that died can go on from its newest weights (--weights DIR)
    rm -rf "$dir.prev" && { [ ! -d "$dir" ] || mv "$dir" "$dir.prev"; } && mkdir -p "$dir/src/benchmarks" || exit 1
    cp -r vlrl "$dir/src/" && cp benchmarks/maze_curriculum.py "$dir/src/benchmarks/" || exit 1
    args=()
    if [ -n "${PARTS:-}" ]; then
      unpack_parts "$dir/start" || exit 1
      args=(--weights "$dir/start")
    fi
    # setsid itself in the background, every stream redirected: no process of this call's session holds its output
    # open or waits on the run, so the call returns while the run goes on
    cd "$dir/src" || exit 1
    PYTHONUNBUFFERED=1 PYTHONPATH="$dir/src:${PYTHONPATH:-}" setsid bash -c \
      'python3 benchmarks/maze_curriculum.py "$@" > ../train.log 2>&1; echo $? > ../rc' lease \
      --out "$mc" "${args[@]}" "$@" < /dev/null > /dev/null 2>&1 &
    echo $! > "$dir/pid"
    cd - > /dev/null || exit 1
    echo "started: pid $(cat "$dir/pid"), log $dir/train.log"
    ;;
  watch | stop)
    [ -f "$dir/pid" ] || { echo "no lease run on this machine (a fresh one?): start one"; exit 1; }
    if [ "$verb" = stop ] && [ ! -f "$dir/rc" ]; then
      kill -- -"$(cat "$dir/pid")" 2>/dev/null  # its session's process group: the run and its SFT builders
      echo "stopped" > "$dir/rc"
    fi
    if [ ! -f "$dir/rc" ] && ! running; then
      # the device README: where commands run as an ordinary user, every process of that user ends with the call
      echo "the run was ended outside it (uid $(id -u); machine ended it with a call?)" | tee "$dir/rc"
    fi
    ;;
  *)
    echo "usage: lease.sh start|watch|stop TAG [maze_curriculum.py args]"
    exit 2
    ;;
esac
end=$((SECONDS + ${LIMIT:-540}))
while [ ! -f "$dir/rc" ] && [ "$SECONDS" -lt "$end" ]; do sleep 2; done
n=$(($(cat "$dir/calls" 2>/dev/null || echo 0) + 1))
echo "$n" > "$dir/calls"
grep -v -e "Loading weights" -e "Writing model" "$dir/train.log" > "$OUT/$tag-$n.log"
grep -e '"level"' -e Traceback -e Error "$OUT/$tag-$n.log"
for m in "$mc"/*/metrics.jsonl; do  # where each level stands: the log has a level's line only once it ends
  [ -f "$m" ] && echo "$(basename "$(dirname "$m")") last: $(tail -n 1 "$m" | cut -c1-200)"
  [ -f "$m" ] && step_split "$m"
done
[ -d "$mc" ] && run_dirs_tgz "$OUT/$tag-$n.tgz" "$mc"
w=$(PYTHONPATH="$dir/src:${PYTHONPATH:-}" python3 -c \
  "import sys; from vlrl.envs.maze_weights import newest; print(newest(sys.argv[1]) or '')" "$mc")
stamp="$w $(stat -c %Y "$w"/*.safetensors 2>/dev/null | sort -n | tail -1)"
if [ "${PACK:-1}" != 0 ] && [ -n "$w" ] && [ "$stamp" != "$(cat "$dir/packed" 2>/dev/null)" ]; then
  # packed from a copy: the run may replace the directory meanwhile (a level's end swaps its weights in)
  rm -rf "$dir/wsrc" && cp -r "$w" "$dir/wsrc" && pack_back "$dir/wsrc" "$dir/wp" && echo "$stamp" > "$dir/packed" \
    && echo "packed $w: $(ls "$dir/wp" | wc -l) parts, part.00-03 under \$OUT"
  rm -rf "$dir/wsrc"
  if [ "$(ls "$dir/wp" 2>/dev/null | wc -l)" -gt 4 ]; then
    echo "part.04 on stay behind: \`cp $dir/wp/part.0[4-9] \$OUT/\` in the next call, before its watch packs again"
  fi
fi
if [ -f "$dir/rc" ]; then echo "the run ended: rc $(cat "$dir/rc")"; else echo "the run goes on: watch again"; fi
ls -la "$OUT"
