"""The lab's loopback networks: two local clouds (in one process or two, as the fast lane's pytest-xdist
workers and the dockerd lane run them side by side) never get the same `127.N` prefix. Stands in for
nothing: it is the lab's own allocator, tested with real `flock`s and a real second process."""

from __future__ import annotations

import subprocess
import sys

from swarm_autoscaler_lab.localcloud.loopback import claim_loopback_prefix, release_loopback_prefix

OTHER_PROCESS = """
import sys
from swarm_autoscaler_lab.localcloud.loopback import claim_loopback_prefix
held = set(sys.argv[1:])
got = [claim_loopback_prefix() for _ in range(40)]
print(len(held & set(got)), len(set(got)))
"""


def test_claims_never_share_a_prefix_in_one_process_or_across_two() -> None:
    mine = [claim_loopback_prefix() for _ in range(40)]
    try:
        assert len(set(mine)) == 40, mine
        assert all(p.startswith("127.") and p != "127.0" for p in mine)
        out = subprocess.run(
            [sys.executable, "-c", OTHER_PROCESS, *mine], capture_output=True, text=True, check=True
        ).stdout.split()
        assert out == ["0", "40"], out  # the other process drew 40 of its own, none of mine
    finally:
        for p in mine:
            release_loopback_prefix(p)
    again = claim_loopback_prefix()  # released ones are free again (and the other process's, on exit)
    release_loopback_prefix(again)
