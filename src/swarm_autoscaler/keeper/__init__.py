"""On-demand clusters: `swarm-autoscaler keeper` creates a private cluster per (user, wallet) on request,
watches each one in its own asyncio task, and ends it when unused or left without a client."""
