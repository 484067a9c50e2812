"""A team's scheduler image needs nothing of swarm-autoscaler: the keeper's default primary boot script
copies the packing preload out of the keeper's image as a file, mounts it into the scheduler and passes
its path to `--preload`. Run here, as the primary runs it:

1. the python code of the script's first `docker run` (in the keeper's image) runs with this checkout's
   package, its `/d` mount being a temporary directory: it must leave `dask_packing.py` there;
2. a real `dask scheduler` starts with the script's scheduler arguments, `--preload` the copied file, in
   a Python where `swarm_autoscaler` cannot be imported (what a team image with only `distributed` is),
   and must install the preload (its log line and its plugin, read by a client over mutual TLS with
   the cluster's certificates, as the script's TLS options give them).

Stands in for: the docker run and the scheduler container on a primary (tests/e2e/test_keeper_boot.py
runs the whole script on dockerd nodes with the autoscaler's image)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from swarm_autoscaler.config.keeper import DEFAULT_PRIMARY_BOOT, PLACEHOLDERS, render_boot
from swarm_autoscaler.keeper.adapters.tls import make_credentials

# A Python without swarm_autoscaler (the venv has it installed: importing it must fail, as in a team image)
BLOCK = "import sys; sys.modules['swarm_autoscaler'] = None; "


def _script() -> str:
    values = {name: f"<{name}>" for name in PLACEHOLDERS}
    values |= {"image": "keeper/image:1.0", "scheduler_image": "team/scheduler:1.0", "scheduler_port": "0"}
    values["dashboard_port"] = "0"
    return render_boot(DEFAULT_PRIMARY_BOOT, values)


def _copy_code(script: str) -> str:
    """The python code of the `docker run ... --entrypoint python3 <image> -c '...'` of step 1."""
    (code,) = re.findall(r"--entrypoint python3 keeper/image:1\.0 -c \\\n  '(.*?)'\n", script, re.DOTALL)
    return code


def _scheduler_args(script: str, tls: Path) -> list[str]:
    """The arguments the scheduler service gives `dask scheduler`, shell-split, with its variables
    expanded for this machine: the address 127.0.0.1, the swarm secrets the files in `tls`."""
    (line,) = re.findall(r"--entrypoint dask team/scheduler:1\.0 scheduler (.*?)\n(?!  )", script, re.DOTALL)
    (preload,) = re.findall(r"^P=(\S+)$", script, re.MULTILINE)
    (options,) = re.findall(r'^TLS_SCHEDULER="(.*)"$', script, re.MULTILINE)
    line = line.replace("\\\n", " ").replace("$TLS_SCHEDULER", options).replace("$P", preload)
    line = re.sub(r"\$S/dask-([a-z-]+)", lambda m: str(tls / f"{m.group(1)}.pem"), line)
    return shlex.split(line.replace("$ADDR", "127.0.0.1"))


def test_the_copied_preload_runs_on_a_scheduler_without_swarm_autoscaler(tmp_path: Path) -> None:
    script = _script()
    d = tmp_path / "d"
    (d / "tls").mkdir(parents=True)
    made = make_credentials("kc-0123456789abcdef")
    # the keeper's answer to the one-time fetch: the TLS files and the cluster's listing token
    answer = {"files": made.for_primary(), "listing_token": "the-cluster-token"}
    (d / "credentials.json").write_text(json.dumps(answer))
    code = _copy_code(script).replace('"/d', f'"{d}')
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    copied = d / "dask_packing.py"
    assert copied.is_file() and (d / "tls" / "scheduler.pem").read_text() == made.scheduler_cert
    token = d / "listing-token"  # becomes the autoscaler's keeper-listing-token secret, owner-only meanwhile
    assert token.read_text() == "the-cluster-token" and token.stat().st_mode & 0o777 == 0o600

    args = _scheduler_args(script, d / "tls")
    assert '--mount "type=bind,src=$D/dask_packing.py,dst=$P,readonly"' in script
    assert args[args.index("--preload") + 1] == "/opt/swarm-autoscaler/dask_packing.py"
    args[args.index("--preload") + 1] = str(copied)  # the mount's target, here
    runner = BLOCK + "from distributed.cli.dask_scheduler import main; sys.argv[0] = 'dask-scheduler'; main()"
    scheduler = subprocess.Popen(
        [sys.executable, "-c", runner, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    lines: list[str] = []
    try:
        lines = _until_address(scheduler)
        address = next(m.group(1) for line in lines if (m := re.search(r"Scheduler at:\s+(\S+)", line)))
        assert address.startswith("tls://127.0.0.1:")
        client_files = tmp_path / "client"
        client_files.mkdir()
        for name, text in made.for_client().items():
            (client_files / name).write_text(text)
        probe = (
            BLOCK + "from distributed import Client, Security; p = sys.argv[2]; "
            "s = Security(tls_ca_file=p + '/ca.pem', tls_client_cert=p + '/client.pem', "
            "tls_client_key=p + '/client-key.pem', require_encryption=True); "
            "c = Client(sys.argv[1], security=s, timeout=30); "
            "print(sorted(c.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.plugins))))"
        )
        out = subprocess.run(
            [sys.executable, "-c", probe, address, str(client_files)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert "dask-packing-queued" in out.stdout  # the preload's plugin, on a scheduler without us
    finally:
        scheduler.terminate()
        scheduler.wait(timeout=30)
        assert scheduler.stderr is not None
        rest = scheduler.stderr.read()
        scheduler.stderr.close()
    assert (
        "dask_packing: restricted tasks go to" in "\n".join(lines) + rest
    )  # dask_setup ran: the objective is replaced


def _until_address(process: subprocess.Popen[str], timeout: float = 60.0) -> list[str]:
    """The scheduler's log lines until it prints its address (or exits: then the test fails with them)."""
    assert process.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line and process.poll() is not None:
            break
        lines.append(line.rstrip())
        if "Scheduler at:" in line:
            return lines
    raise AssertionError(f"the scheduler did not start: {lines}")
