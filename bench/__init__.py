"""Benchmarks: each module runs as ``python bench/NAME.py`` or ``python -m bench.NAME``."""
