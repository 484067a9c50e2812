"""The keeper's cluster profiles (`AUTOSCALER_KEEPER_PROFILES`): the default profile is the keeper-wide
settings as before, a profile's fields fall back to them, and every wrong profile is a start-up error
naming the variable and what to do (an image that Docker Hub would resolve, :latest, a reserved or
malformed name, a worker reserve over the cluster maximum). The rendered boot script of a cluster of
each profile carries that profile's images and worker types."""

from __future__ import annotations

import json
import re

import pytest

from swarm_autoscaler.config.keeper import load_keeper_settings
from swarm_autoscaler.config.profiles import DEFAULT_PROFILE, launched_types, profiles_of
from swarm_autoscaler.config.settings import InvalidSettingsError
from swarm_autoscaler.keeper.app import user_data_of
from swarm_autoscaler.keeper.model import ClusterKey

AMI = "ami-0123456789abcdef0"
GPU_AMI = "ami-0fedcba9876543210"
KEEPER = {
    "AUTOSCALER_KEEPER_TOKEN": "a-Keeper-token-0123456789",
    "AUTOSCALER_KEEPER_NAME": "analytics-keeper",
    "AUTOSCALER_KEEPER_PUBLIC_URL": "https://10.0.0.5:8080",
    "AUTOSCALER_KEEPER_PRIMARY_AMI_ID": AMI,
    "AUTOSCALER_KEEPER_IMAGE": "registry.example.com/swarm-autoscaler:0.1.0",
    "AUTOSCALER_KEEPER_WORKER_IMAGE": "registry.example.com/base/dask-worker:1.0.0",
    "AUTOSCALER_KEEPER_WORKER_TYPES": json.dumps({"m5.large": {"ami_id": AMI}}),
}
GEO = {
    "worker_image": "123456789012.dkr.ecr.eu-west-1.amazonaws.com/geo/dask-worker:1.4.0",
    "scheduler_image": "registry.example.com/geo/dask-scheduler:1.4.0",
    "primary_type": "m5.xlarge",
    "worker_types": {"g4dn.xlarge": {"ami_id": GPU_AMI}},
}


@pytest.fixture
def keeper_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name, value in KEEPER.items():
        monkeypatch.setenv(name, value)
    return monkeypatch


def _problems() -> str:
    with pytest.raises(InvalidSettingsError) as caught:
        load_keeper_settings()
    (line,) = caught.value.problems  # one line, naming the variable
    assert line.startswith("AUTOSCALER_KEEPER_PROFILES"), line
    return line


def test_without_profiles_the_default_profile_is_the_keeper_wide_settings(
    keeper_env: pytest.MonkeyPatch,
) -> None:
    keeper = load_keeper_settings().keeper
    assert keeper.profiles == {}
    (default,) = profiles_of(keeper).values()
    assert default.name == DEFAULT_PROFILE
    assert default.worker_image == KEEPER["AUTOSCALER_KEEPER_WORKER_IMAGE"]
    assert default.scheduler_image == KEEPER["AUTOSCALER_KEEPER_IMAGE"]  # unset: the keeper's image
    assert (default.primary_type, list(default.worker_types)) == ("m5.large", ["m5.large"])


def test_a_profile_s_fields_fall_back_to_the_keeper_wide_settings(keeper_env: pytest.MonkeyPatch) -> None:
    only_scheduler = {"scheduler_image": "localhost/team/dask-scheduler:2026.8.0"}
    keeper_env.setenv("AUTOSCALER_KEEPER_PROFILES", json.dumps({"geo": GEO, "light": only_scheduler}))
    keeper = load_keeper_settings().keeper
    profiles = profiles_of(keeper)
    assert list(profiles) == [DEFAULT_PROFILE, "geo", "light"]
    geo, light = profiles["geo"], profiles["light"]
    assert (geo.worker_image, geo.scheduler_image, geo.primary_type) == (
        GEO["worker_image"],
        GEO["scheduler_image"],
        "m5.xlarge",
    )
    assert list(geo.worker_types) == ["g4dn.xlarge"]
    assert light.scheduler_image == only_scheduler["scheduler_image"]
    assert (light.worker_image, light.primary_type) == (KEEPER["AUTOSCALER_KEEPER_WORKER_IMAGE"], "m5.large")
    assert light.worker_types == keeper.worker_types
    assert geo.image == light.image == KEEPER["AUTOSCALER_KEEPER_IMAGE"]  # the autoscaler is always ours
    # what the keeper checks with EC2 and prices at start: every profile's types, each once
    assert launched_types(keeper) == ["m5.large", "m5.xlarge", "g4dn.xlarge"]


