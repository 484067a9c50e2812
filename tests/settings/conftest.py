"""Fixtures for the settings tests: a clean environment and a minimal valid one."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator

import pytest

REQUIRED = {
    "AUTOSCALER_CLUSTER_NAME": "analytics",
    "AUTOSCALER_DASK_SCHEDULER_URL": "tcp://scheduler:8786",
    "AUTOSCALER_EC2_ALLOWED_TYPES": json.dumps({"m5.large": {"ami_id": "ami-0123456789abcdef0"}}),
}

SetEnv = Callable[..., None]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No AUTOSCALER_* variable from the machine leaks into a test."""
    for name in list(os.environ):
        if name.upper().startswith("AUTOSCALER_"):
            monkeypatch.delenv(name)
    yield


@pytest.fixture
def set_env(monkeypatch: pytest.MonkeyPatch) -> SetEnv:
    """Set the required variables, overridden or extended by keyword (`None` unsets a variable)."""

    def apply(**values: str | None) -> None:
        for name, value in {**REQUIRED, **values}.items():
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)

    return apply
