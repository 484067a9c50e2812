"""The deployment files' shape: docker/stack.yml (the stack test in tests/e2e deploys it for real), the
keeper's and the scheduler's stack files."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from swarm_autoscaler.config.keeper import KeeperSettings
from swarm_autoscaler.config.settings import Ec2Settings

ROOT = Path(__file__).resolve().parents[1]
STACK = ROOT / "docker" / "stack.yml"


def test_stack_file_runs_on_a_manager_with_the_socket_and_env_file_and_publishes_no_host_port() -> None:
    stack: dict[str, Any] = yaml.safe_load(STACK.read_text())
    service = stack["services"]["autoscaler"]
    assert "node.role == manager" in service["deploy"]["placement"]["constraints"]
    mounts = {(m["source"], m["target"]) for m in service["volumes"]}
    assert ("${DOCKER_SOCKET:-/var/run/docker.sock}", "/var/run/docker.sock") in mounts
    assert service["env_file"] == ["${AUTOSCALER_ENV_FILE:-../.env}"]
    # no fixed user: the entrypoint joins the socket's group as it is on the manager the replica runs on
    assert "user" not in service
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["/usr/local/bin/swarm-autoscaler-entrypoint"]' in dockerfile
    assert "\nUSER " not in dockerfile
    assert "setpriv --reuid=10001" in (ROOT / "docker" / "autoscaler-entrypoint.sh").read_text()
    # replicas on one manager must not clash: no port published in host mode (nor at all)
    assert "ports" not in service
    assert service["deploy"]["update_config"]["order"] == "stop-first"


def test_join_stack_file_publishes_the_join_port_in_host_mode_one_replica_per_manager() -> None:
    """docker/stack.join.yml, given after docker/stack.yml as the README deploys it: the daemon's join
    port (TLS; its default, or AUTOSCALER_EC2_JOIN_PORT at deploy time), and only it (health and metrics
    are not published to the workers), on the managers themselves, not through
    swarm's routing mesh (which would replace the joining machine's source address), so at most one
    replica per manager; the base file alone stays as deployments from before run it."""
    join: dict[str, Any] = yaml.safe_load((ROOT / "docker" / "stack.join.yml").read_text())
    service = join["services"]["autoscaler"]
    (port,) = service["ports"]
    assert port == {
        "target": "${AUTOSCALER_EC2_JOIN_PORT:-8443}",
        "published": "${AUTOSCALER_EC2_JOIN_PORT:-8443}",
        "protocol": "tcp",
        "mode": "host",
    }
    assert Ec2Settings.model_fields["join_port"].default == 8443
    assert service["deploy"]["placement"] == {"max_replicas_per_node": 1}
    assert set(service) == {"ports", "deploy"}  # the rest comes from docker/stack.yml
    readme = (ROOT / "README.md").read_text()
    assert "-c docker/stack.yml -c docker/stack.join.yml autoscaler" in readme


def test_local_stack_file_gives_each_replica_its_own_loopback_address() -> None:
    local: dict[str, Any] = yaml.safe_load((ROOT / "docker" / "stack.local.yml").read_text())
    service = local["services"]["autoscaler"]
    assert service["environment"]["AUTOSCALER_HTTP_HOST"] == "127.0.1.{{.Task.Slot}}"
    assert local["networks"][service["networks"][0]] == {"external": True, "name": "host"}


def test_keeper_stack_file_runs_the_keeper_without_the_docker_socket_and_publishes_its_api() -> None:
    stack: dict[str, Any] = yaml.safe_load((ROOT / "docker" / "keeper-stack.yml").read_text())
    service = stack["services"]["keeper"]
    assert service["command"] == ["keeper"]
    assert "volumes" not in service  # it talks to EC2, redis and the schedulers only
    assert service["env_file"] == ["${KEEPER_ENV_FILE:-../keeper.env}"]
    (port,) = service["ports"]
    assert port["target"] == 8080  # AUTOSCALER_KEEPER_HTTP_PORT's default
    assert service["healthcheck"]["test"] == ["CMD", "swarm-autoscaler", "healthcheck", "--keeper"]


def test_keeper_stack_file_publishes_in_host_mode_so_the_primaries_tokens_can_be_bound() -> None:
    """AUTOSCALER_KEEPER_BIND_PRIMARY_TOKENS is on by default: the keeper must see each primary's own
    address, which swarm's routing mesh (ingress) replaces. Host mode allows one replica per node, and a
    roll must stop a node's replica before starting its successor there (the port)."""
    stack: dict[str, Any] = yaml.safe_load((ROOT / "docker" / "keeper-stack.yml").read_text())
    service = stack["services"]["keeper"]
    (port,) = service["ports"]
    assert port["mode"] == "host"
    assert service["deploy"]["placement"]["max_replicas_per_node"] == 1
    assert service["deploy"]["update_config"]["order"] == "stop-first"
    assert KeeperSettings.model_fields["bind_primary_tokens"].default is True


