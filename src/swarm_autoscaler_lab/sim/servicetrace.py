"""Service workload traces for the dynamic mode: one CSV row per change of a swarm service.

Header (exactly these columns, in any order)::

    at_s,service,replicas,cpus,ram_gib,gpus,constraints,duration_s

A row says: from `at_s` (seconds from the start) the service `service` runs `replicas` replicas, each
reserving `cpus`, `ram_gib` GiB and `gpus` GPUs (its `Resources.Reservations`; a GPU is a generic
resource of kind `gpu`), placed under `constraints` (swarm placement constraints separated by `;`, e.g.
`node.labels.instance-type==g4dn.xlarge;node.role==worker`; may be empty). When `duration_s` is set
the service scales to 0 that long after `at_s` (an interactive session that ends) unless a later row
of the same service comes first; empty: it keeps its replicas until a later row changes them. A service's first row defines its
reservations and constraints; a later row may leave those cells empty or repeat them, not change them
(swarm would replace every task: write a new service instead). Bad rows raise `TraceError` naming the
file and line.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from swarm_autoscaler.core.model import GIB, Resources
from swarm_autoscaler_lab.sim.trace import TraceError

COLUMNS = ("at_s", "service", "replicas", "cpus", "ram_gib", "gpus", "constraints", "duration_s")
_SPEC = ("cpus", "ram_gib", "gpus", "constraints")


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """What each task of a service reserves and where it may run."""

    name: str
    cpus: float
    ram_gib: float
    gpus: int
    constraints: tuple[str, ...] = ()

    @property
    def needs(self) -> Resources:
        return Resources.of(self.cpus, round(self.ram_gib * GIB), self.gpus)


@dataclass(frozen=True, slots=True)
class Scale:
    """At `at_s` the service `spec` runs `replicas` replicas (for `duration_s`, then 0; None: on)."""

    at_s: float
    spec: ServiceSpec
    replicas: int
    duration_s: float | None = None

    @property
    def end_s(self) -> float:
        return self.at_s + (self.duration_s or 0.0)


def is_service_trace(path: str | Path) -> bool:
    """Whether the file's header names this format's columns (the `simulate` command picks the mode)."""
    try:
        with Path(path).open(encoding="utf-8") as fh:
            header = next(csv.reader(fh), [])
    except OSError:
        return False
    return sorted(h.strip() for h in header) == sorted(COLUMNS)


def read_service_trace(path: str | Path) -> tuple[Scale, ...]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the trace ({exc.strerror or exc})") from None
    return parse_service_trace(text, str(path))


def parse_service_trace(text: str, source: str = "<services>") -> tuple[Scale, ...]:
    """The rows as `Scale` changes sorted by time (stable on ties)."""
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None:
        raise TraceError(f"{source}:1: empty file; expected the header {','.join(COLUMNS)}")
    names = [h.strip() for h in header]
    if sorted(names) != sorted(COLUMNS):
        raise TraceError(f"{source}:1: header is {','.join(names)!r}; expected {','.join(COLUMNS)}")
    specs: dict[str, ServiceSpec] = {}
    out: list[Scale] = []
    for row in reader:
        where = f"{source}:{reader.line_num}"
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != len(names):
            raise TraceError(f"{where}: expected {len(names)} fields, got {len(row)}")
        cells = dict(zip(names, (c.strip() for c in row), strict=True))
        out.append(_row(cells, specs, where))
    out.sort(key=lambda s: s.at_s)
    return tuple(out)


def _number(cells: dict[str, str], name: str, where: str, default: float | None = None) -> float:
    if not cells[name] and default is not None:
        return default
    try:
        value = float(cells[name])
    except ValueError:
        raise TraceError(f"{where}: {name}={cells[name]!r} is not a number") from None
    if math.isnan(value) or math.isinf(value) or value < 0:
        raise TraceError(f"{where}: {name}={cells[name]!r} must be a non-negative number")
    return value


def _whole(cells: dict[str, str], name: str, where: str, default: float | None = None) -> int:
    value = _number(cells, name, where, default)
    if value != int(value):
        raise TraceError(f"{where}: {name}={cells[name]!r} must be a whole number")
    return int(value)


def _row(cells: dict[str, str], specs: dict[str, ServiceSpec], where: str) -> Scale:
    name = cells["service"]
    if not name:
        raise TraceError(f"{where}: a row needs a service name")
    known = specs.get(name)
    if known is None or any(cells[c] for c in _SPEC):
        spec = ServiceSpec(
            name,
            _number(cells, "cpus", where, 0.0),
            _number(cells, "ram_gib", where, 0.0),
            _whole(cells, "gpus", where, 0.0),
            tuple(c.strip() for c in cells["constraints"].split(";") if c.strip()),
        )
        if known is not None and spec != known:
            raise TraceError(
                f"{where}: service {name!r} changes its reservations or constraints; leave those cells"
                " empty to keep them, or name a new service"
            )
        if spec.needs == Resources():
            raise TraceError(f"{where}: service {name!r} must reserve some cpus, ram_gib or gpus")
        specs[name] = known = spec
    duration = _number(cells, "duration_s", where) if cells["duration_s"] else None
    if duration == 0.0:
        raise TraceError(f"{where}: duration_s must be positive (or empty: no end)")
    return Scale(_number(cells, "at_s", where), known, _whole(cells, "replicas", where), duration)


def format_service_trace(changes: Iterable[Scale]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for s in changes:
        spec = s.spec
        writer.writerow(
            [
                f"{s.at_s:g}",
                spec.name,
                s.replicas,
                f"{spec.cpus:g}",
                f"{spec.ram_gib:g}",
                spec.gpus,
                ";".join(spec.constraints),
                "" if s.duration_s is None else f"{s.duration_s:g}",
            ]
        )
    return out.getvalue()
