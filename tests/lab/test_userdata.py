"""User data decoded as cloud-init would (`localcloud.userdata`), and the worker env the daemon renders."""

from __future__ import annotations

import base64
import dataclasses
from pathlib import Path

import dask
import pytest

from swarm_autoscaler.adapters.ec2_support import (
    render_pool_user_data,
    render_start_user_data,
    render_user_data,
)
from swarm_autoscaler.config.types import AllowedType, Overhead
from swarm_autoscaler.config.worker import with_worker_env, worker_resources
from swarm_autoscaler.core.catalogue import CATALOGUE
from swarm_autoscaler.core.model import GIB
from swarm_autoscaler.daemon.app import described_boot_scripts
from swarm_autoscaler.runtime.worker import (
    PROFILER_VARIABLE,
    profiler_is_unsafe,
    read_env_file,
    worker_argv,
    worker_environ,
)
from swarm_autoscaler_lab.localcloud.userdata import user_data_scripts

AMI = "ami-12345678"


def test_a_shebang_script_in_base64_is_one_script() -> None:
    text = render_user_data("echo hi", "SWMTKN-1-x", "127.0.0.11:2377")
    assert user_data_scripts(base64.b64encode(text.encode()).decode()) == [text]
    assert user_data_scripts(text) == [text]


def test_mime_multipart_runs_its_shell_parts_only() -> None:
    for text in (render_pool_user_data("echo pool"), render_start_user_data("SWMTKN-1-x", "10.0.0.1:2377")):
        scripts = user_data_scripts(base64.b64encode(text.encode()))
        assert len(scripts) == 1 and scripts[0].startswith("#!/bin/bash")
        assert "cloud-config" not in scripts[0]
    assert "shutdown -h now" in user_data_scripts(render_pool_user_data(""))[0]


def test_text_without_a_header_is_not_run() -> None:
    assert user_data_scripts("echo no shebang") == []


def test_worker_env_is_the_types_resources_minus_its_overhead(tmp_path: Path) -> None:
    spec = AllowedType(ami_id=AMI, overhead=Overhead(cpus=0.5, ram_gib=1.0), boot_script="#!/bin/sh\necho x")
    res = worker_resources(CATALOGUE["m5.xlarge"], spec)
    assert res == {"CPU": 3.5, "RAM": float(15 * GIB), "instance-type:m5.xlarge": 1e9}
    script = with_worker_env({"m5.xlarge": spec}, CATALOGUE)["m5.xlarge"]
    assert script.startswith("#!/bin/sh\n") and script.endswith("echo x")
    # the heredoc's body is the env file the worker's entrypoint reads
    body = script.split("<<'SWARM_AUTOSCALER_EOF'\n", 1)[1].split("SWARM_AUTOSCALER_EOF", 1)[0]
    env_file = tmp_path / "worker.env"
    env_file.write_text(body)
    argv = worker_argv(
        read_env_file(env_file),
        {"DASK_SCHEDULER_ADDRESS": "tcp://10.0.0.1:8786", "DASK_WORKER_NAME": "ip-1"},
        [],
    )
    assert argv[:5] == ["dask", "worker", "tcp://10.0.0.1:8786", "--name", "ip-1"]
    resources = argv[argv.index("--resources") + 1]
    assert resources == f"CPU=3.5 RAM={15 * GIB} instance-type:m5.xlarge=1000000000"
    assert argv[argv.index("--nthreads") + 1] == "3"


def test_the_daemon_re_renders_worker_env_from_the_described_types() -> None:
    spec = AllowedType(ami_id=AMI, boot_script="#!/bin/sh\necho x")
    bundled = CATALOGUE["m5.xlarge"]
    described = dataclasses.replace(
        bundled, resources=dataclasses.replace(bundled.resources, ram=bundled.resources.ram - GIB)
    )
    scripts = described_boot_scripts({"m5.xlarge": spec, "m5.large": spec}, {"m5.xlarge": described})
    assert list(scripts) == ["m5.xlarge"]  # a type EC2 did not describe keeps its bundled rendering
    assert f"RAM={bundled.resources.ram - GIB} " in scripts["m5.xlarge"]
    assert f"RAM={bundled.resources.ram} " not in scripts["m5.xlarge"]


def test_the_worker_runs_without_dasks_profiler_where_it_can_deadlock() -> None:
    """On CPython 3.11 the profiler's `sys._current_frames()` can deadlock the worker (gh-106883): the
    entrypoint turns it off there, keeps it elsewhere, and leaves a value the service set alone."""
    assert worker_environ({}, (3, 11)) == {PROFILER_VARIABLE: "False"}
    assert worker_environ({}, (3, 12)) == {}
    assert worker_environ({PROFILER_VARIABLE: "True"}, (3, 11)) == {PROFILER_VARIABLE: "True"}
    # the emulated machines' in-process workers follow the same rule (the whole test process would stop)
    assert dask.config.get("distributed.worker.profile.enabled") is not profiler_is_unsafe()


def test_the_real_boot_needs_dockerd_nodes_and_says_so_before_starting_anything() -> None:
    from swarm_autoscaler.errors import ConfigurationError
    from swarm_autoscaler_lab.localcloud.cloud import LocalCloud, LocalCloudOptions

    with pytest.raises(ConfigurationError, match="real_boot needs real_swarm"):
        LocalCloud(LocalCloudOptions(real_boot=True))
