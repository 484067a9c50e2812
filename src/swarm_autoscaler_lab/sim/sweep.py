"""`simulate --sweep KNOB=v1,v2,...`: "ours" over a setting's values, against the baselines, as cost
against p95 wait (the cost/wait trade as an operator's knob).

KNOB names a setting the simulator reads, in one of two forms:

- a daemon variable of the timing or EC2 groups, with or without its `AUTOSCALER_` prefix and in any
  case (`TOLERATED_WAIT`, `AUTOSCALER_DRAIN_DELAY`, `ec2_max_instances`); the values are written as in
  the env file (`0s,1m,2m`);
- a field of every allowed type in `AUTOSCALER_EC2_ALLOWED_TYPES` (`reserve=0,1`), or of one type with
  `FIELD@TYPE` (`reserve@m5.xlarge=0,1,2`); each value is read as JSON (a number, usually).

Each value gives one settings file: the base file (`--env-file`, or `TRACE.env`) with the knob's variable
set once more at its end (dotenv keeps the last of a repeated key). A variable set in the environment
would override the file, so sweeping it is refused. Every value is validated before anything runs.
"ours" runs once per value; each baseline (queue rule, adaptive, static) once, at the base settings,
since none of them reads the planner's settings.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarm_autoscaler.config.settings import PREFIX, InvalidSettingsError, TimingSettings
from swarm_autoscaler_lab.sim.config import SimEc2Settings, SimSettings, SimType, load_sim_settings
from swarm_autoscaler_lab.sim.engine import Options
from swarm_autoscaler_lab.sim.runner import POLICIES, run_trace
from swarm_autoscaler_lab.sim.trace import Job
from swarm_autoscaler_lab.sim.world import Faults

TYPES_VARIABLE = f"{PREFIX}EC2_ALLOWED_TYPES"
# Per-type fields that are not a knob: what to boot, and the overhead object (no comma-free value).
NOT_KNOBS = frozenset({"ami_id", "boot_script", "overhead"})
BASELINES = tuple(p for p in POLICIES if p != "ours")


@dataclass(frozen=True, slots=True)
class Sweep:
    """A parsed `--sweep`: the variable written per value, or the per-type field (and its one type)."""

    knob: str  # as shown: the variable name, or FIELD[@TYPE]
    values: tuple[str, ...]
    variable: str  # the AUTOSCALER_* variable each value sets
    field: str | None = None  # a per-type field of TYPES_VARIABLE
    type_name: str | None = None  # None: the field of every allowed type


def settings_variables() -> dict[str, str]:
    """Every variable the simulator reads, by its name without the prefix, upper case."""
    names = [f"{PREFIX}{n.upper()}" for n in TimingSettings.model_fields]
    names += [f"{PREFIX}EC2_{n.upper()}" for n in SimEc2Settings.model_fields]
    return {n.removeprefix(PREFIX): n for n in names}


def type_fields() -> tuple[str, ...]:
    return tuple(n for n in SimType.model_fields if n not in NOT_KNOBS)


def parse_sweep(text: str) -> Sweep:
    """`KNOB=v1,v2,...` as described in the module docstring; `argparse.ArgumentTypeError` (a usage
    error, exit status 2) when it does not name a setting or has no values."""
    knob, sep, raw = text.partition("=")
    knob = knob.strip()
    values = tuple(v.strip() for v in raw.split(","))
    if not sep or not knob or not all(values):
        raise argparse.ArgumentTypeError(f"{text!r}: expected KNOB=VALUE,VALUE,... (no empty value)")
    field, _, type_name = knob.partition("@")
    if field.lower() in type_fields():
        return Sweep(knob, values, TYPES_VARIABLE, field.lower(), type_name or None)
    if type_name:
        fields = ", ".join(type_fields())
        raise argparse.ArgumentTypeError(f"{knob!r}: FIELD@TYPE takes a per-type field ({fields})")
    variable = settings_variables().get(knob.upper().removeprefix(PREFIX))
    if variable is None or variable == TYPES_VARIABLE:
        raise argparse.ArgumentTypeError(
            f"{knob!r} is not a setting the simulator reads; sweep one of "
            f"{', '.join(sorted(set(settings_variables()) - {TYPES_VARIABLE.removeprefix(PREFIX)}))}, "
            f"or a per-type field ({', '.join(type_fields())}, optionally FIELD@TYPE)"
        )
    return Sweep(knob, values, variable)


def variant_env(base: str, sweep: Sweep, value: str) -> str:
    """The settings file's text for one value (`InvalidSettingsError` when it cannot be written)."""
    if sweep.variable in os.environ:
        raise InvalidSettingsError(
            [
                f"{sweep.variable} is set in the environment, which overrides the env file: unset it to sweep it"
            ]
        )
    if sweep.field is None:
        line = f"{sweep.variable}={_quote(value)}"
    else:
        line = f"{TYPES_VARIABLE}={_quote(json.dumps(_with_field(base, sweep, value)))}"
    return base.rstrip("\n") + ("\n" if base.strip() else "") + line + "\n"


