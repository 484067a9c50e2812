"""Print the kill rate per module of the last `make mutation` run (mutmut's results under mutants/).

A mutant is *killed* when a test failed on it (or the type checker rejected it, or it made the tests
time out: an infinite loop is caught too); it *survives* when every selected test passed; it has *no
tests* when no selected test runs its function. The rate is killed / (killed + survived + no tests):
a mutant no test reaches counts against the tests. `--survivors` lists the surviving mutants, each with
the line it changes.

Exit status 0 always: the rate is a figure to read and act on, not a gate (a run is too slow for one).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
from collections import Counter
from pathlib import Path

KILLED = {
    1: "killed",
    3: "killed",
    36: "timeout",
    37: "type check",
    -24: "timeout",
    24: "timeout",
    152: "timeout",
}
SURVIVED = {0: "survived", 5: "no tests", 33: "no tests"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("mutants"))
    parser.add_argument("--survivors", action="store_true", help="list the surviving mutants too")
    args = parser.parse_args()
    metas = sorted(args.root.rglob("*.py.meta"))
    if not metas:
        raise SystemExit(f"no mutmut results under {args.root}/: run `make mutation` first")
    rows, survivors = [], []
    totals: Counter[str] = Counter()
    for meta in metas:
        codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
        if not codes:
            continue
        count: Counter[str] = Counter()
        for name, code in codes.items():
            kind = "killed" if code in KILLED else "survived" if code in SURVIVED else "other"
            count[kind if code is not None else "not run"] += 1
            if code in SURVIVED:
                survivors.append(f"{name}  ({SURVIVED[code]})\n{_change(meta, name)}")
        totals.update(count)
        module = str(meta.relative_to(args.root)).removesuffix(".meta").removeprefix("src/")
        rows.append((module, count))
    print(f"{'module':<42} {'mutants':>7} {'killed':>7} {'survived':>8} {'not run':>7} {'kill rate':>9}")
    for module, count in [*rows, ("all", totals)]:
        decided = count["killed"] + count["survived"]
        rate = f"{count['killed'] / decided:.1%}" if decided else "-"
        total = sum(count.values())
        print(
            f"{module:<42} {total:>7} {count['killed']:>7} {count['survived']:>8} "
            f"{count['not run'] + count['other']:>7} {rate:>9}"
        )
    if args.survivors:
        print("\nsurviving mutants:")
        print("\n".join(f"  {s}" for s in survivors))


def _change(meta: Path, name: str) -> str:
    """The lines mutant `name` changes, from mutmut's mutated copy of the module beside `meta`."""
    tree = ast.parse(meta.with_suffix("").read_text())
    functions = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    mutant = name.rsplit(".", 1)[-1]
    original = functions.get(mutant.rsplit("__mutmut_", 1)[0] + "__mutmut_orig")
    changed = functions.get(mutant)
    if original is None or changed is None:
        return "      (source not found)"
    before, after = ast.unparse(original).splitlines()[1:], ast.unparse(changed).splitlines()[1:]
    diff = difflib.unified_diff(before, after, lineterm="", n=0)
    return "\n".join(
        f"      {line.strip()}" for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---")
    )


if __name__ == "__main__":
    main()
