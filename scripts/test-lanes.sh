#!/usr/bin/env bash
# The test suite of `make test` in two lanes at once (the audit runs after both, from the Makefile):
#
#   swarm lane: the tests that run a local docker swarm, one process at a time and in order (only one local
#               swarm may exist on a machine, and each process's swarm is session-scoped): the swarm adapter
#               tests (marker `swarm`, not `e2e`), then the end-to-end suite (marker `e2e`).
#   fast lane:  every other test (no swarm, no e2e, no audit) with pytest-xdist on TEST_WORKERS workers.
#
# The swarm lane spends most of its time waiting (nodes booting, daemons' poll intervals and delays), so the
# fast lane runs beside it on the same cores. The fast lane's output goes to build/test-fast-lane.log and is
# printed once that lane ends. It runs at a lower priority (nice 5): the swarm lane's timings come first.
# Both lanes always run to the end, and the script fails if either failed.
# Usage: scripts/test-lanes.sh BIN (the virtualenv's bin folder); the caller sets the suite's environment.
set -uo pipefail
BIN=${1:?usage: scripts/test-lanes.sh BIN}
WORKERS=${TEST_WORKERS:-2}
mkdir -p build
FAST_LOG=build/test-fast-lane.log

nice -n 5 "$BIN/pytest" -m "not swarm and not e2e and not audit" -n "$WORKERS" --durations=15 >"$FAST_LOG" 2>&1 &
fast_pid=$!
# The fast lane is this script's child: stop it (by its pid) if the script is interrupted.
trap 'kill "$fast_pid" 2>/dev/null' INT TERM

swarm_rc=0
"$BIN/pytest" -m "swarm and not e2e and not audit" --durations=5 || swarm_rc=$?
e2e_rc=0
"$BIN/pytest" -m e2e tests/e2e --durations=15 || e2e_rc=$?

fast_rc=0
wait "$fast_pid" || fast_rc=$?
trap - INT TERM
echo "================================ fast lane (pytest -n $WORKERS) ================================"
cat "$FAST_LOG"
echo "lanes: swarm adapter tests rc=$swarm_rc, e2e rc=$e2e_rc, fast lane rc=$fast_rc"
[ "$swarm_rc" = 0 ] && [ "$e2e_rc" = 0 ] && [ "$fast_rc" = 0 ]
