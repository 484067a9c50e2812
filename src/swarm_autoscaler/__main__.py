"""`python -m swarm_autoscaler` is the `swarm-autoscaler` command."""

import sys

from swarm_autoscaler.cli import main

sys.exit(main())
