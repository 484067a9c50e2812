"""`swarm-autoscaler simulate`: replay a trace against a policy and print what it cost.

Wiring (in the top-level cli): `sim.cli.add_parser(subparsers)` adds the subcommand and sets
`handler=sim.cli.main`; `main(args)` returns the exit status (0, or 2 for a bad trace or settings).

Settings come from `--env-file` (or, when omitted, `TRACE.env` next to the trace if it exists) and the
environment, through the simulator's subset loader (`sim.config`): only the variables a simulation uses
are read or required.

`--sweep KNOB=v1,v2,...` (`sim.sweep`) runs "ours" once per value of a setting and every baseline once,
prints one row per run (or, with `--json`, one object) and with `--plot` draws cost against p95 wait.

`--services FILE` instead of `--trace` simulates the dynamic mode (`sim.dynamic`): swarm services with
reservations and placement constraints, scaled over time (`sim.servicetrace`), through the same planner
and the same task-to-demand conversion the daemon's swarm services adapter uses.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from swarm_autoscaler.config.settings import InvalidSettingsError
from swarm_autoscaler.extras import require_extras
from swarm_autoscaler_lab.sim import sweep
from swarm_autoscaler_lab.sim.config import SimSettings, load_sim_settings
from swarm_autoscaler_lab.sim.dynamic import render_services, run_services
from swarm_autoscaler_lab.sim.engine import Options, start_time_warnings
from swarm_autoscaler_lab.sim.faults import RandomFaults
from swarm_autoscaler_lab.sim.runner import POLICIES, default_options, run_trace
from swarm_autoscaler_lab.sim.servicetrace import read_service_trace
from swarm_autoscaler_lab.sim.sweep import parse_sweep
from swarm_autoscaler_lab.sim.trace import Job, TraceError, read_trace

EXIT_INPUT = 2


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "simulate", help="replay a workload trace against a policy on a virtual clock"
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", help="dask jobs, CSV: submit_s,duration_s,cpus,ram_gib,gpus,instance_type")
    source.add_argument(
        "--services",
        metavar="SERVICES.csv",
        help="dynamic mode: swarm services, CSV: at_s,service,replicas,cpus,ram_gib,gpus,constraints,"
        "duration_s (each row sets a service's replicas from at_s; constraints like "
        "node.labels.instance-type==g4dn.xlarge, ';'-separated; e.g. scenarios/services/interactive.csv)",
    )
    p.add_argument("--policy", choices=POLICIES, default="ours", help="the scaling policy (default: ours)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument(
        "--plot", metavar="OUT.png", help="draw the timeline (with --sweep: cost against p95 wait)"
    )
    p.add_argument(
        "--sweep",
        type=parse_sweep,
        metavar="KNOB=V1,V2,...",
        help="run ours once per value of a setting (e.g. TOLERATED_WAIT=0s,2m,5m, reserve@m5.large=0,1) and "
        "each baseline once at the base settings; print cost and waits per run",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random faults and join jitter")
    p.add_argument("--env-file", help="settings file (default: TRACE.env when it exists)")
    knobs = p.add_argument_group("simulation knobs")
    knobs.add_argument("--tick-s", type=float, help="seconds between ticks (default: the poll interval)")
    knobs.add_argument("--join-s", type=float, default=90.0, help="launch to node join (default 90)")
    knobs.add_argument("--join-jitter-s", type=float, default=30.0, help="± uniform jitter of the join")
    knobs.add_argument("--worker-start-s", type=float, default=20.0, help="node active to worker up")
    knobs.add_argument(
        "--refusal-rate",
        action="append",
        default=[],
        metavar="[TYPE=]RATE",
        help="probability that EC2 refuses a launch for capacity; repeat TYPE=RATE per type",
    )
    knobs.add_argument("--never-join-rate", type=float, default=0.0, help="probability a machine never joins")
    knobs.add_argument("--restart-every", type=int, default=0, help="restart the daemon every N ticks")
    knobs.add_argument(
        "--dask-packing",
        action="store_true",
        help="the dask scheduler runs the packing preload (swarm_autoscaler.adapters.dask_packing)",
    )
    knobs.add_argument(
        "--spot-price-factor",
        type=float,
        default=0.0,
        help="launch every working machine as spot, billed at this fraction of on-demand (default 0: none)",
    )
    knobs.add_argument(
        "--interruptions-per-hour",
        type=float,
        default=0.0,
        help="EC2's interruption notices per spot machine-hour; the machine is taken 120 s after",
    )
    knobs.add_argument(
        "--deadline-s", type=float, default=6 * 3600.0, help="give up this long after the trace's last job"
    )
    p.set_defaults(handler=main)
    return p


def _rates(values: list[str]) -> tuple[float, dict[str, float]]:
    default, per_type = 0.0, {}
    for value in values:
        name, _, rate = value.rpartition("=")
        number = float(rate)
        if not 0.0 <= number <= 1.0:
            raise ValueError(f"--refusal-rate {value!r}: a rate is between 0 and 1")
        if name:
            per_type[name] = number
        else:
            default = number
    return default, per_type


def _settings(args: argparse.Namespace) -> SimSettings:
    return load_sim_settings(_env_file(args))


def _env_file(args: argparse.Namespace) -> str | None:
    sibling = Path(args.trace or args.services).with_suffix(".env")
    if args.env_file is None and sibling.is_file():
        return str(sibling)
    return str(args.env_file) if args.env_file is not None else None


def _options(args: argparse.Namespace, settings: SimSettings) -> Options:
    base = default_options(
        settings,
        join_s=args.join_s,
        join_jitter_s=args.join_jitter_s,
        worker_start_s=args.worker_start_s,
        dask_packing=args.dask_packing,
    )
    tick = args.tick_s if args.tick_s is not None else base.tick_s
    knobs = dataclasses.replace(base.knobs, spot_price_factor=args.spot_price_factor)
    return Options(tick_s=tick, knobs=knobs, restart_every=args.restart_every, deadline_s=args.deadline_s)


def main(args: argparse.Namespace) -> int:
    if args.plot:
        require_extras("simulate --plot", "sim")
    if args.services is not None:
        return _services(args)
    if args.sweep is not None and args.policy != "ours":
        print("simulate: --sweep runs ours (and every baseline once); leave --policy out", file=sys.stderr)
        return EXIT_INPUT
    try:
        jobs = read_trace(args.trace)
        settings = _settings(args)
        default, per_type = _rates(args.refusal_rate)
        runs = sweep.variants(_env_file(args), args.sweep) if args.sweep is not None else []
    except (TraceError, ValueError) as exc:
        print(f"simulate: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except InvalidSettingsError as exc:
        for problem in exc.problems:
            print(f"configuration error: {problem}", file=sys.stderr)
        return EXIT_INPUT
    faults = RandomFaults(
        args.seed, default, per_type, args.never_join_rate, interruptions_per_hour=args.interruptions_per_hour
    )
    for _, s in runs or [("", settings)]:
        for warning in start_time_warnings(_options(args, s).knobs, s.policy):
            print(f"simulate: warning: {warning}", file=sys.stderr)  # before a run that may take a while
    if args.sweep is not None:
        return _sweep(args, jobs, settings, runs, faults)
    run, summary = run_trace(jobs, settings, args.policy, _options(args, settings), faults)
    if args.plot:
        from swarm_autoscaler_lab.sim.plot import plot_run

        plot_run(run, args.plot, title=f"{Path(args.trace).name}: {args.policy}")
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        from rich.console import Console

        from swarm_autoscaler_lab.sim.report import render_table

        Console().print(render_table([summary], title=Path(args.trace).name))
    return 0


def _services(args: argparse.Namespace) -> int:
    """The dynamic mode: a service trace through the same planner (`sim.dynamic`)."""
    unsupported = [
        flag
        for flag, used in (
            ("--policy", args.policy != "ours"),
            ("--sweep", args.sweep is not None),
            ("--plot", bool(args.plot)),
            ("--dask-packing", args.dask_packing),
        )
        if used
    ]
    if unsupported:
        print(f"simulate: --services runs ours only, without {', '.join(unsupported)}", file=sys.stderr)
        return EXIT_INPUT
    try:
        changes = read_service_trace(args.services)
        settings = _settings(args)
        default, per_type = _rates(args.refusal_rate)
    except (TraceError, ValueError) as exc:
        print(f"simulate: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except InvalidSettingsError as exc:
        for problem in exc.problems:
            print(f"configuration error: {problem}", file=sys.stderr)
        return EXIT_INPUT
    options = _options(args, settings)
    for warning in start_time_warnings(options.knobs, settings.policy):
        print(f"simulate: warning: {warning}", file=sys.stderr)
    faults = RandomFaults(
        args.seed, default, per_type, args.never_join_rate, interruptions_per_hour=args.interruptions_per_hour
    )
    _, summary = run_services(changes, settings, options, faults)
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        from rich.console import Console

        Console().print(render_services(summary, Path(args.services).name))
    return 0


def _sweep(
    args: argparse.Namespace,
    jobs: Sequence[Job],
    settings: SimSettings,
    runs: Sequence[tuple[str, SimSettings]],
    faults: RandomFaults,
) -> int:
    points = sweep.run_sweep(jobs, settings, runs, lambda s: _options(args, s), faults)
    name = Path(args.trace).name
    if args.plot:
        from swarm_autoscaler_lab.sim.plot import plot_sweep

        plot_sweep(points, args.plot, args.sweep.knob, title=f"{name}: cost against p95 wait")
    if args.json:
        print(json.dumps(sweep.as_json(points, args.sweep), sort_keys=True))
    else:
        from rich.console import Console

        Console(width=200).print(sweep.render(points, args.sweep.knob, name))
    return 0


def run_cli(argv: list[str] | None = None) -> int:
    """`python -m swarm_autoscaler_lab.sim.cli ...`: the subcommand on its own (until it is wired)."""
    parser = argparse.ArgumentParser(prog="swarm-autoscaler")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    status: int = args.handler(args)
    return status


if __name__ == "__main__":
    raise SystemExit(run_cli())
