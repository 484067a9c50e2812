"""The keeper's default primary boot script, rendered as the keeper renders it for one cluster: valid
bash, pinned images only, every AUTOSCALER_* variable it writes is a real setting (and the resulting
cluster autoscaler settings load), the dask options it passes exist in the pinned distributed, the
worker entrypoint it runs exists, and it fetches its TLS files with the cluster's one-time token.

What these checks stand in for: no test here runs the script on a machine with cloud-init (the
keeper's end-to-end tests boot primaries through the local cloud's emulator, which follows the same
protocol: fetch the files with the token, run a TLS scheduler)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from swarm_autoscaler.config.keeper import DEFAULT_PRIMARY_BOOT, load_keeper_settings
from swarm_autoscaler.config.settings import load_settings
from swarm_autoscaler.config.variables import variables
from swarm_autoscaler.keeper.app import user_data_of
from swarm_autoscaler.keeper.credentials import listing_token, primary_token
from swarm_autoscaler.keeper.model import ClusterKey

TOKEN = "a-Keeper-token-0123456789"
AMI = "ami-0123456789abcdef0"
CID = "kc-0123456789abcdef"
IMAGE = "swarm-autoscaler:0.1.0"


def _render(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **extra: str) -> str:
    for name in [n for n in __import__("os").environ if n.startswith("AUTOSCALER_")]:
        monkeypatch.delenv(name)
    env = {
        "AUTOSCALER_KEEPER_TOKEN": TOKEN,
        "AUTOSCALER_KEEPER_NAME": "keeper",
        "AUTOSCALER_KEEPER_PUBLIC_URL": "https://10.0.0.5:8080",
        "AUTOSCALER_KEEPER_IMAGE": IMAGE,
        "AUTOSCALER_KEEPER_PRIMARY_AMI_ID": AMI,
        "AUTOSCALER_KEEPER_WORKER_TYPES": json.dumps({"m5.large": {"ami_id": AMI}}),
        "AUTOSCALER_EC2_REGION": "eu-west-1",
        **extra,
    }
    path = tmp_path / "keeper.env"
    path.write_text("".join(f"{k}='{v}'\n" for k, v in env.items()))
    config = load_keeper_settings(path)
    assert config.keeper.boot_template == DEFAULT_PRIMARY_BOOT
    return user_data_of(config)(ClusterKey("alice", "w1"), CID)


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    return _render(tmp_path, monkeypatch)


def test_it_is_bash_and_fetches_its_files_once_with_its_own_token(script: str) -> None:
    subprocess.run(["bash", "-n"], input=script.encode(), check=True)
    assert f"Bearer {primary_token(TOKEN, CID)}" in script
    assert f'"https://10.0.0.5:8080/v1/primaries/{CID}/credentials"' in script
    assert TOKEN not in script
    assert 'echo "AUTOSCALER_DASK_SCHEDULER_URL=tls://$ADDR:8786"' in script


def test_the_cluster_token_is_not_in_it_but_comes_with_the_fetch_as_a_secret(script: str) -> None:
    """User data is readable by any `ec2:DescribeInstanceAttribute` principal: the reusable cluster token
    (the listing and launch routes' bearer) is not in it; the autoscaler reads the swarm secret the boot
    script makes from the one-time fetch's answer (tests/keeper/test_scheduler_preload_file.py runs
    that step)."""
    assert listing_token(TOKEN, CID) not in script
    assert "AUTOSCALER_EC2_LISTING_TOKEN_FILE=/run/secrets/keeper-listing-token" in script
    created = script.index('docker secret create keeper-listing-token "$D/listing-token"')
    assert created < script.index("--secret keeper-listing-token") < script.index(f"{IMAGE} run")
    assert 'rm -f "$D"/tls/*-key.pem "$D/listing-token"' in script


def test_only_the_pinned_image_runs(script: str) -> None:
    assert ":latest" not in script
    images = re.findall(r"--entrypoint \S+ (\S+)|docker service create .*? (\S+) run$", script, re.MULTILINE)
    used = {name for pair in images for name in pair if name}
    assert used == {IMAGE}
    # the files' split, scheduler, autoscaler, worker, and the header's three
    assert script.count(IMAGE) == 7


def test_the_worker_and_scheduler_images_are_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A team's worker image (no swarm_autoscaler in it: the shell entrypoint) and scheduler image."""
    worker, scheduler = "registry.example.com/team/dask-worker:1.4.0", "registry.example.com/team/sched:1.4.0"
    script = _render(
        tmp_path,
        monkeypatch,
        AUTOSCALER_KEEPER_WORKER_IMAGE=worker,
        AUTOSCALER_KEEPER_SCHEDULER_IMAGE=scheduler,
    )
    assert f"--entrypoint /usr/local/bin/swarm-autoscaler-worker {worker} $TLS_WORKER" in script
    assert f"--entrypoint dask {scheduler} scheduler --protocol tls" in script
    assert f'--env-file "$D/cluster.env" {IMAGE} run' in script  # the autoscaler keeps the image


def test_every_setting_it_writes_exists_and_the_cluster_s_autoscaler_settings_load(
    script: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    known = {name for name, *_ in variables()}
    written = dict(re.findall(r"^(AUTOSCALER_[A-Z0-9_]+)=(.*)$", script, re.MULTILINE))
    # and the lines echoed with the machine's private address ($ADDR, here 10.0.0.9)
    echoed = dict(re.findall(r'^echo "(AUTOSCALER_[A-Z0-9_]+)=(.*)" >> ', script, re.MULTILINE))
    assert set(echoed) == {"AUTOSCALER_DASK_SCHEDULER_URL", "AUTOSCALER_HTTP_HOST"}
    written.update({k: v.replace("$ADDR", "10.0.0.9") for k, v in echoed.items()})
    assert set(written) - known == set()
    env = tmp_path / "cluster.env"
    env.write_text("".join(f"{k}='{v}'\n" for k, v in written.items()))
    settings = load_settings(env)
    assert settings.cluster_name == CID
    assert settings.dask.scheduler_url == "tls://10.0.0.9:8786"
    # its workers join with tickets: the join desk at this swarm's only manager (the primary's private
    # address, as swarm advertises it) on the join port, served on AUTOSCALER_HTTP_HOST (the same address)
    assert settings.ec2.join_url == ["auto"] and settings.http.host == "10.0.0.9"
    assert settings.dask.tls_files == (
        "/run/secrets/dask-ca",
        "/run/secrets/dask-worker",
        "/run/secrets/dask-worker-key",
    )


def test_the_dask_options_and_the_worker_entrypoint_it_uses_exist(script: str) -> None:
    dask = shutil.which("dask", path=str(Path(__import__("sys").executable).parent))
    assert dask is not None
    for role, options in (
        (
            "scheduler",
            [
                "--protocol",
                "--host",
                "--port",
                "--dashboard-address",
                "--tls-ca-file",
                "--tls-cert",
                "--tls-key",
            ],
        ),
        ("worker", ["--tls-ca-file", "--tls-cert", "--tls-key"]),
    ):
        helped = subprocess.run([dask, role, "--help"], capture_output=True, text=True, check=True).stdout
        assert all(option in helped for option in options), role
    # the shell entrypoint any worker image carries (docker/worker-entrypoint.sh), ours included
    assert "--entrypoint /usr/local/bin/swarm-autoscaler-worker " in script
    assert (
        "COPY docker/worker-entrypoint.sh /usr/local/bin/swarm-autoscaler-worker"
        in (Path(__file__).resolve().parents[2] / "docker" / "Dockerfile").read_text()
    )
    assert "node.labels.swarm-autoscaler.cluster==" + CID in script
