"""A keeper cluster's autoscaler reads its cluster token from `AUTOSCALER_EC2_LISTING_TOKEN_FILE` (the
swarm secret the primary's boot script makes from its one-time credentials fetch; the token is never in
user data), which wins over `AUTOSCALER_EC2_LISTING_TOKEN`; an unreadable file is a configuration error
naming the setting. The settings load from an env file as `swarm-autoscaler run` loads them; the file
stands in for /run/secrets/keeper-listing-token."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from swarm_autoscaler.config.settings import Settings, load_settings
from swarm_autoscaler.daemon.app import _listing_token
from swarm_autoscaler.errors import ConfigurationError


def _settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **extra: str) -> Settings:
    for name in [n for n in os.environ if n.startswith("AUTOSCALER_")]:
        monkeypatch.delenv(name)
    env = {
        "AUTOSCALER_CLUSTER_NAME": "kc-0123456789abcdef",
        "AUTOSCALER_EC2_REGION": "eu-west-1",
        "AUTOSCALER_EC2_ALLOWED_TYPES": json.dumps({"m5.large": {"ami_id": "ami-0123456789abcdef0"}}),
        "AUTOSCALER_EC2_LISTING_URL": "https://10.0.0.5:8080/v1/primaries/kc-0123456789abcdef/instances",
        "AUTOSCALER_EC2_LISTING_TOKEN": "from-the-env",
        "AUTOSCALER_DASK_SCHEDULER_URL": "tls://10.0.0.9:8786",
        **extra,
    }
    path = tmp_path / "cluster.env"
    path.write_text("".join(f"{k}='{v}'\n" for k, v in env.items()))
    return load_settings(path)


def test_the_token_file_wins_and_the_plain_setting_still_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "keeper-listing-token"
    secret.write_text("from-the-secret\n")  # `docker secret create` keeps a trailing newline
    assert _listing_token(_settings(tmp_path, monkeypatch)) == "from-the-env"
    with_file = _settings(tmp_path, monkeypatch, AUTOSCALER_EC2_LISTING_TOKEN_FILE=str(secret))
    assert _listing_token(with_file) == "from-the-secret"


def test_an_unreadable_token_file_is_a_configuration_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "not-there"
    settings = _settings(tmp_path, monkeypatch, AUTOSCALER_EC2_LISTING_TOKEN_FILE=str(missing))
    with pytest.raises(ConfigurationError, match="AUTOSCALER_EC2_LISTING_TOKEN_FILE: cannot read"):
        _listing_token(settings)