def _with_field(base: str, sweep: Sweep, value: str) -> dict[str, Any]:
    from dotenv import dotenv_values

    raw = dotenv_values(stream=io.StringIO(base)).get(TYPES_VARIABLE)
    try:
        types = json.loads(raw or "")
    except json.JSONDecodeError:
        types = None
    if not isinstance(types, dict):
        raise InvalidSettingsError([f"--sweep {sweep.knob}: the env file sets no valid {TYPES_VARIABLE}"])
    if sweep.type_name is not None and sweep.type_name not in types:
        allowed = ", ".join(types)
        raise InvalidSettingsError([f"--sweep {sweep.knob}: {sweep.type_name} is not allowed ({allowed})"])
    try:
        parsed: Any = json.loads(value)
    except json.JSONDecodeError:
        parsed = value
    for name, spec in types.items():
        if sweep.type_name in (None, name):
            types[name] = {**spec, sweep.field: parsed}
    return types


def _quote(value: str) -> str:
    return "'" + value + "'" if "'" not in value else value


def variants(base_file: str | None, sweep: Sweep) -> list[tuple[str, SimSettings]]:
    """(value, settings) per value, all validated first; `InvalidSettingsError` lists every problem."""
    base = Path(base_file).read_text(encoding="utf-8") if base_file else ""
    out, problems = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i, value in enumerate(sweep.values):
            path = Path(tmp) / f"sweep-{i}.env"
            try:
                path.write_text(variant_env(base, sweep, value), encoding="utf-8")
                out.append((value, load_sim_settings(path)))
            except InvalidSettingsError as exc:
                problems += [f"--sweep {sweep.knob}={value}: {p}" for p in exc.problems]
    if problems:
        raise InvalidSettingsError(problems)
    return out


@dataclass(frozen=True, slots=True)
class Point:
    """One run: the policy, the knob's value ("ours"; None for a baseline at the base settings), and
    the run's summary (`sim.report.summarize`)."""

    policy: str
    value: str | None
    summary: Mapping[str, Any]


def run_sweep(
    jobs: Sequence[Job],
    base: SimSettings,
    runs: Sequence[tuple[str, SimSettings]],
    options: Callable[[SimSettings], Options],
    faults: Faults,
) -> list[Point]:
    """ "ours" at each (value, settings), then every baseline at `base`; in that order."""
    points = [Point("ours", v, run_trace(jobs, s, "ours", options(s), faults)[1]) for v, s in runs]
    points += [Point(p, None, run_trace(jobs, base, p, options(base), faults)[1]) for p in BASELINES]
    return points


def covered(points: Sequence[Point]) -> dict[str, list[str]]:
    """Per baseline, the values at which "ours" is at least as cheap with a p95 wait at least as short
    (a cost target: some setting of ours for each baseline)."""
    ours = [p for p in points if p.policy == "ours"]
    return {
        b.policy: [
            str(o.value)
            for o in ours
            if o.summary["cost_usd"] <= b.summary["cost_usd"]
            and o.summary["wait_p95_s"] <= b.summary["wait_p95_s"]
        ]
        for b in points
        if b.policy != "ours"
    }


COLUMNS = (
    ("cost $", "cost_usd"),
    ("cost / LB", "cost_ratio"),
    ("p50 wait s", "wait_p50_s"),
    ("p95 wait s", "wait_p95_s"),
    ("makespan / LB", "makespan_ratio"),
    ("launches", "launches"),
    ("peak", "peak_instances"),
    ("completed", "completed_jobs"),
    ("busy terminations", "busy_terminations"),
    ("above max", "max_exceeded"),
)


def rows(points: Sequence[Point]) -> list[list[str]]:
    """The table's cells: policy, knob value ("base" for a baseline), then `COLUMNS`."""
    out = []
    for p in points:
        cells = [p.policy, "base" if p.value is None else p.value]
        for _, key in COLUMNS:
            value = p.summary.get(key)
            cells.append(_fmt(value, key))
        out.append(cells)
    return out


def _fmt(value: object, key: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}" if key == "cost_usd" else f"{value:.3f}" if value < 10 else f"{value:.0f}"
    return str(value)


def render(points: Sequence[Point], knob: str, title: str) -> Any:
    """A rich Table of `rows`, then one line per baseline saying which values of ours cover it."""
    from rich.table import Table

    table = Table(title=f"{title}: ours over {knob}", caption=_caption(points))
    for name in ("policy", knob, *(n for n, _ in COLUMNS)):
        table.add_column(name, justify="left" if name in ("policy", knob) else "right")
    for cells in rows(points):
        table.add_row(*cells)
    return table


def _caption(points: Sequence[Point]) -> str:
    parts = []
    for baseline, values in covered(points).items():
        parts.append(f"{baseline}: {', '.join(values) if values else 'none'}")
    return (
        "values of ours at least as cheap as each baseline with a p95 wait at least as short: "
        + "; ".join(parts)
    )


def as_json(points: Sequence[Point], sweep: Sweep) -> dict[str, Any]:
    return {
        "knob": sweep.knob,
        "variable": sweep.variable,
        "points": [{"policy": p.policy, "value": p.value, **p.summary} for p in points],
        "covered": covered(points),
    }
