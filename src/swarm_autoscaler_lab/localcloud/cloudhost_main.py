"""The cloud host process: the chaos world (`cloudhost.CloudHost`) with a control API on loopback.

Run `python -m swarm_autoscaler_lab.localcloud.cloudhost_main --ready FILE [--options JSON]`: once up, it
writes FILE (JSON: the control URL, the daemon's AUTOSCALER_* settings and its pid) and serves until
SIGTERM or SIGINT, then stops everything it started. The control API: `GET /state`, `GET /report`,
`POST /backlog?n=&low=&high=`, `POST /cancel`, `POST /partition?share=&on=1|0`, each answering JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
from pathlib import Path

from aiohttp import web

from swarm_autoscaler_lab.localcloud.cloudhost import CloudHost, WorldOptions


def control_app(world: CloudHost) -> web.Application:
    """`GET /state`, `GET /report`, `POST /backlog?n=&low=&high=`, `POST /cancel`: JSON answers."""

    async def state(_: web.Request) -> web.Response:
        return web.json_response(await world.state())

    async def report(_: web.Request) -> web.Response:
        return web.json_response(world.report())

    async def backlog(request: web.Request) -> web.Response:
        q = request.query
        n = await world.submit_backlog(int(q["n"]), float(q.get("low", "0.5")), float(q.get("high", "2")))
        return web.json_response({"submitted": n})

    async def cancel(_: web.Request) -> web.Response:
        return web.json_response({"busy_workers": await world.cancel()})

    async def partition(request: web.Request) -> web.Response:
        q = request.query
        return web.json_response({"down": world.partition(float(q.get("share", "0.6")), q.get("on") == "1")})

    app = web.Application()
    app.router.add_get("/state", state)
    app.router.add_get("/report", report)
    app.router.add_post("/backlog", backlog)
    app.router.add_post("/cancel", cancel)
    app.router.add_post("/partition", partition)
    return app


async def serve(options: WorldOptions, ready: Path) -> None:
    """Run the world until SIGTERM or SIGINT; `ready` gets the control URL and the daemon's settings."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with CloudHost(options) as world:
        runner = web.AppRunner(control_app(world), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        try:
            port = runner.addresses[0][1]
            info = {"control": f"http://127.0.0.1:{port}", "env": world.daemon_env(), "pid": os.getpid()}
            partial = ready.with_suffix(".tmp")
            partial.write_text(json.dumps(info))
            partial.replace(ready)  # the reader never sees half a file
            print(f"cloud host up (seed {options.seed}): {info['control']}", flush=True)
            await stop.wait()
        finally:
            await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--ready", required=True, type=Path, help="file to write once the world is up")
    parser.add_argument("--options", default="{}", help="WorldOptions fields as a JSON object")
    args = parser.parse_args(argv)
    raw = json.loads(args.options)
    if "docker_latency" in raw:
        raw["docker_latency"] = tuple(raw["docker_latency"])
    options = WorldOptions(**raw)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("distributed").setLevel(logging.WARNING)  # dask logs every worker at INFO
    asyncio.run(serve(options, args.ready))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
