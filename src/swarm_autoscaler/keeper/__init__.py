"""On-demand clusters: `swarm-autoscaler keeper` creates a private cluster per (user, wallet) on request,
watches each one in its own asyncio task, and ends it when unused (seeds 001 and 003)."""
