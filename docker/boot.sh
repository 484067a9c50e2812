#!/bin/sh
# Entry point of the daemon's container (and usable outside one).
# When AUTOSCALER_DEBUGPY_PORT is set, the daemon starts under debugpy, listening on
# AUTOSCALER_DEBUGPY_HOST (default 127.0.0.1: publish or tunnel the port deliberately) and, when
# AUTOSCALER_DEBUGPY_WAIT=1, waiting for the debugger to attach before the first tick.
# Debugging is off unless that variable is set.
set -eu
cmd="${*:-run}"
if [ -n "${AUTOSCALER_DEBUGPY_PORT:-}" ]; then
  host="${AUTOSCALER_DEBUGPY_HOST:-127.0.0.1}"
  wait_flag=""
  case "$(echo "${AUTOSCALER_DEBUGPY_WAIT:-false}" | tr '[:upper:]' '[:lower:]')" in
    1|true|yes|on) wait_flag="--wait-for-client" ;;
  esac
  echo "boot.sh: debugpy listening on ${host}:${AUTOSCALER_DEBUGPY_PORT}${wait_flag:+ (waiting for the client)}" >&2
  # shellcheck disable=SC2086
  exec python -m debugpy --listen "${host}:${AUTOSCALER_DEBUGPY_PORT}" $wait_flag -m swarm_autoscaler $cmd
fi
# shellcheck disable=SC2086
exec python -m swarm_autoscaler $cmd
