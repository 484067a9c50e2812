"""The keeper's own adapters: its EC2 primaries, tags, dask probe and redis leases."""