def test_local_keeper_stack_file_uses_the_host_network_and_overrides_the_ingress_port() -> None:
    base: dict[str, Any] = yaml.safe_load((ROOT / "docker" / "keeper-stack.yml").read_text())
    local: dict[str, Any] = yaml.safe_load((ROOT / "docker" / "keeper-stack.local.yml").read_text())
    service = local["services"]["keeper"]
    assert local["networks"][service["networks"][0]] == {"external": True, "name": "host"}
    # the same published port as the base file's (docker merges the lists by it), in host mode
    ((port,), (base_port,)) = service["ports"], base["services"]["keeper"]["ports"]
    assert port["published"] == base_port["published"] and port["mode"] == "host"
    assert service["environment"]["AUTOSCALER_HTTP_HOST"] == "127.0.2.{{.Task.Slot}}"


def test_scheduler_stack_file_runs_the_scheduler_with_the_packing_preload_from_the_pinned_image() -> None:
    stack: dict[str, Any] = yaml.safe_load((ROOT / "docker" / "scheduler-stack.yml").read_text())
    service = stack["services"]["scheduler"]
    assert service["image"].startswith("${SCHEDULER_IMAGE:?")  # no default, so never :latest
    assert service["entrypoint"] == ["dask", "scheduler"]
    command = service["command"]
    assert command[command.index("--preload") + 1] == "swarm_autoscaler.adapters.dask_packing"
    # the preload is a module of this package, so the image that ships the package runs it
    assert (ROOT / "src" / "swarm_autoscaler" / "adapters" / "dask_packing.py").is_file()
    assert service["deploy"]["replicas"] == 1
    # never a manager (their instance profile carries the daemon's policy, reachable from the scheduler's
    # network through the metadata service): only the worker node the operator labelled for it
    constraints = service["deploy"]["placement"]["constraints"]
    assert "node.role == worker" in constraints and "node.labels.dask-scheduler == true" in constraints
    assert not [c for c in constraints if "manager" in c]
    assert stack["networks"][service["networks"][0]] == {"external": True, "name": "host"}


def test_every_image_in_the_deployment_files_and_docs_is_pinned_never_latest() -> None:
    """Each stack file's image comes from a variable with no default (so a deploy without a pinned image
    fails with docker's own message), and no deployment file or page names a `:latest` image."""
    for name in ("stack.yml", "keeper-stack.yml", "scheduler-stack.yml", "worker-stack.yml"):
        stack: dict[str, Any] = yaml.safe_load((ROOT / "docker" / name).read_text())
        for service in stack["services"].values():
            assert service["image"].startswith("${") and ":?" in service["image"], (name, service["image"])
            # docker's interpolation reads a '-' in the message as `${VAR-default}`: the image would be
            # whatever follows it (a CI run deployed "autoscaler:0.1.0" from "e.g. swarm-autoscaler:0.1.0")
            assert "-" not in service["image"], (name, service["image"])
    found = []
    pages = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "docker").iterdir()]
    for path in pages:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"[\w./-]:latest\b", line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "an image tagged :latest:\n" + "\n".join(found)
