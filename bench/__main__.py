"""`python -m bench [name ...] [--flag ...]`: run the named benchmarks (default: all of them, in
registry order). Arguments starting with `-` are passed to every benchmark that runs (e.g. `--quick`).

To add a benchmark, write a module in this package with a `main(flags: list[str]) -> None` function and
register it in `BENCHMARKS` below (name -> module). Modules are imported only when their benchmark runs.
"""

from __future__ import annotations

import importlib
import sys

import dask

from swarm_autoscaler.runtime.worker import profiler_is_unsafe

BENCHMARKS: dict[str, str] = {
    "plan": "bench.plan_bench",
    "sim": "bench.sim_bench",
    "daemon": "bench.daemon_bench",
    "act": "bench.act_bench",
    "keeper": "bench.keeper_bench",
    "keeper-ec2": "bench.keeper_ec2_bench",
    "keeper-usage": "bench.keeper_usage_bench",
    "fidelity": "bench.fidelity_bench",
    "peer": "bench.peer_bench",
    "packing": "bench.packing_bench",
    "drain": "bench.drain_bench",
    "queued": "bench.queued_bench",
}


def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):  # a flag is passed to every benchmark: without this, --help ran them all
        print(__doc__)
        print(f"benchmarks: {', '.join(BENCHMARKS)}")
        return 0
    flags = [a for a in argv if a.startswith("-")]
    names = [a for a in argv if not a.startswith("-")] or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(
            f"unknown benchmark(s) {', '.join(unknown)}; choose from: {', '.join(BENCHMARKS)}",
            file=sys.stderr,
        )
        return 2
    # every in-process dask worker of every bench (ours, the peer's) without dask's profiler on Python
    # 3.11, as the worker service runs them (swarm_autoscaler.runtime.worker: it can deadlock there)
    dask.config.set({"distributed.worker.profile.enabled": not profiler_is_unsafe()})
    for name in names:
        print(f"== {name}")
        importlib.import_module(BENCHMARKS[name]).main(flags)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
