#!/usr/bin/env bash
# One host of a verl-ts run spanning hosts, started by a cluster engine with
# torchrun-style environment: MASTER_ADDR, MASTER_PORT, NNODES, NODE_RANK, and the
# run's token in VERL_JOIN_TOKEN (or a file named by VERL_JOIN_TOKEN_FILE).
# Every host runs this host's agent (`verl worker`); NODE_RANK 0 also runs the
# driver (`verl train ARGS...`, trainer.nnodes=$NNODES, resume_mode=auto so a
# restarted run continues from the last checkpoint).
#
# Exit code: 0 only when the run succeeded (the driver tells every agent the
# outcome; an agent exits 1 when the run failed or its driver was lost), so the
# engine sees every host of a failed run fail and restarts the group as a whole.
# SIGTERM/SIGINT (a pod deleted, a job cancelled or preempted) are forwarded to
# the driver and the agent: the driver tells every host the run stopped and exits
# 143; checkpoints are written to a temp directory and renamed, so the last
# complete one stands for the restart.
#   deploy/entrypoint.sh trainer.n_gpus_per_node=2 data.train_files=... [more overrides]
set -uo pipefail
: "${MASTER_ADDR:?MASTER_ADDR must name node 0}" "${NNODES:?NNODES must be the number of hosts}" "${NODE_RANK:?NODE_RANK must be the index of this host}"
MASTER_PORT="${MASTER_PORT:-29500}"
export MASTER_ADDR MASTER_PORT
if [ -z "${VERL_JOIN_TOKEN:-}" ] && [ -z "${VERL_JOIN_TOKEN_FILE:-}" ]; then
  echo "entrypoint: set VERL_JOIN_TOKEN or VERL_JOIN_TOKEN_FILE (the same on every host)" >&2
  exit 2
fi
VERL="${VERL:-verl}"
driver=""
agent=""
forward() {
  trap '' TERM INT
  echo "entrypoint: got $1, forwarding it to the driver and the agent" >&2
  [ -n "$driver" ] && kill -TERM "$driver" 2>/dev/null
  [ -n "$agent" ] && kill -TERM "$agent" 2>/dev/null
}
trap 'forward SIGTERM' TERM
trap 'forward SIGINT' INT
if [ "$NODE_RANK" = "0" ]; then
  $VERL train trainer.nnodes="$NNODES" trainer.resume_mode=auto "$@" &
  driver=$!
fi
$VERL worker --join "$MASTER_ADDR:$MASTER_PORT" --node-rank "$NODE_RANK" --name "$(hostname)" &
agent=$!
# `wait` returns early when a trapped signal arrives: wait again for the real exit status.
wait_for() {
  local pid=$1 rc
  while :; do
    wait "$pid"; rc=$?
    kill -0 "$pid" 2>/dev/null || return "$rc"
  done
}
wait_for "$agent"; agent_rc=$?
if [ -n "$driver" ]; then
  wait_for "$driver"; driver_rc=$?
  # The host fails when either failed: the driver's code first.
  [ "$driver_rc" -ne 0 ] && exit "$driver_rc"
fi
exit "$agent_rc"
