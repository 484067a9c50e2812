"""Write `.env.template` and `docs/reference/settings.md` from the settings models (or, with --check, fail
when either is out of date). Run it after adding or changing a setting.

Usage: .venv/bin/python scripts/gen_env_template.py [--check]
The same texts are printed by `swarm-autoscaler env-template` (`--markdown` for the reference page).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from swarm_autoscaler.config.doc import env_template
from swarm_autoscaler.config.reference import settings_reference

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / ".env.template"
REFERENCE = ROOT / "docs" / "reference" / "settings.md"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a file differs instead of writing")
    args = parser.parse_args()
    stale = 0
    for path, text in ((TEMPLATE, env_template()), (REFERENCE, settings_reference())):
        if args.check:
            current = path.read_text() if path.exists() else ""
            if current != text:
                print(
                    f"{path} is out of date: run .venv/bin/python scripts/gen_env_template.py",
                    file=sys.stderr,
                )
                stale = 1
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return stale


if __name__ == "__main__":
    sys.exit(main())
