"""A tenant's payload for the "data, not code" tests: bytes that run code when `distributed` unpickles
them, and a scheduler stand-in that answers every message with them.

It stands in for a dask scheduler whose handlers someone replaced (any holder of a client can, with
`run_on_scheduler`): the keeper's tenants' schedulers and the daemon's own. The marker directory is the
trace: it exists only if something unpickled the payload."""

from __future__ import annotations

import asyncio
import os
import pickle
import ssl
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import msgpack


class Payload:
    """Unpickled, it makes the directory `path`: code chosen by whoever sent the bytes."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.mkdir, (self.path,))


def hostile_message(marker: Path) -> bytes:
    """One distributed message whose first frame points at a pickled frame (`__Pickled__`)."""
    frames = [
        msgpack.packb({"__Pickled__": 1}),
        msgpack.packb({"num-sub-frames": 0, "pickled-obj": pickle.dumps(Payload(str(marker)))}),
    ]
    prelude = struct.pack(f"<{len(frames) + 1}Q", len(frames), *map(len, frames))
    body = prelude + b"".join(frames)
    return struct.pack("<Q", len(body)) + body


@asynccontextmanager
async def hostile_scheduler(marker: Path, context: ssl.SSLContext | None = None) -> AsyncIterator[str]:
    """A server on loopback (TLS with `context`) answering every dask message, its handshake included,
    with `hostile_message(marker)`; yields its `tcp://` or `tls://` address."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(hostile_message(marker))  # as its handshake
            while True:
                (size,) = struct.unpack("<Q", await reader.readexactly(8))
                await reader.readexactly(size)
                writer.write(hostile_message(marker))  # as every answer
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"{'tls' if context else 'tcp'}://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()
