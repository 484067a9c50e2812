"""Shared test configuration. Each area keeps its own fixtures in its own folder's conftest.py."""
