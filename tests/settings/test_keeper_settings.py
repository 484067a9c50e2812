"""The keeper's settings (`AUTOSCALER_KEEPER_*` and the groups it shares with the daemon): defaults, one
line per wrong variable without echoing the token, the per-cluster autoscaler's settings derived from
the keeper's, and the boot template's rendering."""

from __future__ import annotations

import json
import re

import pytest

from swarm_autoscaler.config.keeper import (
    DEFAULT_PRIMARY_BOOT,
    EXAMPLE_TOKEN,
    cluster_env,
    load_keeper_settings,
    render_boot,
)
from swarm_autoscaler.config.settings import InvalidSettingsError, Settings, load_settings
from swarm_autoscaler.keeper.adapters.tags import worker_tags
from swarm_autoscaler.keeper.app import user_data_of
from swarm_autoscaler.keeper.credentials import deployment_id
from swarm_autoscaler.keeper.model import ClusterKey

TOKEN = "a-Keeper-token-0123456789"
AMI = "ami-0123456789abcdef0"
KEEPER = {
    "AUTOSCALER_KEEPER_TOKEN": TOKEN,
    "AUTOSCALER_KEEPER_NAME": "analytics-keeper",
    "AUTOSCALER_KEEPER_PUBLIC_URL": "https://10.0.0.5:8080",
    "AUTOSCALER_KEEPER_PRIMARY_AMI_ID": AMI,
    "AUTOSCALER_KEEPER_WORKER_TYPES": json.dumps(
        {"m5.large": {"ami_id": AMI, "reserve": 1}, "c5.large": {"ami_id": AMI}}
    ),
}


@pytest.fixture
def keeper_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name, value in KEEPER.items():
        monkeypatch.setenv(name, value)
    return monkeypatch


def problems() -> list[str]:
    with pytest.raises(InvalidSettingsError) as caught:
        load_keeper_settings()
    return list(caught.value.problems)


def test_defaults(keeper_env: pytest.MonkeyPatch) -> None:
    config = load_keeper_settings()
    keeper = config.keeper

    assert keeper.token.get_secret_value() == TOKEN and TOKEN not in repr(config)
    assert (keeper.idle_timeout, keeper.max_start_time, keeper.check_interval, keeper.lock_ttl) == (
        300,
        600,
        5,
        15,
    )
    assert (keeper.name, keeper.primary_type, keeper.max_instances_per_cluster) == (
        "analytics-keeper",
        "m5.large",
        10,
    )
    assert keeper.boot_template == DEFAULT_PRIMARY_BOOT
    assert keeper.bind_primary_tokens  # the one-time token works from the primary's IP only
    assert list(keeper.worker_types) == ["m5.large", "c5.large"]
    assert config.redis.url is None and config.ec2.region == "us-east-1"


def test_the_daemon_neither_needs_nor_reads_the_keepers_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOSCALER_CLUSTER_NAME", "analytics")
    monkeypatch.setenv("AUTOSCALER_DASK_SCHEDULER_URL", "tcp://scheduler:8786")
    monkeypatch.setenv("AUTOSCALER_EC2_ALLOWED_TYPES", json.dumps({"m5.large": {"ami_id": AMI}}))
    monkeypatch.setenv("AUTOSCALER_KEEPER_TOKEN", "short")  # wrong, but not the daemon's business

    assert isinstance(load_settings(), Settings)


def test_every_problem_at_once_one_line_per_variable_never_echoing_the_token(
    keeper_env: pytest.MonkeyPatch,
) -> None:
    keeper_env.setenv("AUTOSCALER_KEEPER_TOKEN", "tiny-secret")
    # not a type name (a well-formed one, m5.gigantic say, is EC2's to refuse at start)
    keeper_env.setenv("AUTOSCALER_KEEPER_PRIMARY_TYPE", "m5 gigantic")
    keeper_env.setenv("AUTOSCALER_KEEPER_PRIMARY_AMI_ID", "ami-nope")
    keeper_env.setenv("AUTOSCALER_KEEPER_PRIMARY_BOOT_TEMPLATE", "echo {{cluster_id}} {{colour}}")
    keeper_env.setenv("AUTOSCALER_KEEPER_MAX_INSTANCES_PER_CLUSTER", "0")
    keeper_env.setenv("AUTOSCALER_KEEPER_IDLE_TIMEOUT", "soon")
    keeper_env.setenv("AUTOSCALER_EC2_ENDPOINT", "ftp://x")

    lines = problems()

    assert [line.split(":", 1)[0] for line in lines] == [
        "AUTOSCALER_KEEPER_TOKEN",
        "AUTOSCALER_KEEPER_PRIMARY_TYPE",
        "AUTOSCALER_KEEPER_PRIMARY_AMI_ID",
        "AUTOSCALER_KEEPER_PRIMARY_BOOT_TEMPLATE",
        "AUTOSCALER_KEEPER_IDLE_TIMEOUT",
        "AUTOSCALER_KEEPER_MAX_INSTANCES_PER_CLUSTER",
        "AUTOSCALER_EC2_ENDPOINT",
    ]
    assert lines[0] == "AUTOSCALER_KEEPER_TOKEN: expected at least 16 characters"
    assert "tiny-secret" not in " ".join(lines)
    assert "unknown placeholder(s) colour; known: cluster_id" in lines[3]


