"""The manual notebook (tests/manual/autoscaling.ipynb) cannot rot: nbclient runs every cell against the local
cloud (its dask scheduler, moto and the real dockerd swarm manager, through `swarm-autoscaler status`), with
a few one-second jobs instead of forty one-minute ones."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from swarm_autoscaler_lab.localcloud.cloud import LocalCloud, env_without_autoscaler

pytestmark = [pytest.mark.e2e, pytest.mark.swarm, pytest.mark.timeout(180)]

NOTEBOOK = Path(__file__).resolve().parents[1] / "manual" / "autoscaling.ipynb"
JOBS = 3


def _text(cell: nbformat.NotebookNode) -> str:
    """What a cell printed, without rich's styling escapes."""
    text = "".join(
        out.get("text", "") for out in cell.get("outputs", []) if out.get("output_type") == "stream"
    )
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


async def test_the_manual_notebook_runs_every_cell_against_the_local_cloud(
    cloud: LocalCloud, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")  # jupyter_core warns (an error here) without it
    env = env_without_autoscaler() | cloud.env()
    env |= {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",  # swarm-autoscaler
        "MANUAL_N_JOBS": str(JOBS),
        "MANUAL_JOB_SECONDS": "1",
        "MANUAL_SETTLE_SECONDS": "1",
        "JUPYTER_PLATFORM_DIRS": "1",
        "NO_COLOR": "1",
    }
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        nb, timeout=90, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    await client.async_execute(env=env)  # raises CellExecutionError naming the cell that failed

    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code), "a cell did not run"
    submitted, first_status, progress = code[1], code[2], code[3]
    assert any(str(JOBS) in str(o.get("data", {})) for o in submitted.outputs), submitted.outputs
    # `swarm-autoscaler status` saw the real swarm and the jobs waiting for machines (no fleet here)
    assert "nodes (1)" in _text(first_status) and "ip-10-0-255-1" in _text(first_status), _text(first_status)
    assert "unrunnable tasks: 3" in _text(first_status), _text(first_status)
    assert "'pending': 3" in _text(progress), _text(progress)
    assert "unrunnable tasks: 0" in _text(code[-1]), _text(code[-1])  # the futures were cancelled
