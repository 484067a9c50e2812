"""One spelling of a machine's hostname, so that instances, swarm nodes and dask workers match.

EC2 names a machine `ip-10-0-1-23.eu-west-1.compute.internal` (its private DNS name). What the OS reports,
and so what docker gives as the node's hostname (and the worker's name, from `{{.Node.Hostname}}`),
depends on the AMI: Ubuntu and Debian report the short form `ip-10-0-1-23`, Amazon Linux the full one.
Every adapter keys a machine by `machine_hostname(name)`: the part before the first dot, so both forms
match. An IP address literal is kept whole (it has no DNS label to cut).
"""

from __future__ import annotations

import ipaddress


def machine_hostname(name: str) -> str:
    """`name` up to its first dot (`ip-10-0-1-23.eu-west-1.compute.internal` -> `ip-10-0-1-23`); an
    IP address, or a name without a dot, unchanged."""
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return name.split(".", 1)[0]
    return name
