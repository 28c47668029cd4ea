"""sglang.benchmark.utils: the tokenizer auto_benchmark asks for. Prompts here are token ids (SGLang's
`random` dataset as ids), so no tokenizer is ever used."""

from __future__ import annotations


def get_tokenizer(path: str) -> None:
    """No tokenizer: the simulated node counts token ids, and no Hugging Face download is possible."""
    return None
