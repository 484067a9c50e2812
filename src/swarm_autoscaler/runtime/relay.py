"""A pipe to a TCP port inside a replica's own network namespace, for `docker exec -i`.

`python3 -m swarm_autoscaler.runtime.relay [HOST:]PORT` connects to HOST:PORT (127.0.0.1 by default) from
where it runs and copies stdin to the connection and the connection to stdout until either side closes.
Run through `docker exec -i <replica> ...`, it reaches a port that listens only on the replica's loopback
(debugpy, `AUTOSCALER_DEBUGPY_PORT`) without publishing anything; docs/debugging.md has the recipe.
"""

from __future__ import annotations

import os
import socket
import sys
import threading


def _pump_in(sock: socket.socket) -> None:
    while chunk := os.read(0, 65536):
        sock.sendall(chunk)
    sock.shutdown(socket.SHUT_WR)


def main(argv: list[str] | None = None) -> None:
    target = (sys.argv[1:] if argv is None else argv)[0]
    host, _, port = target.rpartition(":")
    sock = socket.create_connection((host or "127.0.0.1", int(port)), timeout=10)
    sock.settimeout(None)
    threading.Thread(target=_pump_in, args=(sock,), daemon=True).start()
    while chunk := sock.recv(65536):
        os.write(1, chunk)


if __name__ == "__main__":
    main()
