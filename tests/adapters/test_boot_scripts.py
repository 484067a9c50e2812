"""The rendered user data run by a shell as cloud-init would on an AMI, with `docker`, `sleep`,
`shutdown` and `hostname` replaced by recording stand-ins on PATH (so no dockerd, no waiting, and no
machine is stopped): the wait for dockerd and the join retries are bounded, a failed boot writes the
documented console line (`BOOT_FAILED_LINE`, which cloud-init copies to the EC2 console) and shuts the
machine down, and a boot script with its own `#!/bin/sh` (dash, as on Debian) works the same.
The real boot on dockerd nodes is in tests/e2e (`UserDataBoot`)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from swarm_autoscaler.adapters.boot_scripts import (
    BOOT_FAILED_LINE,
    JOIN_ATTEMPTS,
    USER_DATA_LIMIT,
    check_user_data,
    ecr_pull_lines,
    render_pool_user_data,
    render_start_user_data,
    render_user_data,
)
from swarm_autoscaler.errors import ConfigurationError
from swarm_autoscaler_lab.localcloud.userdata import user_data_scripts

TOKEN, MANAGER = "SWMTKN-1-abc", "10.0.0.2:2377"

# A fake docker: `docker info` fails until the file `up` counts down to 0; `docker swarm join` fails
# while `joins_failing` counts down, and records each attempt.
DOCKER = """#!/bin/sh
dir=$(dirname "$0")
echo "$*" >> "$dir/calls"
count() { n=$(cat "$dir/$1" 2>/dev/null || echo 0); if [ "$n" -gt 0 ]; then echo $((n - 1)) > "$dir/$1"; return 1; fi; }
case "$1 $2" in
  "info --format") [ -f "$dir/joined" ] && echo active || echo inactive ;;
  "info ") count up ;;
  "swarm join") count joins_failing || exit 1; touch "$dir/joined" ;;
  "swarm leave") rm -f "$dir/joined" ;;
esac
"""


def _run(
    tmp_path: Path, user_data: str, *, up_after: int = 0, joins_failing: int = 0
) -> tuple[int, str, str]:
    """Run the shell part of `user_data` as cloud-init would; (exit code, stderr, docker calls)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in {
        "docker": DOCKER,
        "sleep": '#!/bin/sh\necho "$1" >> "$(dirname "$0")/slept"\n',
        "shutdown": '#!/bin/sh\necho "$*" > "$(dirname "$0")/stopped"\n',
        "hostname": "#!/bin/sh\necho ip-10-0-1-23\n",
    }.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    (bin_dir / "up").write_text(str(up_after))
    (bin_dir / "joins_failing").write_text(str(joins_failing))
    [script] = user_data_scripts(user_data)
    path = tmp_path / "user-data"
    path.write_text(script)
    path.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run([str(path)], capture_output=True, text=True, env=env, timeout=60, check=False)
    calls = (bin_dir / "calls").read_text() if (bin_dir / "calls").exists() else ""
    return done.returncode, done.stderr, calls


@pytest.mark.parametrize("shebang", ["", "#!/bin/sh\n", "#!/bin/bash\n"])
def test_a_boot_waits_for_dockerd_and_retries_the_join(tmp_path: Path, shebang: str) -> None:
    user_data = render_user_data(f"{shebang}echo booting > {tmp_path}/booted", TOKEN, MANAGER)
    code, err, calls = _run(tmp_path, user_data, up_after=3, joins_failing=2)
    assert code == 0, err
    assert (tmp_path / "booted").read_text() == "booting\n"
    assert calls.count(f"swarm join --token {TOKEN} {MANAGER}") == 3
    assert BOOT_FAILED_LINE not in err
    assert not (tmp_path / "bin" / "stopped").exists()  # never asked to stop


def test_dockerd_that_never_answers_stops_the_machine_saying_why(tmp_path: Path) -> None:
    code, err, calls = _run(tmp_path, render_user_data("", TOKEN, MANAGER), up_after=10_000)
    assert code != 0 and "swarm join" not in calls
    assert f"{BOOT_FAILED_LINE} dockerd did not answer within 300 s (host ip-10-0-1-23)" in err
    assert (tmp_path / "bin" / "stopped").read_text() == "-h now\n"
    assert len((tmp_path / "bin" / "slept").read_text().split()) < 200  # bounded


