"""Test-only accelbench plugins: known step times, and backends that fail in every way."""
