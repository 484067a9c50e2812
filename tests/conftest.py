"""Shared test configuration. Each area keeps its own fixtures in its own folder's conftest.py.

Hypothesis profiles: `HYPOTHESIS_PROFILE=mutation` (set by `make mutation`) draws the same examples on
every run and keeps no example database, so that a mutant is killed or survives for a reason, not by
the luck of one run's draws; and fewer of them (each property runs once per mutant, ~1,400 mutants).
"""

import logging
import os
from collections.abc import Iterator

import dask
import pytest
import structlog
from hypothesis import settings

from swarm_autoscaler.runtime.worker import profiler_is_unsafe

# Workers made in this process run without dask's profiler on Python 3.11, as the worker service's do:
# there it can deadlock the whole process (swarm_autoscaler.runtime.worker), the test suite included.
dask.config.set({"distributed.worker.profile.enabled": not profiler_is_unsafe()})

settings.register_profile("mutation", derandomize=True, database=None, max_examples=30)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Puts the root logger and structlog back as they were: for tests that configure the daemon's logging."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    # configure_logging adopts the vendors' loggers (their own handlers go, they propagate): put them back too.
    vendors = {
        name: (list(lg.handlers), lg.propagate)
        for name, lg in logging.root.manager.loggerDict.items()
        if isinstance(lg, logging.Logger) and name.split(".")[0] in ("distributed", "bokeh", "tornado")
    }
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, (vendor_handlers, propagate) in vendors.items():
        logging.getLogger(name).handlers[:] = vendor_handlers
        logging.getLogger(name).propagate = propagate
    structlog.reset_defaults()


@pytest.fixture(autouse=True)
def _logger_levels() -> Iterator[None]:
    """Every test leaves the named loggers' levels as it found them: the demo and the benches quiet
    dask's loggers, and a later test that expects a vendor's warning would not see it."""
    loggers = [lg for lg in logging.root.manager.loggerDict.values() if isinstance(lg, logging.Logger)]
    before = {lg.name: (lg.level, lg.disabled) for lg in loggers}
    yield
    for name, (level, disabled) in before.items():
        lg = logging.getLogger(name)
        lg.setLevel(level)
        lg.disabled = disabled
    for lg in list(logging.root.manager.loggerDict.values()):
        if isinstance(lg, logging.Logger) and lg.name not in before:
            lg.setLevel(logging.NOTSET)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """`make test` sets SWARM_AUTOSCALER_NO_SKIP=1: there a skipped test (no root for the swarm, no
    promtool) fails the run instead of passing as if it had run."""
    if os.environ.get("SWARM_AUTOSCALER_NO_SKIP") != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    skipped = reporter.stats.get("skipped", [])
    if skipped and session.exitstatus == pytest.ExitCode.OK:
        for report in skipped:
            reporter.write_line(
                f"skipped, which make test does not accept: {report.nodeid}: {report.longrepr}"
            )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
