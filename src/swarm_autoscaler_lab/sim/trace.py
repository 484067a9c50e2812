"""Workload traces: one CSV row per job, read and written with line-numbered errors.

Header (exactly these columns, in any order)::

    submit_s,duration_s,cpus,ram_gib,gpus,instance_type

`submit_s` is seconds from the start of the simulation, `duration_s` how long the job runs once started,
`cpus`/`ram_gib`/`gpus` what it needs (dask resource restrictions), and `instance_type` (may be empty)
pins the job to that EC2 type. Bad rows raise `TraceError` naming the file and line number.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from swarm_autoscaler.core.model import GIB, Resources, Task

COLUMNS = ("submit_s", "duration_s", "cpus", "ram_gib", "gpus", "instance_type")


class TraceError(ValueError):
    """A trace file that cannot be read: the message names the file, the line and what to fix."""


Kind = tuple[float, float, int, str | None]  # a job's task prefix: `Job.kind`


@dataclass(frozen=True, slots=True)
class Job:
    """One job of a trace. `index` is its position in the trace (0-based) and names its task key."""

    index: int
    submit_s: float
    duration_s: float
    cpus: float
    ram_gib: float
    gpus: int
    instance_type: str | None = None

    @property
    def key(self) -> str:
        return f"job-{self.index:06d}"

    @property
    def needs(self) -> Resources:
        return Resources(self.cpus, round(self.ram_gib * GIB), self.gpus)

    def task(self) -> Task:
        return Task(self.key, self.needs, self.instance_type)

    @property
    def kind(self) -> Kind:
        """The job's task prefix in the simulated scheduler: a trace names no functions, so jobs with the
        same requests and pin are taken to be one kind of task, sharing dask's duration estimate."""
        return (self.cpus, self.ram_gib, self.gpus, self.instance_type)


def read_trace(path: str | Path) -> tuple[Job, ...]:
    """Read a trace file; jobs come back sorted by submit time (stable on ties)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the trace ({exc.strerror or exc})") from None
    return parse_trace(text, str(path))


def parse_trace(text: str, source: str = "<trace>") -> tuple[Job, ...]:
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None:
        raise TraceError(f"{source}:1: empty file; expected the header {','.join(COLUMNS)}")
    names = [h.strip() for h in header]
    if sorted(names) != sorted(COLUMNS):
        raise TraceError(f"{source}:1: header is {','.join(names)!r}; expected {','.join(COLUMNS)}")
    jobs: list[Job] = []
    for row in reader:
        line = reader.line_num
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != len(names):
            raise TraceError(f"{source}:{line}: expected {len(names)} fields, got {len(row)}")
        jobs.append(
            _parse_row(dict(zip(names, (c.strip() for c in row), strict=True)), len(jobs), source, line)
        )
    jobs.sort(key=lambda j: j.submit_s)
    return tuple(jobs)


def _number(cells: dict[str, str], name: str, where: str, *, positive: bool = False) -> float:
    try:
        value = float(cells[name])
    except ValueError:
        raise TraceError(f"{where}: {name}={cells[name]!r} is not a number") from None
    if math.isnan(value) or math.isinf(value) or value < 0 or (positive and value == 0):
        need = "a positive" if positive else "a non-negative"
        raise TraceError(f"{where}: {name}={cells[name]!r} must be {need} number")
    return value


def _parse_row(cells: dict[str, str], index: int, source: str, line: int) -> Job:
    where = f"{source}:{line}"
    gpus = _number(cells, "gpus", where)
    if gpus != int(gpus):
        raise TraceError(f"{where}: gpus={cells['gpus']!r} must be a whole number")
    job = Job(
        index=index,
        submit_s=_number(cells, "submit_s", where),
        duration_s=_number(cells, "duration_s", where, positive=True),
        cpus=_number(cells, "cpus", where),
        ram_gib=_number(cells, "ram_gib", where),
        gpus=int(gpus),
        instance_type=cells["instance_type"] or None,
    )
    if job.cpus == 0 and job.ram_gib == 0 and job.gpus == 0:
        raise TraceError(f"{where}: a job must need some cpus, ram_gib or gpus")
    return job


def format_trace(jobs: Iterable[Job]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for j in jobs:
        writer.writerow(
            [
                f"{j.submit_s:g}",
                f"{j.duration_s:g}",
                f"{j.cpus:g}",
                f"{j.ram_gib:g}",
                j.gpus,
                j.instance_type or "",
            ]
        )
    return out.getvalue()


def write_trace(path: str | Path, jobs: Sequence[Job]) -> None:
    Path(path).write_text(format_trace(jobs), encoding="utf-8")
