"""Shared test configuration. Each area keeps its own fixtures in its own folder's conftest.py.

Hypothesis profiles: `HYPOTHESIS_PROFILE=mutation` (set by `make mutation`) draws the same examples on
every run and keeps no example database, so that a mutant is killed or survives for a reason, not by
the luck of one run's draws; and fewer of them (each property runs once per mutant, ~1,400 mutants).
"""

import logging
import os
from collections.abc import Iterator

import pytest
import structlog
from hypothesis import settings

settings.register_profile("mutation", derandomize=True, database=None, max_examples=30)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Puts the root logger and structlog back as they were: for tests that configure the daemon's logging."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()
