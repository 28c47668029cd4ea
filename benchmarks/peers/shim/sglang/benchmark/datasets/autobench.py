"""sglang.benchmark.datasets.autobench: auto_benchmark's prepared-dataset JSONL, one request a line."""

from __future__ import annotations

import json
from typing import Any

from sglang.benchmark.datasets import DatasetRow


def serialize_dataset_row_to_autobench(
    row: DatasetRow, metadata: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A row as a JSONL record (the prompt, its length, the output length, where it came from)."""
    return {
        "prompt": row.prompt,
        "prompt_len": row.prompt_len,
        "output_len": row.output_len,
        **(metadata or {}),
    }


def sample_autobench_requests(
    dataset_path: str, num_requests: int, tokenizer: Any = None, fixed_output_len: int | None = None
) -> list[DatasetRow]:
    """The rows of a prepared dataset (all of them when `num_requests` is 0)."""
    rows = []
    with open(dataset_path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                output_len = fixed_output_len or int(record["output_len"])
                rows.append(DatasetRow(record["prompt"], int(record["prompt_len"]), output_len))
    return rows[:num_requests] if num_requests else rows
