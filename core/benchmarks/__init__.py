"""Ready-to-run pytest-benchmark module: ``pytest --pyargs accelbench.benchmarks --benchmark-only``."""