def test_a_join_that_keeps_failing_stops_the_machine_after_the_bound(tmp_path: Path) -> None:
    code, err, calls = _run(tmp_path, render_user_data("", TOKEN, MANAGER), joins_failing=100)
    assert code != 0 and calls.count("swarm join") == JOIN_ATTEMPTS
    assert f"{BOOT_FAILED_LINE} docker swarm join failed {JOIN_ATTEMPTS} times" in err
    assert (tmp_path / "bin" / "stopped").read_text() == "-h now\n"


@pytest.mark.parametrize("shebang", ["", "#!/bin/sh\n"])
def test_a_failing_boot_script_stops_the_machine_before_joining(tmp_path: Path, shebang: str) -> None:
    script = f"{shebang}echo pulling\nexit 3" if shebang else "echo pulling\nfalse\necho never"
    code, err, calls = _run(tmp_path, render_user_data(script, TOKEN, MANAGER))
    assert code != 0 and "swarm join" not in calls
    assert f"{BOOT_FAILED_LINE} exit status {3 if shebang else 1}" in err
    assert (tmp_path / "bin" / "stopped").read_text() == "-h now\n"


def test_a_pool_start_retries_and_reports_without_stopping(tmp_path: Path) -> None:
    """A started pool machine that cannot join says so but keeps running (a stopped one is a pool member):
    the daemon terminates it as broken after max_start_time."""
    code, err, calls = _run(tmp_path, render_start_user_data(TOKEN, MANAGER), joins_failing=100)
    assert code != 0 and calls.count("swarm join") == JOIN_ATTEMPTS
    assert calls.index("swarm leave") < calls.index("swarm join")  # after dockerd answered
    assert BOOT_FAILED_LINE in err and not (tmp_path / "bin" / "stopped").exists()


def test_a_pool_first_boot_stops_only_when_it_succeeded(tmp_path: Path) -> None:
    code, err, _ = _run(tmp_path, render_pool_user_data("echo ok"))
    assert code == 0 and (tmp_path / "bin" / "stopped").read_text() == "-h now\n"
    failed = tmp_path / "failed"
    failed.mkdir()
    code, err, _ = _run(failed, render_pool_user_data("false"))
    assert code != 0 and BOOT_FAILED_LINE in err
    assert not (failed / "bin" / "stopped").exists()  # not stopped: a prepared look-alike


def test_user_data_over_ec2s_limit_is_refused_naming_the_type() -> None:
    check_user_data("m5.large", "#" * (USER_DATA_LIMIT - 2048))
    with pytest.raises(
        ConfigurationError, match=r"instance type g4dn\.xlarge is \d+ bytes, over EC2's limit"
    ):
        check_user_data("g4dn.xlarge", "#" * (USER_DATA_LIMIT - 1000))


def test_scripts_are_posix(tmp_path: Path) -> None:
    """dash (Debian's /bin/sh) parses every rendered script."""
    for text in (render_user_data("#!/bin/sh\ntrue", TOKEN, MANAGER), render_start_user_data(TOKEN, MANAGER)):
        for script in user_data_scripts(text):
            done = subprocess.run(["dash", "-n"], input=script, text=True, capture_output=True, check=False)
            assert done.returncode == 0, done.stderr
    assert os.path.exists("/bin/dash")


def test_ecr_images_are_pulled_after_a_login_with_the_instance_role(tmp_path: Path) -> None:
    """`ecr_pull_lines` in a boot script, run with `aws` and `docker` stand-ins: the AWS CLI stands in for
    ECR's GetAuthorizationToken through the instance role (a real AMI's CLI reads the role from IMDS)."""
    ecr = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/team/dask-worker:2026.8.0-1"
    other = "registry.example.com/team/tools:1"
    boot = "#!/bin/sh\n" + ecr_pull_lines([ecr, other, ecr])
    aws = tmp_path / "bin-extra"
    aws.mkdir()
    (aws / "aws").write_text('#!/bin/sh\necho "$*" >> "$(dirname "$0")/aws-calls"\necho ecr-password\n')
    (aws / "aws").chmod(0o755)
    user_data = render_user_data(boot, TOKEN, MANAGER).replace(
        "#!/bin/sh\n", f"#!/bin/sh\nPATH={aws}:$PATH\n", 1
    )
    code, err, calls = _run(tmp_path, user_data)
    assert code == 0, err
    assert (aws / "aws-calls").read_text() == "ecr get-login-password --region eu-west-1\n"
    lines = calls.splitlines()
    login = lines.index("login --username AWS --password-stdin 123456789012.dkr.ecr.eu-west-1.amazonaws.com")
    assert lines.index(f"pull --quiet {ecr}") > login and f"pull --quiet {other}" in lines
    assert calls.count(f"pull --quiet {ecr}") == 1
    assert ecr_pull_lines([]) == ""