def test_the_templates_example_token_is_refused(keeper_env: pytest.MonkeyPatch) -> None:
    keeper_env.setenv("AUTOSCALER_KEEPER_TOKEN", EXAMPLE_TOKEN)
    assert problems() == ["AUTOSCALER_KEEPER_TOKEN: replace the template's example token with a random one"]


def test_required_variables_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    assert sorted(problems()) == [
        "AUTOSCALER_KEEPER_NAME: required but not set",  # no shared default: two keepers would share it
        "AUTOSCALER_KEEPER_PRIMARY_AMI_ID: required but not set",
        "AUTOSCALER_KEEPER_TOKEN: required but not set",
        "AUTOSCALER_KEEPER_WORKER_TYPES: required but not set",
    ]


def test_cross_rules(keeper_env: pytest.MonkeyPatch) -> None:
    keeper_env.setenv("AUTOSCALER_KEEPER_CHECK_INTERVAL", "10s")
    keeper_env.setenv("AUTOSCALER_KEEPER_LOCK_TTL", "15s")
    assert problems() == [
        "AUTOSCALER_KEEPER_LOCK_TTL: must be at least twice AUTOSCALER_KEEPER_CHECK_INTERVAL (20s) so a "
        "replica keeps its clusters between two checks, got 15s"
    ]
    keeper_env.delenv("AUTOSCALER_KEEPER_CHECK_INTERVAL")
    keeper_env.setenv(
        "AUTOSCALER_KEEPER_WORKER_TYPES", json.dumps({"m5.large": {"ami_id": AMI, "reserve": 3}})
    )
    keeper_env.setenv("AUTOSCALER_KEEPER_MAX_INSTANCES_PER_CLUSTER", "2")
    (line,) = problems()
    assert line.startswith(
        "AUTOSCALER_KEEPER_MAX_INSTANCES_PER_CLUSTER: must be at least the sum of the reserves in "
        "AUTOSCALER_KEEPER_WORKER_TYPES (3)"
    )


def test_each_clusters_autoscaler_settings_derive_from_the_keepers(keeper_env: pytest.MonkeyPatch) -> None:
    keeper_env.setenv("AUTOSCALER_KEEPER_MAX_INSTANCES_PER_CLUSTER", "7")
    keeper_env.setenv("AUTOSCALER_EC2_ENDPOINT", "http://ec2.local:5000")
    keeper_env.setenv("AUTOSCALER_EC2_SUBNET_IDS", "subnet-1,subnet-2")
    keeper_env.setenv("AUTOSCALER_EC2_ACCESS_KEY_ID", "AKIAKEEPER")
    keeper_env.setenv("AUTOSCALER_EC2_SECRET_ACCESS_KEY", "keeper/Secret+never-in-user-data")
    keeper_env.setenv("AUTOSCALER_EC2_CUSTOM_TAGS", '{"team": "science"}')
    config = load_keeper_settings()

    env = cluster_env(config, "kc-0123456789abcdef", {"swarm-autoscaler-keeper": "keeper"})

    assert env["AUTOSCALER_CLUSTER_NAME"] == "kc-0123456789abcdef"
    assert env["AUTOSCALER_EC2_MAX_INSTANCES"] == "7"
    assert list(json.loads(env["AUTOSCALER_EC2_ALLOWED_TYPES"])) == ["m5.large", "c5.large"]
    assert json.loads(env["AUTOSCALER_EC2_ALLOWED_TYPES"])["m5.large"]["reserve"] == 1
    assert env["AUTOSCALER_EC2_ENDPOINT"] == "http://ec2.local:5000"
    assert env["AUTOSCALER_EC2_SUBNET_IDS"] == "subnet-1,subnet-2"
    assert json.loads(env["AUTOSCALER_EC2_CUSTOM_TAGS"]) == {
        "team": "science",
        "swarm-autoscaler-keeper": "keeper",
    }
    script = user_data_of(config)(ClusterKey("alice", "none"), "kc-0123456789abcdef")
    assert "AKIAKEEPER" not in script and "never-in-user-data" not in script  # credentials stay out
    assert not re.search(
        r"\{\{\s*[A-Za-z_]", script
    )  # every keeper placeholder filled (docker's {{.X}} stay)
    assert TOKEN not in script  # the API token stays out: only the cluster's one-time token is there
    (tags_line,) = [line for line in script.splitlines() if line.startswith("AUTOSCALER_EC2_CUSTOM_TAGS=")]
    assert json.loads(
        tags_line.partition("=")[2]
    ) == {  # the workers' tags: the keeper's, then whose they are
        "team": "science",
        "swarm-autoscaler-keeper": "analytics-keeper",
        "swarm-autoscaler-keeper-user": "alice",
        "swarm-autoscaler-keeper-wallet": "none",
        "swarm-autoscaler-keeper-deployment": deployment_id(TOKEN),  # this keeper deployment's, not its name
    }
    assert "AUTOSCALER_CLUSTER_NAME=kc-0123456789abcdef\n" in script
    assert "Primary of on-demand cluster kc-0123456789abcdef (user alice, wallet none)" in script


