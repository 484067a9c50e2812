"""`python -m swarm_autoscaler` is the `swarm-autoscaler` command."""

import sys

from .cli import main

sys.exit(main())