@pytest.mark.parametrize(
    ("profiles", "said"),
    [
        ({"default": {}}, "'default' is the keeper-wide settings"),
        ({"a b": {}}, "profile name 'a b' is not valid"),
        ({"geo": {"worker_image": "team/dask-worker:1.0"}}, "names no registry"),
        ({"geo": {"scheduler_image": "dask-scheduler:1.0"}}, "names no registry"),
        ({"geo": {"worker_image": "registry.example.com/w:latest"}}, "not :latest"),
        ({"geo": {"worker_image": "registry.example.com/w"}}, "pinned"),
        ({"geo": {"primary_type": "huge"}}, "instance type"),
        ({"geo": {"worker_types": {}}}, "at least one allowed instance type"),
        ({"geo": {"image": "registry.example.com/x:1.0"}}, "unknown key"),
        ({"geo": {"worker_types": {"m5.large": {"ami_id": AMI, "reserve": 11}}}}, "reserve 11 machines"),
        ("not json", "expected a JSON object"),
        (["geo"], "valid dictionary"),
    ],
)
def test_a_wrong_profile_is_a_start_up_error_saying_what_to_do(
    keeper_env: pytest.MonkeyPatch, profiles: object, said: str
) -> None:
    keeper_env.setenv(
        "AUTOSCALER_KEEPER_PROFILES", profiles if isinstance(profiles, str) else json.dumps(profiles)
    )
    assert said in _problems()


def test_qualified_images_pass_docker_hub_said_out_loud_included(keeper_env: pytest.MonkeyPatch) -> None:
    images = [
        "docker.io/team/dask-worker:1.0",
        "localhost/dask-worker:1.0",
        "registry.local:5000/dask-worker:1.0",
        "registry.example.com/team/dask-worker@sha256:" + "0" * 64,
    ]
    keeper_env.setenv(
        "AUTOSCALER_KEEPER_PROFILES",
        json.dumps({f"p{i}": {"worker_image": image} for i, image in enumerate(images)}),
    )
    profiles = profiles_of(load_keeper_settings().keeper)
    assert [profiles[f"p{i}"].worker_image for i in range(len(images))] == images


def test_each_profile_s_boot_script_carries_its_images_and_worker_types(
    keeper_env: pytest.MonkeyPatch,
) -> None:
    """The rendered script (what `Ec2Primaries` sends as user data; tests/adapters/ec2 checks it at the
    wire): the scheduler and the worker service run the profile's images, the cluster's autoscaler keeps
    the keeper's image and launches the profile's worker types."""
    keeper_env.setenv("AUTOSCALER_KEEPER_PROFILES", json.dumps({"geo": GEO}))
    render = user_data_of(load_keeper_settings())
    geo = render(ClusterKey("alice", "w1"), "kc-0123456789abcdef", "geo")
    plain = render(ClusterKey("bob", "w1"), "kc-00000000000000ff", DEFAULT_PROFILE)
    for script, worker, scheduler, types in (
        (geo, GEO["worker_image"], GEO["scheduler_image"], ["g4dn.xlarge"]),
        (plain, KEEPER["AUTOSCALER_KEEPER_WORKER_IMAGE"], KEEPER["AUTOSCALER_KEEPER_IMAGE"], ["m5.large"]),
    ):
        assert f"--entrypoint /usr/local/bin/swarm-autoscaler-worker {worker} $TLS_WORKER" in script
        assert re.search(rf"--entrypoint dask {re.escape(str(scheduler))} scheduler ", script)
        assert f'--env-file "$D/cluster.env" {KEEPER["AUTOSCALER_KEEPER_IMAGE"]} run' in script
        (allowed,) = re.findall(r"^AUTOSCALER_EC2_ALLOWED_TYPES=(.*)$", script, re.MULTILINE)
        assert list(json.loads(allowed)) == types
