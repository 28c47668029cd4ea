"""autotune: tune NCCL, SGLang and speculative-decoding settings jointly, as an Optuna study."""

from __future__ import annotations

__version__ = "0.1.0"
