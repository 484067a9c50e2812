"""One request to a dask scheduler that reads the answer as data, never as code.

A dask scheduler runs its clients' code, so whatever it sends back is theirs. distributed's own comm
(`rpc`, `Client`, even the handshake of `connect`) decodes every message with
`distributed.protocol.loads`, which unpickles any `__Pickled__` or `__Serialized__` frame whatever
`deserializers=` says: whoever can replace a scheduler's handlers (any of its clients, with
`run_on_scheduler`) would run code in the reader. The keeper (which holds the admin token, redis and
every cluster's CA) reads its tenants' schedulers, and the daemon (which holds the cloud's credentials
and the docker socket) its own, through this module only:

- TLS with the cluster's client certificate (mutual: the same check as dask's own comm);
- the framing of `distributed.comm.tcp` (an 8-byte length, the frame count and lengths, the frames),
  with a bound on the size of what it reads (`LIMIT`);
- the first frame decoded by plain `msgpack` with no hooks: a map stays a map, a `__Pickled__` marker is
  just a key, and no other frame is ever looked at. The caller checks the shape of what came back.

Used for `set_metadata` (the keeper's launch hold), whose answer is `None`, and for every read the daemon
makes of its scheduler (`adapters.dask`: plain-data handlers it installs there).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct
from typing import Any

import msgpack
from distributed.security import Security

LIMIT = 64 * 1024  # bytes: a message the keeper reads (a handshake, a `None`) is a few dozen
HANDSHAKE_LIMIT = 64 * 1024
_Q = struct.Struct("<Q")
# What distributed.comm.core.Comm.handshake_info sends: no compression, the pickle protocol is only
# what the peer would use to pickle for us (we read no pickle).
_HANDSHAKE = {"compression": None, "python": (3, 11, 0), "pickle-protocol": 5}


class WireError(Exception):
    """The scheduler did not answer as the protocol says (or too much, or not at all)."""


def frame(message: Any) -> bytes:
    """`message` (plain data) as one distributed message of one msgpack frame."""
    body: bytes = msgpack.packb(message, use_bin_type=True)
    prelude = _Q.pack(1) + _Q.pack(len(body))
    return _Q.pack(len(prelude) + len(body)) + prelude + body


def first_frame(data: bytes) -> Any:
    """The first frame of one framed message (`data`: what followed the 8-byte length), decoded as plain
    msgpack: never a hook, so nothing in it can name code to run."""
    if len(data) < 8:
        raise WireError("short message")
    (count,) = _Q.unpack_from(data, 0)
    if not 1 <= count <= 64 or len(data) < 8 * (1 + count):
        raise WireError("bad frame count")
    (first,) = _Q.unpack_from(data, 8)
    start = 8 * (1 + count)
    if start + first > len(data):
        raise WireError("first frame longer than the message")
    try:
        return msgpack.unpackb(data[start : start + first], raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise WireError(f"not msgpack: {type(exc).__name__}") from exc


async def _read(reader: asyncio.StreamReader, limit: int) -> Any:
    try:
        (size,) = _Q.unpack(await reader.readexactly(8))
        if size > limit:
            raise WireError(f"message of {size} bytes is over the reader's limit of {limit}")
        return first_frame(await reader.readexactly(size))
    except asyncio.IncompleteReadError as exc:  # an EOFError, not an OSError: one error for callers
        raise WireError("the connection closed mid-message") from exc


def address(url: str) -> tuple[str, int]:
    """(host, port) of a `tcp://` or `tls://` scheduler address (dask's default scheme is tcp)."""
    scheme, _, rest = url.rpartition("://")
    if scheme not in ("tls", "tcp", ""):
        raise WireError(f"unsupported scheme {scheme!r}")
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        raise WireError(f"not host:port: {rest!r}")
    return host.strip("[]"), int(port)


def client_context(ca: str, cert: str, key: str) -> ssl.SSLContext:
    """The TLS client context dask's own comm would use with these PEM files (mutual TLS)."""
    security = Security(  # type: ignore[no-untyped-call]
        tls_ca_file=ca, tls_client_cert=cert, tls_client_key=key, require_encryption=True
    )
    context: ssl.SSLContext = security.get_connection_args("client")["ssl_context"]  # type: ignore[no-untyped-call]
    return context


async def call(
    url: str, context: ssl.SSLContext | None, message: dict[str, Any], timeout: float, limit: int = LIMIT
) -> Any:
    """Send `message` (an `op` and its arguments) to the scheduler at `url` and return its answer as
    plain data, at most `limit` bytes. `context`: the TLS client context (None for `tcp://`). Raises
    `WireError`, `OSError` or `TimeoutError`."""
    host, port = address(url)
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection(host, port, ssl=context, limit=LIMIT)
        try:
            writer.write(frame(_HANDSHAKE))
            await _read(reader, HANDSHAKE_LIMIT)  # the scheduler's handshake: read past, as data
            writer.write(frame({**message, "reply": True}))
            await writer.drain()
            return await _read(reader, limit)
        finally:
            writer.close()
            with contextlib.suppress(OSError, ssl.SSLError):
                await writer.wait_closed()
