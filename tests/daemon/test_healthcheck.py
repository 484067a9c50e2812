"""`swarm-autoscaler healthcheck` (the image's HEALTHCHECK) against a real HTTP server on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from swarm_autoscaler.keeper.adapters.api_tls import api_hosts, make_api_pki, server_context_of

CLI = str(Path(sys.executable).with_name("swarm-autoscaler"))


class _Handler(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        code = 200 if self.path == "/healthz" and self.status == 200 else 503
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b"ok" if code == 200 else b"last successful tick is too old")

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()
    _Handler.status = 200


def healthcheck(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AUTOSCALER_")}
    return subprocess.run(
        [CLI, "healthcheck", *args],
        capture_output=True,
        text=True,
        env={**clean, **env},
        timeout=60,
        check=False,
    )


def test_healthy_when_healthz_answers_200_on_the_wildcard_host(server: ThreadingHTTPServer) -> None:
    done = healthcheck(AUTOSCALER_HTTP_HOST="0.0.0.0", AUTOSCALER_HTTP_PORT=str(server.server_port))
    assert done.returncode == 0, done.stderr
    assert f"http://127.0.0.1:{server.server_port}/healthz answered 200" in done.stdout


def test_unhealthy_in_one_line_when_healthz_answers_503(server: ThreadingHTTPServer) -> None:
    _Handler.status = 503
    done = healthcheck(AUTOSCALER_HTTP_HOST="127.0.0.1", AUTOSCALER_HTTP_PORT=str(server.server_port))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "503" in done.stderr and "too old" in done.stderr


def test_unhealthy_when_nothing_listens(server: ThreadingHTTPServer) -> None:
    port = server.server_port
    server.shutdown()
    server.server_close()
    done = healthcheck(AUTOSCALER_HTTP_HOST="127.0.0.1", AUTOSCALER_HTTP_PORT=str(port))
    assert done.returncode == 1 and "unhealthy" in done.stderr and "Traceback" not in done.stderr


def test_keeper_flag_asks_the_keepers_port_and_reads_none_of_its_other_settings(
    server: ThreadingHTTPServer,
) -> None:
    done = healthcheck(
        "--keeper",
        AUTOSCALER_HTTP_HOST="127.0.0.1",
        AUTOSCALER_HTTP_PORT="1",  # the daemon's port: not the keeper's
        AUTOSCALER_KEEPER_HTTP_PORT=str(server.server_port),
        AUTOSCALER_KEEPER_TOKEN="short",  # invalid for the keeper, and none of the health check's business
        AUTOSCALER_KEEPER_PLAIN_HTTP="true",  # this server speaks plain HTTP, as such a keeper does
    )
    assert done.returncode == 0, done.stderr
    assert f"http://127.0.0.1:{server.server_port}/healthz answered 200" in done.stdout


def test_keeper_flag_asks_over_https_by_default(server: ThreadingHTTPServer) -> None:
    """The keeper serves HTTPS by default, with a certificate of its own (`adapters.api_tls`): the same
    server wrapped in that TLS, asked with no other setting, answers; plain HTTP is not tried."""
    pki = make_api_pki("k", api_hosts(None))
    server.socket = server_context_of(pki).wrap_socket(server.socket, server_side=True)
    done = healthcheck("--keeper", AUTOSCALER_KEEPER_HTTP_PORT=str(server.server_port))
    assert done.returncode == 0, done.stderr
    assert f"https://127.0.0.1:{server.server_port}/healthz answered 200" in done.stdout
