"""sglang.bench_serving, the name auto_benchmark runs at SGLang's commit e5c00dc (the 0.5.16 wheel runs
sglang.benchmark.serving): the same stand-in."""

from __future__ import annotations

import sys

from sglang.benchmark.serving import main

if __name__ == "__main__":
    sys.exit(main())
