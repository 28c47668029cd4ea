"""sglang.benchmark.datasets: the `random` dataset as SGLang's bench_serving builds it (prompt lengths
uniform in [input_len * range_ratio, input_len], likewise the outputs), as token ids."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any


@dataclass
class DatasetRow:
    """One request: its prompt (token ids), prompt length and output length, as SGLang's rows carry."""

    prompt: Any
    prompt_len: int
    output_len: int


def _length(rng: random.Random, length: int, range_ratio: float) -> int:
    return max(1, rng.randint(int(length * range_ratio), length))


def get_dataset(args: Any, tokenizer: Any = None, model_id: str | None = None) -> list[DatasetRow]:
    """SGLang's `random` dataset of `args.num_prompts` rows; the other kinds need files or a tokenizer."""
    if args.dataset_name != "random":
        raise ValueError(f"this stand-in builds only the random dataset, not {args.dataset_name!r}")
    rng = random.Random(args.seed)
    rows = []
    for _ in range(args.num_prompts):
        input_len = _length(rng, args.random_input_len, args.random_range_ratio)
        output_len = _length(rng, args.random_output_len, args.random_range_ratio)
        rows.append(DatasetRow([rng.randrange(100, 30000) for _ in range(input_len)], input_len, output_len))
    return rows
