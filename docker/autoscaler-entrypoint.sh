#!/bin/sh
# The image's entrypoint: `swarm-autoscaler "$@"` as the unprivileged user 10001, in the group of the
# docker socket mounted at /var/run/docker.sock, whatever that group's id is on the node the container
# runs on (a stack's replicas land on any manager, whose docker group ids may differ: a fixed
# `user: 10001:<gid>` read on one manager would lock the others out of their socket).
# Started as root (the image's default), it drops to 10001 with setpriv (util-linux, in every Debian
# image) keeping no capability; started as another user (`--user`), it runs as that user unchanged.
set -eu
if [ "$(id -u)" != 0 ]; then
    exec swarm-autoscaler "$@"
fi
groups=10001
socket=/var/run/docker.sock
if [ -S "$socket" ]; then
    groups="10001,$(stat -c %g "$socket")"
fi
exec setpriv --reuid=10001 --regid=10001 --groups="$groups" --inh-caps=-all --bounding-set=-all \
    swarm-autoscaler "$@"
