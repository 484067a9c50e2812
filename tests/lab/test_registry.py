"""The e2e suite's private registry (`localcloud.registry`, Debian's docker-registry with htpasswd): it
answers only with its credentials, as ECR or a team's registry does. Pushing to it and pulling from it on
dockerd nodes is in tests/e2e (the worker image of every machine booting from its user data)."""

from __future__ import annotations

import base64
import urllib.error
import urllib.request

import pytest

from swarm_autoscaler_lab.localcloud.registry import LocalRegistry, missing

pytestmark = pytest.mark.skipif(bool(missing()), reason="docker-registry or htpasswd missing")


def _status(url: str, auth: tuple[str, str] | None = None) -> int:
    request = urllib.request.Request(url)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code


def test_the_registry_asks_for_its_credentials_and_stops_cleanly() -> None:
    with LocalRegistry(address="127.0.0.251", port=5001) as reg:
        url = f"http://{reg.host}/v2/"
        assert _status(url) == 401
        assert _status(url, (reg.user, "wrong")) == 401
        assert _status(url, (reg.user, reg.password)) == 200
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)
