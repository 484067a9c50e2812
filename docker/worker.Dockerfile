# A team's dask worker image: the team's libraries, the pinned Python and `distributed`, and our
# entrypoint script (docker/worker-entrypoint.sh), and nothing of swarm-autoscaler. A recipe to adapt
# (docs/worker-service.md, "Your own worker image"); the e2e suite builds it as it is and runs the
# worker service from it.
#
#   docker build -f docker/worker.Dockerfile -t registry.example.com/team/dask-worker:2026.8.0-1 .
#
# Build arguments:
#   BASE      an image with python3 and its venv module, the SAME minor version as your clients' and the
#             scheduler's (Python 3.11 here: the scheduler image and the daemon's checks expect it)
#   PACKAGES  what pip installs: `distributed` pinned to the scheduler's version (dask pickles functions
#             between client, scheduler and workers: all three need the same distributed and Python minor
#             version), then the team's own libraries, e.g. "distributed==2026.8.0 numpy==2.3.2 pandas==2.3.1"
# When build/wheels/ holds wheels, pip installs from there alone, without a network (as `make image` does).
ARG BASE=python:3.11-slim

FROM ${BASE}
ARG PACKAGES="distributed==2026.8.0"
# the entrypoint script, and the wheels when there are any (the script keeps the source list non-empty)
COPY docker/worker-entrypoint.sh build/wheel[s] /wheels/
RUN set -eu; \
    offline=""; if ls /wheels/*.whl >/dev/null 2>&1; then offline="--no-index --find-links=/wheels"; fi; \
    python3 -m venv /opt/venv; \
    /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check $offline $PACKAGES; \
    /opt/venv/bin/pip uninstall --yes --quiet pip setuptools >/dev/null 2>&1 || true; \
    cp /wheels/worker-entrypoint.sh /usr/local/bin/swarm-autoscaler-worker; \
    chmod 755 /usr/local/bin/swarm-autoscaler-worker; \
    rm -rf /wheels
# (runs as root, like the autoscaler's worker: add a USER whose uid can read /etc/swarm-autoscaler)
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHON=/opt/venv/bin/python3
ENTRYPOINT ["/usr/local/bin/swarm-autoscaler-worker"]
