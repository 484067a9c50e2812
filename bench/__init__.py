"""Benchmarks, run with `python -m bench [name ...]` (all of them by default). See `__main__.py`."""
