"""A stand-in for each local machine's instance metadata service (IMDSv2), enough for a boot script to
learn its own private IP: `PUT /latest/api/token`, then `GET /latest/meta-data/local-ipv4` with it.

EC2 answers each machine at 169.254.169.254, telling machines apart by the interface the request came
in on. Local machines share the host's network namespace, so one server on a loopback port serves them
all, each under its own prefix, `<base>/<hostname>`: a machine's boot is given that as
`AWS_EC2_METADATA_SERVICE_ENDPOINT` (the variable AWS SDKs read instead of 169.254.169.254, and the
product's boot scripts too). `local-ipv4` is the address in the machine's EC2 hostname
(`ip-127-5-0-4` -> 127.5.0.4), which is the PrivateIpAddress moto gave the instance, since moto derives
the private DNS name from it: with a VPC carved from loopback (`provision_network(prefix="127.N")`) it
is an address the machine's boot can send from. What does not stand in: the token's TTL and hop limit
(any PUT gets a token, every GET with it an answer), and every other metadata path (404).
"""

from __future__ import annotations

import secrets

from aiohttp import web

from swarm_autoscaler.runtime.http import start_http

_TOKEN_HEADER = "X-aws-ec2-metadata-token"


def ipv4_of(hostname: str) -> str | None:
    """The private IP an EC2 hostname carries (`ip-10-0-1-23[.ec2.internal]` -> 10.0.1.23), or None."""
    label = hostname.split(".", 1)[0]
    if not label.startswith("ip-"):
        return None
    parts = label[3:].split("-")
    if len(parts) != 4 or not all(p.isdigit() and int(p) < 256 for p in parts):
        return None
    return ".".join(str(int(p)) for p in parts)


def hostname_of(ipv4: str) -> str:
    """EC2's short hostname for a private IP (10.0.1.23 -> `ip-10-0-1-23`): `ipv4_of`'s inverse."""
    return "ip-" + ipv4.replace(".", "-")


class MetadataService:
    """Start with `await service.start()`; `endpoint(hostname)` is that machine's base URL."""

    def __init__(self) -> None:
        self._tokens: set[str] = set()
        self._runner: web.AppRunner | None = None
        self.base = ""
        self.asked: list[str] = []  # hostnames whose local-ipv4 was read (tests check the boot asked)

    async def start(self) -> MetadataService:
        app = web.Application()
        app.router.add_put("/{host}/latest/api/token", self._token)
        app.router.add_get("/{host}/latest/meta-data/local-ipv4", self._local_ipv4)
        self._runner = await start_http(app, "127.0.0.1", 0)
        self.base = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    def endpoint(self, hostname: str) -> str:
        return f"{self.base}/{hostname}"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _token(self, _: web.Request) -> web.Response:
        token = secrets.token_urlsafe(24)
        self._tokens.add(token)
        return web.Response(text=token)

    async def _local_ipv4(self, request: web.Request) -> web.Response:
        if request.headers.get(_TOKEN_HEADER) not in self._tokens:
            return web.Response(status=401)  # IMDSv2 is required on the machines the daemon launches
        host = request.match_info["host"]
        address = ipv4_of(host)
        if address is None:
            return web.Response(status=404)
        self.asked.append(host)
        return web.Response(text=address)