def test_rendering_replaces_placeholders_and_leaves_shell_variables_alone() -> None:
    template = 'echo "$HOME" {{ cluster_id }} {{user_id}}/{{wallet_id}} ${PORT:-{{scheduler_port}}}\n{{autoscaler_env}}'
    values = {
        "cluster_id": "kc-1",
        "user_id": "u",
        "wallet_id": "w",
        "scheduler_port": "8786",
        "dashboard_port": "8787",
        "autoscaler_env": "A=1\nB={}",
    }

    assert render_boot(template, values) == 'echo "$HOME" kc-1 u/w ${PORT:-8786}\nA=1\nB={}'


def test_the_derived_settings_are_valid_settings_for_the_clusters_autoscaler(
    keeper_env: pytest.MonkeyPatch,
) -> None:
    keeper_env.setenv("AUTOSCALER_EC2_SUBNET_IDS", "subnet-1,subnet-2")
    keeper_env.setenv("AUTOSCALER_EC2_IAM_INSTANCE_PROFILE", "worker-profile")
    config = load_keeper_settings()
    env = cluster_env(config, "kc-0123456789abcdef", worker_tags("keeper", ClusterKey("alice", "none")))
    for name in [*KEEPER, "AUTOSCALER_EC2_SUBNET_IDS", "AUTOSCALER_EC2_IAM_INSTANCE_PROFILE"]:
        keeper_env.delenv(name)
    for name, value in env.items():  # what the primary's env file gives its autoscaler
        keeper_env.setenv(name, value)
    keeper_env.setenv("AUTOSCALER_DASK_SCHEDULER_URL", "tcp://dask-scheduler:8786")  # the template adds it

    settings = load_settings()

    assert settings.cluster_name == "kc-0123456789abcdef"
    assert settings.ec2.allowed_types == config.keeper.worker_types
    assert settings.ec2.max_instances == config.keeper.max_instances_per_cluster
    assert settings.ec2.subnet_ids == ["subnet-1", "subnet-2"]
    # Workers hold no role (docs/security.md): the keeper's profile setting is for its primaries only.
    assert settings.ec2.iam_instance_profile is None
    assert settings.ec2.metadata_hop_limit == 1
    assert settings.ec2.custom_tags["swarm-autoscaler-keeper-user"] == "alice"
    assert settings.ec2.access_key_id is None  # the primary's instance profile, never the keeper's keys


def test_limits_and_budgets(keeper_env: pytest.MonkeyPatch) -> None:
    keeper = load_keeper_settings().keeper
    assert (keeper.max_clusters_per_user, keeper.wallet_budget_usd, keeper.wallet_budgets) == (10, None, {})
    keeper_env.setenv("AUTOSCALER_KEEPER_WALLET_BUDGETS", '{"w-trial": 5}')
    (line,) = problems()
    assert line.startswith(
        "AUTOSCALER_KEEPER_WALLET_BUDGET_USD: budgets are checked against the usage ledger"
    )
    keeper_env.setenv("AUTOSCALER_REDIS_URL", "redis://127.0.0.1:6379/0")
    keeper_env.setenv("AUTOSCALER_KEEPER_WALLET_BUDGET_USD", "50")
    keeper = load_keeper_settings().keeper
    assert (keeper.wallet_budget_usd, keeper.wallet_budgets) == (50.0, {"w-trial": 5.0})
    keeper_env.setenv("AUTOSCALER_KEEPER_WALLET_BUDGETS", '{"bad id": 5, "w": -1}')
    keeper_env.setenv("AUTOSCALER_KEEPER_MAX_CLUSTERS_PER_USER", "0")
    wrong = problems()
    assert len(wrong) == 2 and wrong[0].startswith("AUTOSCALER_KEEPER_MAX_CLUSTERS_PER_USER")
    assert wrong[1].startswith("AUTOSCALER_KEEPER_WALLET_BUDGETS")
