"""Benchmark scripts for llmslo (run them as ``.venv/bin/python bench/bench_*.py --help``)."""
