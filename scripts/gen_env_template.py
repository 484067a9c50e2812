"""Write `.env.template` from the settings model (or, with --check, fail when it is out of date).

Usage: .venv/bin/python scripts/gen_env_template.py [--check]
The same text is printed by `swarm-autoscaler env-template`; `--markdown` there gives the README table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from swarm_autoscaler.config.doc import env_template

TEMPLATE = Path(__file__).resolve().parent.parent / ".env.template"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs instead of writing")
    args = parser.parse_args()
    text = env_template()
    if args.check:
        current = TEMPLATE.read_text() if TEMPLATE.exists() else ""
        if current != text:
            print(f"{TEMPLATE} is out of date: run scripts/gen_env_template.py", file=sys.stderr)
            return 1
        return 0
    TEMPLATE.write_text(text)
    print(f"wrote {TEMPLATE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
