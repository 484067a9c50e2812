"""The lab's commands of `swarm-autoscaler`: `demo` and `simulate`.

`pyproject.toml` registers `add_demo` and `add_simulate` under the `swarm_autoscaler.commands` entry
points; the product's CLI calls each with its subparsers, so it never imports the lab itself.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from swarm_autoscaler.cli import EXIT_CONFIGURATION
from swarm_autoscaler.extras import require_extras


def add_demo(subparsers: Any) -> None:
    """Add `demo`: the daemon on an embedded local cloud with a workload."""
    demo = subparsers.add_parser("demo", help="run the daemon on an embedded local cloud with a workload")
    demo.add_argument("--tasks", type=int, default=200, help="number of tasks to submit (default 200)")
    demo.add_argument("--fast", action="store_true", help="short delays (for CI)")
    demo.add_argument(
        "--swarm",
        action="store_true",
        help="real dockerd swarm nodes that boot from their user data, with the worker service "
        "(root, dockerd installed; the worker image is built on first use)",
    )
    demo.add_argument("--json", action="store_true", help="end with one JSON object of the results")
    demo.add_argument("--out-dir", default="demo-out", help="where the timeline PNG goes (default demo-out)")
    demo.add_argument("--verbose", action="store_true", help="show the daemon's log lines")
    demo.add_argument(
        "--mode",
        choices=("computational", "dynamic"),
        default="computational",
        help="computational (default): dask tasks; dynamic: swarm services placed on the machines it launches",
    )
    demo.add_argument(
        "--clusters",
        type=int,
        default=0,
        metavar="N",
        help="instead: N users' on-demand clusters through the keeper's API (each with its own autoscaler)",
    )
    demo.set_defaults(handler=_cmd_demo)


def add_simulate(subparsers: Any) -> None:
    """Add `simulate`: replay a workload trace against a policy on a virtual clock."""
    from swarm_autoscaler_lab.sim.cli import add_parser

    add_parser(subparsers)


def _cmd_demo(args: argparse.Namespace) -> int:
    if args.clusters and (args.swarm or args.clusters < 0):  # checked before logging is configured
        print("demo: --clusters N needs N >= 1 and runs on the in-memory swarm (no --swarm)", file=sys.stderr)
        return EXIT_CONFIGURATION
    if args.mode == "dynamic" and (args.swarm or args.clusters):
        print(
            "demo: --mode dynamic runs on the in-memory swarm, without --swarm or --clusters", file=sys.stderr
        )
        return EXIT_CONFIGURATION
    require_extras("demo", "local", "sim")
    from swarm_autoscaler.runtime.logs import configure_logging
    from swarm_autoscaler_lab.demo import run as demo

    configure_logging("WARNING" if not args.verbose else "INFO", "console")
    if not args.verbose:  # the embedded scheduler, workers and moto are chatty; the dashboard says enough
        import logging

        import distributed  # noqa: F401 - configures its loggers on import; quiet them afterwards

        for name in ("distributed", "werkzeug", "tornado"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    if args.mode == "dynamic":
        from swarm_autoscaler_lab.demo import dynamic

        return dynamic.main(dynamic.DynamicDemoOptions(fast=args.fast, json=args.json))
    if args.clusters:
        from swarm_autoscaler_lab.demo import clusters

        return clusters.main(clusters.ClustersOptions(clusters=args.clusters, fast=args.fast, json=args.json))
    opts = demo.DemoOptions(
        tasks=args.tasks, fast=args.fast, swarm=args.swarm, json=args.json, out_dir=Path(args.out_dir)
    )
    return demo.main(opts)
