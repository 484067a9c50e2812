"""moto's EC2 in a process of its own, for a world too loaded to serve it beside everything else.

In the chaos world (`cloudhost`) moto shares one process, one GIL, with the dask scheduler, the docker API
imitation and every emulated machine's dask worker. At 100 machines, moto serialising DescribeInstances
took about half of that process's GIL, and the daemon's calls to the scheduler and the docker API waited
behind it (the world's loop lagged by seconds). `WorldOptions.moto_process` moves moto here.

`python -m swarm_autoscaler_lab.localcloud.moto_proc --ready FILE --guard URL [--seed N]
[--slow-rate P --slow-max S]`: moto's server with the project's fault injector on 127.0.0.1, plus a small
control server. Once up it writes FILE (JSON: `endpoint`, `control`). The faults the world injects in
moto's request threads are injected here the same way: a share `slow-rate` of DescribeInstances calls is
slowed by up to `slow-max` seconds, and every TerminateInstances is first POSTed to the world's guard
(`--guard`, JSON `{"instance_ids": [...]}`; the world checks those machines' workers at that moment) and
only answered once the guard has answered. `GET /calls` on the control server: the EC2 calls served by
action, and how many reads were slowed. Serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from swarm_autoscaler_lab.localcloud.ec2_strict import chaos_strict, fired
from swarm_autoscaler_lab.localcloud.moto_server import MotoServer

GUARD_TIMEOUT_S = 10.0


class _Faults:
    """The world's faults, injected in moto's request threads (a seeded RNG, behind a lock)."""

    def __init__(self, guard_url: str, seed: int, slow_rate: float, slow_max: float) -> None:
        self.guard_url, self.slow_rate, self.slow_max = guard_url, slow_rate, slow_max
        self.slowed = 0
        self._rng = random.Random(seed + 1)
        self._lock = threading.Lock()

    def __call__(self, action: str, params: dict[str, str]) -> None:
        if action == "DescribeInstances":
            with self._lock:
                delay = self._rng.uniform(0, self.slow_max)
                slow = self._rng.random() < self.slow_rate
                self.slowed += slow
            if slow:
                time.sleep(delay)
        elif action == "TerminateInstances":
            ids = [v for k, v in sorted(params.items()) if k.startswith("InstanceId.")]
            body = json.dumps({"instance_ids": ids}).encode()
            request = urllib.request.Request(self.guard_url, data=body, method="POST")
            with urllib.request.urlopen(request, timeout=GUARD_TIMEOUT_S) as reply:
                reply.read()


def _control(moto: MotoServer, faults: _Faults) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/calls":
                self.send_error(404)
                return
            strict = fired(moto.faults.strict)
            body = json.dumps(
                {"calls": moto.faults.calls(), "slowed": faults.slowed, "strict": strict}
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return None

    return ThreadingHTTPServer(("127.0.0.1", 0), Handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--ready", required=True, type=Path)
    parser.add_argument("--guard", required=True, help="the world's URL that checks a TerminateInstances")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slow-rate", type=float, default=0.0)
    parser.add_argument("--slow-max", type=float, default=0.0)
    parser.add_argument(
        "--strict", action="store_true", help="EC2's rules for the daemon's requests (ec2_strict)"
    )
    args = parser.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    faults = _Faults(args.guard, args.seed, args.slow_rate, args.slow_max)
    with MotoServer(seed=args.seed) as moto:
        moto.faults.watch(faults)
        moto.faults.be_strict(chaos_strict() if args.strict else None)
        control = _control(moto, faults)
        thread = threading.Thread(target=control.serve_forever, name="moto-control", daemon=True)
        thread.start()
        try:
            info = {"endpoint": moto.endpoint, "control": f"http://127.0.0.1:{control.server_address[1]}"}
            partial = args.ready.with_suffix(".tmp")
            partial.write_text(json.dumps(info))
            partial.replace(args.ready)  # the reader never sees half a file
            while not stop.wait(0.5):
                pass
        finally:
            control.shutdown()
            control.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
