"""How predictable a request's text is to a draft model, from its prompt alone.

A prompt token counts as predictable when it is a common English word or repeats a pair of tokens said
before; the share of such tokens raises the draft profile's acceptance rate. Why, and where it stops:
docs/design.md, "Draft predictability".
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

__all__ = ["COMMON_WORDS", "predictability", "request_accept_rate"]

# The most frequent English words (function words and the commonest verbs), lowercase.
COMMON_WORDS = frozenset(
    """the of and to a in is it you that he was for on are with as i his they be at one have this from or
    had by not but what some we can out other were all there when up use your how said an each she which do
    their time if will way about many then them would write like so these her long make thing see him two
    has look more day could go come did no most my over know than call first who may down side been now
    find any new work part take get place made live where after back little only round man year came show
    every good me give our under name very through just form much great think say help low line before turn
    cause same mean differ move right boy old too does tell set three want well also small end put home read
    hand large add even here must big high such why ask men went kind off need try us again point
    should""".split()
)


def _word(word: str) -> str:
    return word.strip(".,;:!?\"'()[]").lower()


def predictability(words: Sequence[str]) -> float:
    """The share of a text's `words` that are common words or repeat the pair they form with the last."""
    if not words:
        return 0.0
    seen: set[tuple[str, str]] = set()
    predictable = int(_word(words[0]) in COMMON_WORDS)
    for pair in itertools.pairwise(words):
        predictable += pair in seen or _word(pair[1]) in COMMON_WORDS
        seen.add(pair)
    return predictable / len(words)


def request_accept_rate(rate: float, predictability_: float) -> float:
    """The draft's per-token accept rate for one request: its miss chance shrunk by the predictability."""
    return 1.0 - (1.0 - rate) * (1.0 - predictability_)
