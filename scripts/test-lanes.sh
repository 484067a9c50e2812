#!/usr/bin/env bash
# The test suite of `make test`, after the lint (the command in LINT, from the Makefile), in two lanes at
# once; the audit runs after both, from the Makefile:
#
#   swarm lane: the tests that run a local docker swarm, one process at a time and in order (only one local
#               swarm may exist on a machine, and each process's swarm is session-scoped): the swarm adapter
#               tests (marker `swarm`, not `e2e`), then the end-to-end suite on dockerd nodes (marker `e2e`,
#               not `no_dockerd`).
#   fast lane:  every other test (no swarm, no audit; the end-to-end tests whose swarms are in memory, marker
#               `no_dockerd`, included) with pytest-xdist on TEST_WORKERS workers.
#
# The swarm lane spends most of its time waiting (nodes booting, daemons' poll intervals and delays), so the
# fast lane runs beside it on the same cores, at a lower priority (nice 5): the swarm lane's timings come
# first. Its output goes to build/test-fast-lane.log and is printed once it ends. Both lanes always run to
# the end, and the script fails if either failed.
# The images' shared inputs (the Debian base and the wheelhouse, `localcloud.image --prepare`: downloads, no
# dockerd) are made from the start, during lint and the swarm adapter tests; the e2e suite waits for them.
# Usage: LINT='...' scripts/test-lanes.sh BIN (the virtualenv's bin folder); the caller sets the suite's
# environment.
set -uo pipefail
BIN=${1:?usage: LINT=... scripts/test-lanes.sh BIN}
LINT=${LINT:?the lint command (the Makefile passes its own)}
WORKERS=${TEST_WORKERS:-2}
DURATIONS=${TEST_DURATIONS:-15}  # how many of the slowest tests each run prints (0: all)
mkdir -p build
FAST_LOG=build/test-fast-lane.log
PREP_LOG=build/test-image-prepare.log

"$BIN/python" -m swarm_autoscaler_lab.localcloud.image --prepare >"$PREP_LOG" 2>&1 &
prep_pid=$!
fast_pid=
# Both are this script's children: stop them (by pid) if the script is interrupted or lint fails.
stop_children() { kill $prep_pid $fast_pid 2>/dev/null; }
trap stop_children INT TERM

if ! bash -c "$LINT"; then
  stop_children
  exit 1
fi

nice -n 5 "$BIN/pytest" -m "not swarm and not audit and (not e2e or no_dockerd)" -n "$WORKERS" --durations="$DURATIONS" \
  >"$FAST_LOG" 2>&1 &
fast_pid=$!

swarm_rc=0
"$BIN/pytest" -m "swarm and not e2e and not audit" --durations=5 || swarm_rc=$?
# Not fatal: without root (or offline) the e2e suite says what it lacks when it builds the images itself.
wait $prep_pid || echo "preparing the images' inputs failed (the e2e suite builds them): $(tail -5 "$PREP_LOG")"
e2e_rc=0
"$BIN/pytest" -m "e2e and not no_dockerd" tests/e2e --durations="$DURATIONS" || e2e_rc=$?

fast_rc=0
wait $fast_pid || fast_rc=$?
trap - INT TERM
echo "================================ fast lane (pytest -n $WORKERS) ================================"
cat "$FAST_LOG"
echo "lanes: swarm adapter tests rc=$swarm_rc, e2e rc=$e2e_rc, fast lane rc=$fast_rc"
[ "$swarm_rc" = 0 ] && [ "$e2e_rc" = 0 ] && [ "$fast_rc" = 0 ]
