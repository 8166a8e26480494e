#!/usr/bin/env bash
# One host of a verl-ts run spanning hosts, started by a cluster engine with
# torchrun-style environment: MASTER_ADDR, MASTER_PORT, NNODES, NODE_RANK, and the
# run's token in VERL_JOIN_TOKEN (or a file named by VERL_JOIN_TOKEN_FILE).
# Every host runs this host's agent (`verl worker`); NODE_RANK 0 also runs the
# driver (`verl train ARGS...`, trainer.nnodes=$NNODES, resume_mode=auto so a
# restarted run continues from the last checkpoint). Exit code: the driver's on
# node 0, the agent's elsewhere.
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
if [ "$NODE_RANK" = "0" ]; then
  $VERL train trainer.nnodes="$NNODES" trainer.resume_mode=auto "$@" &
  driver=$!
fi
$VERL worker --join "$MASTER_ADDR:$MASTER_PORT" --node-rank "$NODE_RANK" --name "$(hostname)"
agent_rc=$?
if [ -n "$driver" ]; then
  wait "$driver"
  exit $?
fi
exit "$agent_rc"
