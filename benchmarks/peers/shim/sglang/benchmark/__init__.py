"""sglang.benchmark as auto_benchmark imports it (see the package docstring)."""
