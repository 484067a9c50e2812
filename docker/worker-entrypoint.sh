#!/bin/sh
# The dask worker's entrypoint for the worker service (docker/worker-stack.yml), for ANY image that has
# python3 and `distributed` installed: it needs nothing of swarm-autoscaler. Copy it into your image
# (docs/worker-service.md, "Your own worker image"):
#   COPY docker/worker-entrypoint.sh /usr/local/bin/swarm-autoscaler-worker
#
# It reads the env file the machine's user data wrote (/etc/swarm-autoscaler/worker.env, mounted
# read-only; override with SWARM_AUTOSCALER_WORKER_ENV): shell-quoted KEY=value lines, among them
#   SWARM_AUTOSCALER_WORKER_RESOURCES  "CPU=2 RAM=8589934592 instance-type:m5.large=1e9" (required)
#   SWARM_AUTOSCALER_WORKER_NTHREADS   threads of the one worker process (default 1)
#   SWARM_AUTOSCALER_WORKER_MEMORY_LIMIT  the worker's memory limit in bytes (default 0: none)
# and replaces itself with
#   python3 -m distributed.cli.dask_worker $DASK_SCHEDULER_ADDRESS --name $DASK_WORKER_NAME ...
# DASK_SCHEDULER_ADDRESS comes from the service; DASK_WORKER_NAME from {{.Node.Hostname}} (the
# container's hostname otherwise); DASK_WORKER_HOST, when set, is the address it listens on. Extra
# arguments are passed on to the worker. Without the env file it refuses to start: a machine not
# launched by the daemon never runs an unpinned worker.
# On Python 3.11 the worker's profiler can deadlock the process (CPython gh-106883): it is turned off
# unless DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED is set.
set -eu
env_file=${SWARM_AUTOSCALER_WORKER_ENV:-/etc/swarm-autoscaler/worker.env}
if [ ! -f "$env_file" ]; then
    echo "$env_file is missing: this machine was not launched by swarm-autoscaler" >&2
    exit 1
fi
# the values are shell-quoted (the daemon writes them with shlex.quote): the file is read as shell
# shellcheck disable=SC1090
. "$env_file"
: "${DASK_SCHEDULER_ADDRESS:?DASK_SCHEDULER_ADDRESS is not set (the worker service sets it)}"
: "${SWARM_AUTOSCALER_WORKER_RESOURCES:?$env_file has no SWARM_AUTOSCALER_WORKER_RESOURCES}"
python=${PYTHON:-python3}
if [ -z "${DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED:-}" ] \
    && [ "$("$python" -c 'import sys; print(sys.version_info[:2] == (3, 11))')" = True ]; then
    export DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False
fi
set -- "$DASK_SCHEDULER_ADDRESS" \
    --name "${DASK_WORKER_NAME:-$(hostname)}" \
    --nthreads "${SWARM_AUTOSCALER_WORKER_NTHREADS:-1}" --nworkers 1 \
    --resources "$SWARM_AUTOSCALER_WORKER_RESOURCES" \
    --memory-limit "${SWARM_AUTOSCALER_WORKER_MEMORY_LIMIT:-0}" \
    --no-dashboard \
    ${DASK_WORKER_HOST:+--host "$DASK_WORKER_HOST"} \
    "$@"
echo "starting: dask worker $* (DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=${DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED:-})"
exec "$python" -m distributed.cli.dask_worker "$@"
