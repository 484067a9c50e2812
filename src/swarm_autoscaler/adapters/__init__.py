"""Adapters: the only place vendor SDKs (aiobotocore, aiodocker, distributed, redis) are imported."""
