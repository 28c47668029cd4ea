"""The simulated radix cache: prefix reuse saves prefill, LRU eviction within the KV pool, the flag that turns
it off, the lpm schedule policy, chunked prefill of the uncached part only."""

from __future__ import annotations

import random

from autotune.sim.engine import Engine, Step
from autotune.sim.model import NodePerformanceModel
from autotune.sim.predict import settings_for
from autotune.sim.profiles import load_hardware_profile, load_model_profile
from autotune.sim.radix import PrefixCache, block_hashes


def _engine(*flags: str) -> Engine:
    # Llama 70B on 8 H200s: a 131,072-token context and a pool of over a million tokens.
    hardware, model = load_hardware_profile("h200-nvlink-x8"), load_model_profile("llama-70b-bf16")
    node = NodePerformanceModel(hardware, model, settings_for(["--tp-size", "8", *flags], {}))
    return node.new_engine()


def _ids(seed: int, count: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 30000) for _ in range(count)]


def _prefills(engine: Engine) -> list[Step]:
    """Run the engine dry; its prefill steps."""
    steps = []
    while engine.has_work:
        step = engine.step()
        if step.kind == "prefill":
            steps.append(step)
    return steps


def test_a_cached_prefix_is_not_prefilled_again() -> None:
    engine = _engine()
    context = _ids(1, 6008)
    engine.add("first", 6008, 4, tokens=context)
    (first,) = _prefills(engine)
    engine.add("turn2", 6508, 4, tokens=context + _ids(2, 500))
    (second,) = _prefills(engine)
    assert (first.new_seqs, first.new_tokens, first.cached_tokens) == (1, 6008, 0)
    # Whole 16-token blocks: 6008 // 16 * 16 = 6000 of the 6008 shared tokens.
    assert (second.new_seqs, second.new_tokens, second.cached_tokens) == (1, 508, 6000)
    assert engine.hits == {"first": 0, "turn2": 6000}
    assert second.duration_s < first.duration_s / 5


def test_disable_radix_cache_prefills_everything() -> None:
    engine = _engine("--disable-radix-cache")
    context = _ids(1, 6000)
    engine.add("first", 6000, 4, tokens=context)
    _prefills(engine)
    engine.add("turn2", 6500, 4, tokens=context + _ids(2, 500))
    (second,) = _prefills(engine)
    assert (second.new_tokens, second.cached_tokens) == (6500, 0)


def test_the_cache_keeps_at_most_what_the_pool_leaves() -> None:
    engine = _engine("--mem-fraction-static", "0.5")
    pool, size = engine.node.plan.kv_tokens, 100_000
    for index in range(pool // size + 2):  # distinct prompts adding up to more than the pool
        engine.add(f"r{index}", size, 1, tokens=_ids(index, size))
        _prefills(engine)
        assert engine.cache is not None and engine.cache.tokens <= pool
    # The oldest prompt went first: the newest is still served, the first is not.
    engine.add("again-last", size, 1, tokens=_ids(index, size))
    engine.add("again-first", size, 1, tokens=_ids(0, size))
    _prefills(engine)
    assert engine.hits["again-last"] > size - 16 and engine.hits["again-first"] == 0


def test_lru_evicts_leaves_first_and_spares_what_was_just_used() -> None:
    cache = PrefixCache(block=4)
    a, b = block_hashes(_ids(1, 40), 4), block_hashes(_ids(2, 40), 4)
    cache.insert(a)
    cache.insert(b)
    assert cache.match(a, 41) == 40  # touches a: b is now the least recently used
    cache.evict_to(60)  # room for 15 blocks of the 20
    assert cache.peek(b) == 5 and cache.peek(a) == 10  # b lost its last blocks, never its first
    cache.evict_to(20)
    assert cache.peek(b) == 0 and cache.peek(a) == 5
    assert cache.match(a, 10) == 9  # the last token is always computed, as SGLang does


def test_lpm_admits_the_longest_cached_prefix_first_and_fcfs_the_oldest() -> None:
    def first_admitted(policy: str) -> str:
        engine = _engine("--max-running-requests", "1", "--schedule-policy", policy)
        shared = _ids(1, 4000)
        engine.add("warm", 4000, 1, tokens=shared)
        _prefills(engine)
        engine.add("cold", 4000, 50, tokens=_ids(9, 4000))
        engine.add("hot", 4100, 50, tokens=shared + _ids(3, 100))
        engine.step()
        return engine.running[0].rid

    assert first_admitted("lpm") == "hot"
    assert first_admitted("fcfs") == "cold"


def test_chunked_prefill_chunks_only_the_uncached_part() -> None:
    engine = _engine("--chunked-prefill-size", "4096")
    context = _ids(1, 16_000)
    engine.add("first", 16_000, 1, tokens=context)
    assert len(_prefills(engine)) == 4  # 16,000 tokens in chunks of 4,096
    engine.add("turn2", 19_000, 1, tokens=context + _ids(2, 3000))
    steps = _prefills(engine)
    assert [s.new_tokens for s in steps] == [3000]  # one chunk: the cache served the 16,000 before


def test_lpm_holds_a_request_whose_prefix_another_is_computing_and_fcfs_computes_it_twice() -> None:
    def cached_of_the_second(policy: str) -> int:
        engine = _engine("--schedule-policy", policy)
        system = _ids(1, 3000)  # two prompts behind one system prompt nothing has cached yet
        engine.add("a", 3100, 1, tokens=system + _ids(2, 100))
        engine.add("b", 3100, 1, tokens=system + _ids(3, 100))
        steps = _prefills(engine)
        return sum(s.cached_tokens for s in steps)

    # fcfs prefills both at once, each computing the system prompt; lpm holds b until a's is cached.
    assert cached_of_the_second("fcfs") == 0
    assert cached_of_the_second("lpm") == 3000 // 16 * 16
