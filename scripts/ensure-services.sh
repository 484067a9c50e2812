#!/usr/bin/env bash
# Installs the servers the test suite starts by itself (redis-server; dockerd, busybox-static, and
# docker-registry with apache2-utils' htpasswd for the swarm and e2e tests when root), and promtool (Debian's prometheus package) for the check of docker/alerts.yml.
# Only installs packages; it starts nothing: each test fixture starts and stops its own server.
set -euo pipefail
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
if [ "$(id -u)" = 0 ]; then
  command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
  # the swarm tests' service tasks run a busybox-only image (`docker import`ed: no registry); it must be static
  dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
  # the e2e suite's private registry (with htpasswd auth): machines pull the worker image from it
  command -v docker-registry >/dev/null 2>&1 || need+=(docker-registry)
  command -v htpasswd >/dev/null 2>&1 || need+=(apache2-utils)
  # optional: without it the rules' structure is still checked, and the promtool test is skipped
  command -v promtool >/dev/null 2>&1 || need+=(prometheus)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "missing ${need[*]}: install them (apt-get install ${need[*]}) or run as root" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # Debian's packages may start their services on install; the tests run their own on other ports and sockets.
  if command -v systemctl >/dev/null 2>&1; then systemctl stop redis-server docker docker.socket containerd prometheus docker-registry 2>/dev/null || true; fi
fi
