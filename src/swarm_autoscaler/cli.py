"""The `swarm-autoscaler` command: parse arguments, load settings, call the part that does the work.

Thin by design: every command's work lives elsewhere (daemon/commands.py, keeper/app.py). The lab's
commands (`demo`, `simulate`) are added through entry points (`_add_plugin_commands`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings, SettingsError

from swarm_autoscaler.config.doc import env_template
from swarm_autoscaler.config.reference import settings_reference
from swarm_autoscaler.config.settings import (
    InvalidSettingsError,
    LoggingSettings,
    Settings,
    env_path,
    load_settings,
)
from swarm_autoscaler.config.variables import unknown_variables
from swarm_autoscaler.extras import EXIT_MISSING_EXTRA, install_line, missing_extra_of

EXIT_CONFIGURATION = 2
PLUGIN_GROUP = "swarm_autoscaler.commands"
T = TypeVar("T")
S = TypeVar("S", bound=BaseSettings)


def load_settings_or_exit(env_file: str | None = None) -> Settings:
    """Validated settings, or exit with status 2 after printing one line per wrong variable (or one for
    an unreadable env file) to standard error (no traceback, no secret), each a JSON object when the
    log format is json (`read_settings`). Unknown `AUTOSCALER_*` variables are reported as warnings."""
    settings = read_settings(env_file, load_settings)
    if settings is None:
        raise SystemExit(EXIT_CONFIGURATION)
    return settings


def read_settings(env_file: str | None, load: Callable[[Path | None], T]) -> T | None:
    """`load(path)` of the env file, or None after printing its problems, one line each, on standard
    error; unknown `AUTOSCALER_*` variables are warned of first. Every line is in the log format the
    settings ask for (`log_format_of`): a log collector reading JSON lines reads these too."""
    from swarm_autoscaler.runtime.logs import startup_line

    fmt = log_format_of(None)
    try:
        path = env_path(env_file)  # checked first: the warnings below read it too
        fmt = log_format_of(path)
        for warning in unknown_variables(path):
            print(startup_line(f"configuration warning: {warning}", fmt, "warning"), file=sys.stderr)
        return load(path)
    except InvalidSettingsError as exc:
        for problem in exc.problems:
            print(startup_line(f"configuration error: {problem}", fmt), file=sys.stderr)
        return None


def log_format_of(path: Path | None) -> str:
    """The log format the environment and env file ask for (`AUTOSCALER_LOG_FORMAT`, json by default),
    read alone so that a start refused for any other setting (the log level included) is reported in
    it; console when the format itself is wrong (its line then says so)."""
    try:
        return _built(LoggingSettings, path, level="INFO").format  # the level given: not read
    except (ValidationError, SettingsError):
        return "console"


def _built(cls: type[S], path: Path | None, **values: Any) -> S:
    """`cls` from `values`, the environment and the env file, in that precedence."""
    return cls(_env_file=path, **values)


def _configured(args: argparse.Namespace) -> int:
    from swarm_autoscaler.daemon import commands
    from swarm_autoscaler.runtime.logs import configure_logging, startup_line

    settings = load_settings_or_exit(args.env_file)
    fmt = settings.logging.format
    configure_logging(settings.logging.level, fmt)
    if args.command == "run":
        from swarm_autoscaler.daemon.debug import start_debugpy
        from swarm_autoscaler.errors import ConfigurationError

        try:
            start_debugpy(settings.debugpy)
        except ConfigurationError as exc:
            print(startup_line(f"configuration error: {exc}", fmt), file=sys.stderr)
            return EXIT_CONFIGURATION
    work = {"run": commands.run, "plan": commands.explain, "status": commands.status}[args.command]
    return commands.guarded(lambda: work(settings), log_format=fmt)


def _cmd_keeper(args: argparse.Namespace) -> int:
    from swarm_autoscaler.config.keeper import load_keeper_settings
    from swarm_autoscaler.daemon import commands
    from swarm_autoscaler.keeper.app import run_keeper
    from swarm_autoscaler.runtime.logs import configure_logging

    config = read_settings(args.env_file, load_keeper_settings)
    if config is None:
        return EXIT_CONFIGURATION
    configure_logging(config.logging.level, config.logging.format)
    return commands.guarded(lambda: run_keeper(config), log_format=config.logging.format)


def _cmd_env_template(args: argparse.Namespace) -> int:
    sys.stdout.write(settings_reference() if args.markdown else env_template())
    return 0


def _cmd_healthcheck(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from swarm_autoscaler.daemon.healthcheck import check

    try:
        status, line = check(keeper=args.keeper)
    except ValidationError as exc:
        status, line = EXIT_CONFIGURATION, f"configuration error: AUTOSCALER_HTTP_*: {exc.errors()[0]['msg']}"
    print(line, file=sys.stderr if status else sys.stdout)
    return status


def _add_plugin_commands(commands: Any) -> None:
    """The commands other packages register under the `swarm_autoscaler.commands` entry points (the lab's
    `demo` and `simulate`), each a function that adds its subparser: the product never imports them."""
    from importlib.metadata import entry_points

    for point in sorted(entry_points(group=PLUGIN_GROUP), key=lambda p: p.name):
        point.load()(commands)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swarm-autoscaler",
        description="Keeps a docker swarm of EC2 machines running dask workers right-sized.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    configured = {
        "run": "run the daemon",
        "plan": "observe once and print the plan without acting",
        "status": "print the cluster's current state",
    }
    for name, help_text in configured.items():
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("--env-file", help="read variables from this file too (the environment wins)")
        sub.set_defaults(handler=_configured)
    keeper = commands.add_parser("keeper", help="run the on-demand clusters keeper (HTTP API)")
    keeper.add_argument("--env-file", help="read variables from this file too (the environment wins)")
    keeper.set_defaults(handler=_cmd_keeper)
    _add_plugin_commands(commands)
    template = commands.add_parser("env-template", help="print the .env template of every variable")
    template.add_argument(
        "--markdown", action="store_true", help="print the settings reference (Markdown) instead"
    )
    template.set_defaults(handler=_cmd_env_template)
    health = commands.add_parser(
        "healthcheck", help="ask the running daemon's /healthz (the image's HEALTHCHECK)"
    )
    health.add_argument("--keeper", action="store_true", help="ask the keeper's /healthz instead")
    health.set_defaults(handler=_cmd_healthcheck)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `swarm-autoscaler` script; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        status: int = args.handler(args)
    except ModuleNotFoundError as exc:  # an optional module imported late: name its extra, in one line
        extra = missing_extra_of(exc)
        if extra is None:
            raise
        print(install_line(args.command, [extra]), file=sys.stderr)
        return EXIT_MISSING_EXTRA
    return status


if __name__ == "__main__":
    sys.exit(main())
