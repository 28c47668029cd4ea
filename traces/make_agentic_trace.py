"""Write traces/agentic-sessions.jsonl: a small synthetic trace of agentic coding sessions, made here.

Mooncake's trace fields (`timestamp` ms, `input_length`, `output_length`, `hash_ids` of 512-token blocks,
equal ids meaning equal blocks) plus `session_id`. Every session opens with the same tool definitions
(SHARED_BLOCKS blocks, the fleet's shared system prompt), then its own repository context; each later turn
re-sends the whole context, the previous answer and a tool result, so its hash_ids start with the previous
turn's. Sessions start as a Poisson process; turns follow after a think time. Deterministic:

    python traces/make_agentic_trace.py            # rewrites traces/agentic-sessions.jsonl
"""

from __future__ import annotations

import json
import random
from pathlib import Path

BLOCK = 512
SESSIONS = 12
SHARED_BLOCKS = 4  # 2,048 tokens of tool definitions every session sends first
SESSION_GAP_S = 4.0  # mean gap between session starts
THINK_S = (2.0, 8.0)  # a tool call's time between an answer and the next turn


def make(seed: int = 40) -> list[dict[str, object]]:
    rng = random.Random(seed)
    next_id = SHARED_BLOCKS
    rows: list[dict[str, object]] = []
    start = 0.0
    for session in range(SESSIONS):
        start += rng.expovariate(1 / SESSION_GAP_S)
        own = rng.randint(6, 14)  # the repository context: 3k to 7k tokens
        ids = list(range(SHARED_BLOCKS)) + list(range(next_id, next_id + own))
        next_id += own
        now = start
        for _turn in range(rng.randint(3, 6)):
            output = rng.randint(128, 512)
            tail = rng.randint(1, BLOCK - 1)  # the last block is partial: its tokens are this turn's own
            rows.append(
                {
                    "timestamp": round(now * 1000),
                    "input_length": len(ids) * BLOCK + tail,
                    "output_length": output,
                    "hash_ids": [*ids, next_id],
                    "session_id": f"s{session:02d}",
                }
            )
            # The next turn: this prompt, its answer and a tool result, in whole new blocks.
            grow = 1 + (tail + output + rng.randint(200, 1200)) // BLOCK
            ids = [*ids, *range(next_id, next_id + grow)]
            next_id += grow
            now += rng.uniform(*THINK_S) + 1.0  # the answer itself takes about a second
    rows.sort(key=lambda row: (row["timestamp"], str(row["session_id"])))
    return rows


if __name__ == "__main__":
    out = Path(__file__).with_name("agentic-sessions.jsonl")
    out.write_text("".join(json.dumps(row) + "\n" for row in make()), encoding="utf-8")
    print(f"wrote {out}")
