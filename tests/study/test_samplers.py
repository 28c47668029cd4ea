"""The default sampler's start (each knob at the server's own value with `keep_default`), then TPE that
steers clear of configs that broke a constraint, mixed with moves from the best trial and repairs of
configs that ran out of memory capturing CUDA graphs."""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import create_trial

from autotune.cli.answers import _status_notes, _trial_record
from autotune.config.objective import InFlight
from autotune.config.study import SAMPLER_NAMES, SamplerSpec
from autotune.study.records import (
    ACCEPT_LENGTH_ATTR,
    BASELINE_ATTR,
    PROPOSED_ATTR,
    REMEASURE_OF_ATTR,
    SERVER_CHOICES_ATTR,
    SERVER_MEMORY_ATTR,
)
from autotune.study.rules import best_trial
from autotune.study.samplers import (
    MAX_RUNNING,
    NEAR_STEPS,
    SAMPLERS,
    START_TRIALS,
    DefaultsStartSampler,
    FeasibleTPESampler,
    IncumbentMoves,
    WithoutBaseline,
    adaptive_steps,
    build,
    fraction_floor,
    nearest,
    tpe,
)
from autotune.trial.failures import Failure, FailureKind

MEM = "--mem-fraction-static"


def suggest(trial: optuna.Trial) -> tuple[float, object]:
    return trial.suggest_float(MEM, 0.70, 0.95, step=0.01), trial.suggest_categorical(
        "NCCL_ALGO", [None, "Ring"]
    )


def start_sampler(keep: float, n_startup_trials: int = 1000) -> DefaultsStartSampler:
    base = optuna.samplers.RandomSampler(seed=1)
    return DefaultsStartSampler(base, n_startup_trials=n_startup_trials, keep_default=keep, seed=3)


def run(study: optuna.Study, n: int) -> list[tuple[float, object]]:
    values = []
    for _ in range(n):
        trial = study.ask()
        values.append(suggest(trial))
        study.tell(trial, 1.0)
    return values


def near(value: float, chosen: float = 0.85) -> bool:
    """Within two steps of 0.01 of the server's choice on its step (NEAR_STEPS)."""
    return abs(value - chosen) <= NEAR_STEPS * 0.01 + 1e-9


def test_a_range_without_an_unset_value_starts_near_the_servers_own_choice() -> None:
    study = optuna.create_study(direction="maximize", sampler=start_sampler(keep=1.0))
    study.set_user_attr(SERVER_CHOICES_ATTR, {MEM: 0.8467})  # what SGLang logged for the baseline
    values = run(study, 40)
    assert all(near(mem) and algo is None for mem, algo in values)
    # Not always the same value: a start trial that changes nothing else would repeat another.
    assert {round(mem, 2) for mem, _ in values} == {0.83, 0.84, 0.85, 0.86, 0.87}


def test_without_a_recorded_choice_the_range_is_sampled() -> None:
    study = optuna.create_study(direction="maximize", sampler=start_sampler(keep=1.0))
    values = run(study, 20)
    assert {algo for _, algo in values} == {None}  # the unset value is kept
    assert len({mem for mem, _ in values}) > 5


def test_each_knob_keeps_its_default_about_keep_default_of_the_time() -> None:
    study = optuna.create_study(direction="maximize", sampler=start_sampler(keep=0.8))
    study.set_user_attr(SERVER_CHOICES_ATTR, {MEM: 0.85})
    values = run(study, 300)
    kept_algo = sum(algo is None for _, algo in values) / len(values)
    # Not kept, a value is drawn at random, which is the default itself some of the time.
    assert 0.8 < kept_algo < 0.97
    # A range the server chose has no "unset" to keep: every start trial stays near the server's choice
    # (a random memory fraction is the start's most common out-of-memory launch).
    assert all(near(mem) for mem, _ in values)


def test_after_the_start_the_base_sampler_decides() -> None:
    study = optuna.create_study(direction="maximize", sampler=start_sampler(keep=1.0, n_startup_trials=3))
    study.set_user_attr(SERVER_CHOICES_ATTR, {MEM: 0.85})
    values = run(study, 23)
    assert all(near(mem) and algo is None for mem, algo in values[:3])
    assert len({mem for mem, _ in values[3:]}) > 5 and {algo for _, algo in values[3:]} == {None, "Ring"}


@pytest.mark.parametrize(
    ("distribution", "value", "expected"),
    [
        (FloatDistribution(0.70, 0.95, step=0.01), 0.8467, 0.85),
        (FloatDistribution(0.70, 0.95, step=0.01), 0.60, 0.70),
        (FloatDistribution(0.5, 0.9), 0.8467, 0.8467),
        (IntDistribution(16, 512, step=16), 250, 256),
        (CategoricalDistribution([None, 32, 64, 128, 256]), 160, 128),
    ],
)
def test_nearest_value_of_a_distribution(distribution: object, value: float, expected: object) -> None:
    assert nearest(distribution, value) == pytest.approx(expected)  # type: ignore[arg-type]


def infeasible_proposals(feasibility_weight: float, seed: int) -> tuple[int, float]:
    """Trials after TPE's start that landed past a memory limit (x + y > 1.2, told as the driver tells an
    out-of-memory launch: pruned, constraint broken), and the best feasible x + y found in 40 trials."""
    sampler = FeasibleTPESampler(
        seed=seed, n_startup_trials=10, multivariate=True, feasibility_weight=feasibility_weight
    )
    study = optuna.create_study(direction="maximize", sampler=sampler)
    infeasible, best = 0, 0.0
    for number in range(40):
        trial = study.ask()
        total = trial.suggest_float("x", 0, 1) + trial.suggest_float("y", 0, 1)
        if total > 1.2:
            trial.set_constraint("memory", 1.0)
            trial.report(0.0, 0)
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            infeasible += number >= 10
        else:
            trial.set_constraint("memory", 0.0)
            study.tell(trial, total)
            best = max(best, total)
    return infeasible, best


def test_tpe_with_the_feasibility_term_proposes_fewer_configs_past_the_limit_and_finds_as_good() -> None:
    plain = [infeasible_proposals(0.0, seed) for seed in range(8)]
    feasible = [infeasible_proposals(1.0, seed) for seed in range(8)]
    # Measured: 85 past the limit without the term, 30 with it (seeds 0-7); best x + y 1.18 both ways.
    assert sum(n for n, _ in feasible) <= sum(n for n, _ in plain) / 2
    assert min(best for _, best in feasible) >= 1.1


def test_the_default_sampler_moves_from_the_best_trial_and_weighs_feasibility_after_its_start() -> None:
    sampler = tpe(seed=0)
    assert isinstance(sampler, IncumbentMoves) and sampler.share == 0.8
    start = sampler.base
    assert isinstance(start, DefaultsStartSampler)
    assert isinstance(start.base, FeasibleTPESampler) and start.base.feasibility_weight == 1.0


GRAPH_BS, ALGO = "--cuda-graph-max-bs-decode", "--speculative-algorithm"


def ask_launch(study: optuna.Study) -> optuna.Trial:
    trial = study.ask()
    trial.suggest_categorical(ALGO, [None, "EAGLE3"])
    trial.suggest_categorical(GRAPH_BS, [None, 32, 64, 128])
    return trial


def tell_failed(study: optuna.Study, trial: optuna.Trial, kind: str, server_bs: int | None = None) -> None:
    """As the driver tells a launch that failed with `kind` (an OOM: pruned, constraint broken)."""
    trial.set_user_attr("failure_kind", kind)
    if server_bs is not None:
        trial.set_user_attr(SERVER_CHOICES_ATTR, {GRAPH_BS: float(server_bs)})
    trial.set_constraint("memory", 1.0)
    study.tell(trial, state=optuna.trial.TrialState.PRUNED)


def repairs_study() -> optuna.Study:
    sampler = IncumbentMoves(optuna.samplers.RandomSampler(seed=0), share=0.0, seed=0)
    return optuna.create_study(direction="maximize", sampler=sampler)


def test_a_config_that_ran_out_of_memory_capturing_graphs_runs_again_with_the_smallest_graph_batch() -> None:
    study = repairs_study()
    study.enqueue_trial({ALGO: "EAGLE3", GRAPH_BS: 128})
    tell_failed(study, ask_launch(study), "cuda_graph_oom")
    repair = ask_launch(study)
    assert repair.params == {ALGO: "EAGLE3", GRAPH_BS: 32}
    tell_failed(study, repair, "cuda_graph_oom")
    # `autotune status` says why the trial ran.
    why = "a repair of trial 0 (cuda_graph_oom): --cuda-graph-max-bs-decode 32"
    assert study.trials[1].system_attrs[PROPOSED_ATTR] == why
    assert why in _status_notes(_trial_record(study.trials[1]))
    # Nothing smaller than 32 to try, and the repair of the first failure already ran: no repair.
    assert all(ask_launch(study).params != {ALGO: "EAGLE3", GRAPH_BS: 32} for _ in range(3))


def test_an_unset_graph_batch_is_repaired_below_the_value_the_server_chose() -> None:
    study = repairs_study()
    study.enqueue_trial({ALGO: "EAGLE3", GRAPH_BS: None})
    tell_failed(study, ask_launch(study), "cuda_graph_oom", server_bs=512)
    assert ask_launch(study).params == {ALGO: "EAGLE3", GRAPH_BS: 32}


def test_a_prefill_graph_oom_is_repaired_with_the_prefill_knob_not_the_decode_one() -> None:
    prefill = "--cuda-graph-max-bs-prefill"
    study = repairs_study()
    study.enqueue_trial({GRAPH_BS: 128, prefill: None})
    trial = study.ask()
    trial.suggest_categorical(GRAPH_BS, [None, 32, 64, 128])
    trial.suggest_categorical(prefill, [None, 4, 8, 16])
    trial.set_user_attr(SERVER_CHOICES_ATTR, {GRAPH_BS: 128.0, prefill: 16.0})  # as the server logged it
    tell_failed(study, trial, "prefill_graph_oom")
    repair = study.ask()
    assert repair.suggest_categorical(GRAPH_BS, [None, 32, 64, 128]) == 128
    assert repair.suggest_categorical(prefill, [None, 4, 8, 16]) == 4
    assert study.trials[repair.number].system_attrs[PROPOSED_ATTR] == (
        "a repair of trial 0 (prefill_graph_oom): --cuda-graph-max-bs-prefill 4"
    )


@pytest.mark.parametrize("kind", ["kernel_build_failed", "invalid_arguments", "unknown_crash"])
def test_a_capture_failure_that_is_not_an_oom_is_not_repaired(kind: str) -> None:
    study = repairs_study()
    study.enqueue_trial({ALGO: "EAGLE3", GRAPH_BS: 128})
    tell_failed(study, ask_launch(study), kind)
    for _ in range(5):
        asked = ask_launch(study)
        assert PROPOSED_ATTR not in study.trials[asked.number].system_attrs


def test_a_failure_that_a_smaller_graph_batch_does_not_cure_is_not_repaired() -> None:
    study = repairs_study()
    study.enqueue_trial({ALGO: "EAGLE3", GRAPH_BS: 128})
    tell_failed(study, ask_launch(study), "kv_pool_too_small")  # needs a larger fraction, not a smaller batch
    # A random sampler over 8 configs proposes the repaired one 1 time in 8: never 20 times in a row.
    assert any(ask_launch(study).params != {ALGO: "EAGLE3", GRAPH_BS: 32} for _ in range(20))


def test_a_move_changes_one_or_two_knobs_of_the_best_trial() -> None:
    sampler = IncumbentMoves(optuna.samplers.RandomSampler(seed=0), n_startup_trials=3, share=1.0, seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    names = [f"k{i}" for i in range(6)]

    def ask() -> optuna.Trial:
        trial = study.ask()
        for name in names:
            trial.suggest_categorical(name, [None, 1, 2, 4])
        return trial

    for value in (0.5, 0.9, 0.7):  # the start: the second trial is the best
        study.tell(ask(), value)
    best = study.trials[1].params
    changed = []
    for _ in range(20):
        trial = ask()
        changed.append(sum(trial.params[n] != best[n] for n in names))
        study.tell(trial, 0.1)  # worse: the best stays, and every move starts from it
    assert set(changed) <= {1, 2} and changed.count(1) > changed.count(2) > 0
    for trial in study.trials[3:]:
        moved = [n for n in names if trial.params[n] != best[n]]
        why = f"a move from trial 1, the best so far: {', '.join(moved)} changed"
        assert trial.system_attrs[PROPOSED_ATTR] == why
    assert len({tuple(t.params.values()) for t in study.trials}) == len(study.trials)  # none repeated


def test_the_default_sampler_takes_the_share_of_two_knob_moves() -> None:
    # tpe(second=...) reaches IncumbentMoves: at 0 every move changes one knob (benchmarks/trust.py's
    # `one-knob` measures it against the default 0.3).
    names = [f"k{i}" for i in range(6)]
    changed = {}
    for second in (0.0, 1.0):
        study = optuna.create_study(
            direction="maximize", sampler=tpe(0, n_startup_trials=3, moves=1.0, second=second)
        )
        for value in (0.5, 0.9, 0.7, *[0.1] * 12):  # the start, then moves from its best, none better
            trial = study.ask()
            for name in names:
                trial.suggest_categorical(name, [None, 1, 2, 4])
            study.tell(trial, value)
        best = study.trials[1].params
        changed[second] = {sum(t.params[n] != best[n] for n in names) for t in study.trials[3:]}
    assert changed == {0.0: {1}, 1.0: {2}}


def test_a_move_that_switches_a_branch_off_does_not_repeat_the_config_it_came_from() -> None:
    # The best trial is the one before it with EAGLE-3 switched on; switching it off again, its tree is not
    # asked, so the move would be that earlier trial once more.
    sampler = IncumbentMoves(optuna.samplers.RandomSampler(seed=0), n_startup_trials=2, share=1.0, seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)

    def ask() -> optuna.Trial:
        trial = study.ask()
        if trial.suggest_categorical(ALGO, [None, "EAGLE3"]) == "EAGLE3":
            trial.suggest_int("--speculative-num-steps", 1, 3)
        trial.suggest_categorical(GRAPH_BS, [32, 64])
        return trial

    study.enqueue_trial({ALGO: None, GRAPH_BS: 32})
    study.enqueue_trial({ALGO: "EAGLE3", GRAPH_BS: 32, "--speculative-num-steps": 2})
    study.tell(ask(), 0.5)
    study.tell(ask(), 0.9)
    for _ in range(5):  # 5 of the 7 configs not tried yet
        study.tell(ask(), 0.1)
    configs = [tuple(sorted(t.params.items(), key=str)) for t in study.trials]
    assert len(set(configs)) == len(configs), configs


def test_a_move_leaves_a_knob_the_study_holds_alone() -> None:
    # autotune.study.incompatible holds a flag with one value left that the hardware runs; a move that
    # changed it would be undone by the holding, and the trial would repeat the config the move started from.
    sampler = IncumbentMoves(optuna.samplers.RandomSampler(seed=0), n_startup_trials=1, share=1.0, seed=0)
    sampler.held = {"k0": None}
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.enqueue_trial({f"k{i}": None for i in range(3)})
    for value in (0.9, 0.1, 0.1, 0.1, 0.1, 0.1):
        trial = study.ask()
        for i in range(3):
            trial.suggest_categorical(f"k{i}", [None, 1, 2, 4])
        study.tell(trial, value)
    assert [t.params["k0"] for t in study.trials] == [None] * 6
    assert all(t.params != study.trials[0].params for t in study.trials[1:])


def test_the_incompatibility_memory_tells_the_default_sampler_what_it_holds(tmp_path: Path) -> None:
    from autotune.config import load_search_space
    from autotune.study.incompatible import KnownIncompatibilities

    space = tmp_path / "space.yaml"
    space.write_text(
        "parameters:\n  --enable-torch-symm-mem: {kind: sglang, type: bool}\n"
        "  NCCL_ALGO: {kind: nccl, type: categorical, choices: [null, Ring]}\n"
    )
    study = optuna.create_study(direction="maximize")
    known = KnownIncompatibilities(study, load_search_space(space))
    sampler = tpe(seed=0)
    assert isinstance(sampler, IncumbentMoves)
    known.sampler(sampler, {"gpu"})
    assert sampler.held == {}
    failure = Failure.of(
        FailureKind.UNSUPPORTED, "SM120 is not supported", "unsupported", ("--enable-torch-symm-mem",)
    )
    assert known.learn({"--enable-torch-symm-mem": True, "NCCL_ALGO": None}, failure, "gpu")
    known.sampler(sampler, {"gpu"})
    assert sampler.held == {"--enable-torch-symm-mem": False}


def test_a_rejected_argument_is_remembered_by_the_flag_sglang_names(tmp_path: Path) -> None:
    from autotune.config import load_search_space
    from autotune.study.incompatible import KnownIncompatibilities
    from autotune.trial.failures import classify

    space = tmp_path / "space.yaml"
    space.write_text(
        "parameters:\n  --attention-backend: {kind: sglang, type: categorical, choices: [null, flash, fa3]}\n"
        "  --disable-custom-all-reduce: {kind: sglang, type: bool}\n"
    )
    known = KnownIncompatibilities(optuna.create_study(direction="maximize"), load_search_space(space))
    # Real 0.5.17 (argparse, exit 2): a choice this version does not have.
    failure = classify(
        "sglang serve: error: argument --attention-backend: invalid choice: 'flash' (choose from 'triton', "
        "'fa3')\n",
        "starting",
    )
    assert (
        failure is not None and failure.kind is FailureKind.INVALID_ARGUMENTS and failure.kind.deterministic
    )
    params = {"--attention-backend": "flash", "--disable-custom-all-reduce": True}
    assert known.learn(params, failure, "gpu") == [("--attention-backend", "flash", "gpu")]
    assert known.blocking(params, "gpu") == ("--attention-backend", "flash", "gpu")
    assert (
        known.blocking({**params, "--attention-backend": "fa3"}, "gpu") is None
    )  # only the named flag is blamed


def best_of_toy(moves: float, seed: int) -> float:
    """The best of 30 trials on a landscape that is a product of one factor per knob, like the simulated
    node's without its interactions: 10 knobs of 4 values, each with one best value."""
    rng = random.Random(42)
    best_values = [rng.choice([1, 2, 4]) for _ in range(10)]
    factors = [
        {c: 1.0 if c == best else rng.uniform(0.8, 0.97) for c in (None, 1, 2, 4)} for best in best_values
    ]
    # A start of 10, as measured below: after the default start of 2, TPE alone climbs it as well (0.779
    # against 0.780 with moves, seeds 0-7); the moves' worth on the simulated nodes: benchmarks/RESULTS.md.
    study = optuna.create_study(direction="maximize", sampler=tpe(seed, moves=moves, n_startup_trials=10))
    for _ in range(30):
        trial = study.ask()
        value = 1.0
        for i, factor in enumerate(factors):
            value *= factor[trial.suggest_categorical(f"k{i}", [None, 1, 2, 4])]
        study.tell(trial, value)
    return study.best_value


def test_moves_from_the_best_trial_climb_a_landscape_of_one_factor_per_knob() -> None:
    without = statistics.median(best_of_toy(0.0, seed) for seed in range(8))
    moves = statistics.median(best_of_toy(0.8, seed) for seed in range(8))
    # Measured: 0.664 without moves, 0.752 with them (seeds 0-7).
    assert moves >= without + 0.05


def test_a_sampler_of_the_trials_common_parameters_does_not_see_the_baseline() -> None:
    # GPSampler searches the intersection of every trial's parameters; the baseline sets none.
    def study_with_a_baseline(sampler: optuna.samplers.BaseSampler) -> optuna.Study:
        study = optuna.create_study(direction="maximize", sampler=sampler)
        study.tell(study.ask(), 1.0)  # the baseline: SGLang's defaults, no parameters
        for _ in range(3):
            trial = study.ask()
            study.tell(trial, trial.suggest_float("x", 0, 1) + trial.suggest_float("y", 0, 1))
        return study

    def space(sampler: optuna.samplers.BaseSampler) -> set[str]:
        study = study_with_a_baseline(sampler)
        return set(sampler.infer_relative_search_space(study, study.trials[-1]))

    plain = optuna.samplers.TPESampler(seed=0, multivariate=True, n_startup_trials=1)
    assert space(plain) == set()
    wrapped = WithoutBaseline(optuna.samplers.TPESampler(seed=0, multivariate=True, n_startup_trials=1))
    assert space(wrapped) == {"x", "y"}


# SGLang 0.5.17, srt/mem_cache/kv_cache_configurator.py:1646-1655, as printed on an H200
# (shared/device-kit/README.md, "Real failure lines").
KV_POOL_LINE = (
    "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.01. "
    "Raise --mem-fraction-static above 0.016 (minimum viable = 1 - available/pre = 0.0154). "
    "If using speculative decoding, draft weights are now counted."
)


def kv_pool_failure(fraction: float, line: str) -> optuna.trial.FrozenTrial:
    return optuna.trial.create_trial(
        params={MEM: fraction},
        distributions={MEM: FloatDistribution(0.0, 0.95, step=0.01)},
        state=optuna.trial.TrialState.PRUNED,
        user_attrs={"failure_kind": "kv_pool_too_small", "failure": line},
    )


def test_the_memory_fraction_floor_is_the_minimum_the_servers_message_names_on_the_next_step() -> None:
    steps = FloatDistribution(0.0, 0.95, step=0.01)
    assert fraction_floor([kv_pool_failure(0.01, KV_POOL_LINE)], steps) == 0.02  # above 0.016
    # The residual line names no minimum (0.5.17 srt/model_executor/pool_configurator.py:62-67): a step above.
    older = (
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
        "Current value: mem_fraction_static=0.8"
    )
    assert fraction_floor([kv_pool_failure(0.80, older)], steps) == 0.81
    assert fraction_floor([kv_pool_failure(0.80, older), kv_pool_failure(0.01, KV_POOL_LINE)], steps) == 0.81
    assert fraction_floor([], steps) is None
    # A prompt longer than the pool is kv_pool_too_small too, while serving; it says nothing of the
    # fraction (0.5.17 managers/utils.py).
    too_long = (
        "Input length (9000 tokens) exceeds the maximum allowed length (8191 tokens). Use a shorter input "
        "or enable --allow-auto-truncate."
    )
    assert fraction_floor([kv_pool_failure(0.80, too_long)], steps) is None


def test_no_proposal_goes_below_the_fraction_the_server_said_it_needs() -> None:
    sampler = IncumbentMoves(optuna.samplers.RandomSampler(seed=0), n_startup_trials=1000, seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    line = KV_POOL_LINE.replace("0.01.", "0.84.").replace("0.016", "0.873").replace("0.0154", "0.8726")
    study.add_trial(kv_pool_failure(0.84, line))
    proposed = []
    for _ in range(30):
        trial = study.ask()
        proposed.append(trial.suggest_float(MEM, 0.0, 0.95, step=0.01))
        study.tell(trial, 1.0)
    assert min(proposed) == pytest.approx(0.88) and len(set(proposed)) > 3


SPEC_STEPS, SPEC_TOPK = "--speculative-num-steps", "--speculative-eagle-topk"
SPEC_DRAFT = "--speculative-num-draft-tokens"


def ask_branch(study: optuna.Study) -> optuna.Trial:
    trial = study.ask()
    trial.suggest_categorical("NCCL_ALGO", [None, "Ring", "Tree"])
    if trial.suggest_categorical(ALGO, [None, "EAGLE3"]) == "EAGLE3":
        steps = trial.suggest_int(SPEC_STEPS, 1, 6)
        topk = trial.suggest_categorical(SPEC_TOPK, [1, 2, 4, 8])
        if topk > 1:  # as the search space narrows it (SpeculativeRules.decide)
            trial.suggest_int(SPEC_DRAFT, 2, min(16, steps * topk**2))
    return trial


def tree(trial: optuna.trial.FrozenTrial) -> tuple[object, ...]:
    return tuple(trial.params.get(n) for n in (SPEC_STEPS, SPEC_TOPK, SPEC_DRAFT))


def test_speculation_gets_its_trees_on_purpose_right_after_the_start() -> None:
    sampler = IncumbentMoves(optuna.samplers.RandomSampler(seed=0), n_startup_trials=3, share=0.0, seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for algo in ("Ring", "Tree", None):  # a start that never switched speculation on
        study.enqueue_trial({"NCCL_ALGO": algo, ALGO: None})
    for value in (0.5, 0.9, 0.7):
        study.tell(ask_branch(study), value)
    first = ask_branch(study)
    # The best trial's other knobs, EAGLE-3 on, SGLang's documented tree (steps 5, top-k 4, 8 draft tokens).
    assert first.params == {"NCCL_ALGO": "Tree", ALGO: "EAGLE3", SPEC_STEPS: 5, SPEC_TOPK: 4, SPEC_DRAFT: 8}
    assert "SGLang's documented tree" in study.trials[3].system_attrs[PROPOSED_ATTR]
    first.set_user_attr(ACCEPT_LENGTH_ATTR, 3.4)  # as the study loop records the server's figure
    study.tell(first, 0.8)
    chain = ask_branch(study)
    # The chain SGLang's adaptive mode runs, at the steps it keeps for that accept length: round(3.4) = 3.
    assert chain.params == {"NCCL_ALGO": "Tree", ALGO: "EAGLE3", SPEC_STEPS: 3, SPEC_TOPK: 1}
    study.tell(chain, 0.85)  # the best now: the next tree is planned on its other knobs
    wider = ask_branch(study)
    assert tree(study.trials[wider.number]) == (5, 4, 16)  # bench_speculative.py's next draft tokens
    assert "twice the draft tokens" in study.trials[wider.number].system_attrs[PROPOSED_ATTR]
    study.tell(wider, 0.6)
    for _ in range(3):  # the branch is explored: the base decides
        trial = ask_branch(study)
        study.tell(trial, 0.1)
        assert PROPOSED_ATTR not in study.trials[trial.number].system_attrs


CUSTOM_OFF, SYMM = "--disable-custom-all-reduce", "--enable-torch-symm-mem"
FUSION = "--enable-flashinfer-allreduce-fusion"


def ask_paths(study: optuna.Study) -> optuna.Trial:
    """`ask_branch`'s knobs and the all-reduce path's flags."""
    trial = ask_branch(study)
    for flag in (CUSTOM_OFF, SYMM, FUSION):
        trial.suggest_categorical(flag, [False, True])
    return trial


def paths_study(**kwargs: object) -> optuna.Study:
    sampler = IncumbentMoves(optuna.samplers.RandomSampler(seed=0), n_startup_trials=3, share=0.0, seed=0)
    sampler.held = kwargs
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.enqueue_trial({})  # the baseline: no knob set, SGLang's defaults (speculation off)
    for algo in ("Ring", "Tree"):
        study.enqueue_trial({"NCCL_ALGO": algo, ALGO: None, CUSTOM_OFF: False, SYMM: False, FUSION: False})
    study.tell(study.ask(), 0.5)
    for value in (0.9, 0.7):
        study.tell(ask_paths(study), value)
    return study


def test_the_all_reduce_path_runs_as_one_move_in_turn_with_the_speculative_trees() -> None:
    # SGLang's custom all-reduce takes every small all-reduce first: torch symmetric memory alone reaches only
    # the large ones, the custom kernel off alone hands the small ones to NCCL. The path's steps come in turn
    # with the speculative trees, each on the best so far.
    study = paths_study()
    planned = []
    for value in (0.8, 0.95, 0.85, 0.97, 0.6):
        trial = ask_paths(study)
        study.tell(trial, value)
        planned.append(study.trials[trial.number])
    whys = [str(t.system_attrs[PROPOSED_ATTR]) for t in planned]
    assert [w.split(":")[0] for w in whys] == [
        f"exploring {ALGO} EAGLE3",
        "exploring the all-reduce path",
        f"exploring {ALGO} EAGLE3",
        "exploring the all-reduce path",
        f"exploring {ALGO} EAGLE3",
    ], whys
    paths = [{f: t.params[f] for f in (CUSTOM_OFF, SYMM, FUSION)} for t in planned]
    # The path's first step, on trial 1's knobs (the documented tree lost to it): the custom kernel off and
    # torch's on, together.
    assert paths[1] == {CUSTOM_OFF: True, SYMM: True, FUSION: False}
    assert planned[1].params["NCCL_ALGO"] == "Ring" and planned[1].params[ALGO] is None
    # The chain is planned on trial 4, the best now, and keeps its path; the path's next step adds the fusion.
    assert paths[2] == paths[1] and planned[2].params[SPEC_TOPK] == 1
    assert paths[3] == {CUSTOM_OFF: True, SYMM: True, FUSION: True}
    assert "FlashInfer's all-reduce fusion, from trial 4" in whys[3], whys[3]
    assert paths[4] == paths[3] and tree(planned[4]) == (5, 4, 16)  # on trial 6, the best now
    # The baseline counts as a trial without speculation: with it, three ran, so no "speculation off" trial.
    assert not any("off:" in w for w in whys)
    trial = ask_paths(study)  # both branches explored: the base decides
    assert PROPOSED_ATTR not in study.trials[trial.number].system_attrs


def test_the_all_reduce_path_is_left_alone_where_the_study_holds_one_of_its_flags() -> None:
    # On a GPU that ignores torch symmetric memory (SM120: the study holds it off), neither step runs.
    study = paths_study(**{SYMM: False})
    for _ in range(5):
        trial = ask_paths(study)
        study.tell(trial, 0.5)
        assert not str(study.trials[trial.number].system_attrs.get(PROPOSED_ATTR, "")).startswith(
            "exploring the all-reduce path"
        )


@pytest.mark.parametrize("staged", [None, "Ring"])
def test_where_the_baseline_leads_the_branches_move_from_the_defaults_not_the_proposal_that_lost(
    staged: str | None,
) -> None:
    # The H200 under a budget: the start's one proposal capped running requests at 16 (0.67 of the defaults);
    # moved from, it would hand that cap to every branch trial. The defaults lead: the branch moves from them,
    # a range at SGLang's own choice in the baseline. With an NCCL value the stage holds (`staged`), the
    # defaults with it are the baseline still: no "speculation off" trial runs them again.
    sampler = IncumbentMoves(optuna.samplers.RandomSampler(seed=0), n_startup_trials=2, share=0.0, seed=0)
    sampler.staged = {"NCCL_ALGO": staged} if staged else {}
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.set_user_attr(SERVER_CHOICES_ATTR, {MEM: 0.874})  # what SGLang logged for the baseline

    def ask() -> optuna.Trial:
        trial = ask_branch(study)
        trial.suggest_float(MEM, 0.70, 0.95, step=0.01)
        return trial

    baseline = study.ask()  # no knob set: SGLang's defaults
    baseline.set_user_attr(BASELINE_ATTR, True)
    study.tell(baseline, 0.6)
    study.enqueue_trial({"NCCL_ALGO": "Ring", ALGO: None, MEM: 0.80})
    study.tell(ask(), 0.4)
    first = ask()
    tree = {ALGO: "EAGLE3", SPEC_STEPS: 5, SPEC_TOPK: 4, SPEC_DRAFT: 8}
    assert first.params == {"NCCL_ALGO": staged, **tree, MEM: 0.87}
    assert "trial 0 with SGLang's documented tree" in study.trials[first.number].system_attrs[PROPOSED_ATTR]
    study.tell(first, 0.5)
    # Speculation off on the defaults is the baseline again: not planned; the chain comes next.
    chain = ask()
    assert chain.params[SPEC_TOPK] == 1 and chain.params["NCCL_ALGO"] == staged
    # Once a trial that set knobs leads, the moves start from it, as before.
    study.tell(chain, 0.9)
    trial = ask()
    study.tell(trial, 0.1)
    assert study.trials[trial.number].system_attrs[PROPOSED_ATTR] == (
        f"exploring {ALGO} off: trial {chain.number} without it"
    )


def test_a_branch_tree_after_one_whose_kv_pool_ran_short_runs_at_the_fraction_that_holds_it() -> None:
    # The seed's node: the best (no draft model) at 0.86; the first EAGLE-3 tree there held 105,675 of the
    # 116,000 tokens in flight (its draft took the room), so it lost to the best on memory. The branch's
    # tree runs at 0.87, as the line search raises a short best's; with no short trial, at 0.86.
    def branch_study(held: int, edge: bool = False) -> optuna.Study:
        sampler = IncumbentMoves(optuna.samplers.RandomSampler(seed=0), n_startup_trials=2, share=0.0, seed=0)
        sampler.in_flight = lambda _params: InFlight(4, 29_000)
        study = optuna.create_study(direction="maximize", sampler=sampler)
        memory = {"weights_gb": 60.0, "kv_cache_gb": held * 4.5e-6, "kv_cache_tokens": float(held)}
        fraction = FloatDistribution(0.80, 0.95, step=0.01)
        first = {ALGO: None, MEM: 0.86}
        spec = {ALGO: "EAGLE3", SPEC_STEPS: 5, SPEC_TOPK: 4, SPEC_DRAFT: 8, MEM: 0.86}
        for params, value, attrs in ((first, 700.0, {}), (spec, 690.0, {SERVER_MEMORY_ATTR: memory})):
            dists = {n: fraction if n == MEM else CategoricalDistribution([v]) for n, v in params.items()}
            dists[ALGO] = CategoricalDistribution([None, "EAGLE3"])
            study.add_trial(create_trial(params=params, distributions=dists, value=value, user_attrs=attrs))
        if edge:  # a config ran out of memory at 0.87: the tree stays a step short of it, so no raise
            study.enqueue_trial({ALGO: None, MEM: 0.87})
            trial = study.ask()
            trial.suggest_categorical(ALGO, [None, "EAGLE3"])
            trial.suggest_float(MEM, 0.80, 0.95, step=0.01)
            trial.set_constraint("memory", 1.0)  # as the driver tells an out-of-memory launch
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        return study

    def ask(study: optuna.Study) -> optuna.trial.FrozenTrial:
        trial = study.ask()
        if trial.suggest_categorical(ALGO, [None, "EAGLE3"]) == "EAGLE3":
            trial.suggest_int(SPEC_STEPS, 1, 6)
            trial.suggest_categorical(SPEC_TOPK, [1, 2, 4, 8])
            trial.suggest_int(SPEC_DRAFT, 2, 16)
        trial.suggest_float(MEM, 0.80, 0.95, step=0.01)
        study.tell(trial, 1.0)
        return study.trials[trial.number]

    # The documented tree again (trial 1 ran it, but not as the branch's), now at a fraction that holds them.
    raised = ask(branch_study(105_675))
    assert raised.params[MEM] == pytest.approx(0.87) and tree(raised) == (5, 4, 8)
    why = raised.system_attrs[PROPOSED_ATTR]
    assert "with SGLang's documented tree at --mem-fraction-static raised" in why, why
    assert "(trial 1's KV pool held 105675 of 116000 tokens in flight)" in why, why
    assert ask(branch_study(116_000)).params[MEM] == pytest.approx(0.86)  # it held them
    assert ask(branch_study(105_675, edge=True)).params[MEM] == pytest.approx(0.86)


def test_a_branch_trial_in_a_space_without_the_trees_knobs_does_not_repeat_a_config() -> None:
    # Without draft tokens in the space, "twice the draft tokens" is the documented tree again: skipped.
    sampler = IncumbentMoves(optuna.samplers.RandomSampler(seed=0), n_startup_trials=1, share=0.0, seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)

    def ask() -> optuna.Trial:
        trial = study.ask()
        if trial.suggest_categorical(ALGO, [None, "EAGLE3"]) == "EAGLE3":
            trial.suggest_int(SPEC_STEPS, 1, 6)
            trial.suggest_categorical(SPEC_TOPK, [1, 4])
        return trial

    study.enqueue_trial({ALGO: None})
    for _ in range(6):
        study.tell(ask(), 0.5)
    planned = [t for t in study.trials if PROPOSED_ATTR in t.system_attrs]
    assert [tree(t)[:2] for t in planned] == [(5, 4), (5, 1)]
    for trial in planned:  # none repeats a config that ran before it
        assert all(trial.params != t.params for t in study.trials[: trial.number])


def test_no_branch_trials_leaves_the_moves_as_they_were() -> None:
    sampler = IncumbentMoves(
        optuna.samplers.RandomSampler(seed=0), n_startup_trials=3, share=0.0, branch_trials=0, seed=0
    )
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for _ in range(3):
        study.enqueue_trial({"NCCL_ALGO": None, ALGO: None})
    for value in (0.5, 0.9, 0.7, 0.1, 0.1, 0.1):
        study.tell(ask_branch(study), value)
    assert all(PROPOSED_ATTR not in t.system_attrs for t in study.trials)


def test_the_start_keeps_a_knob_at_the_value_a_cheaper_study_found() -> None:
    base = optuna.samplers.RandomSampler(seed=1)
    sampler = DefaultsStartSampler(base, keep_default=1.0, start_values={"NCCL_ALGO": "Ring"}, seed=3)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.set_user_attr(SERVER_CHOICES_ATTR, {MEM: 0.85})
    assert {algo for _, algo in run(study, 10)} == {"Ring"}


def test_moves_start_from_the_studys_answer_the_best_mean_once_configs_were_measured_again() -> None:
    sampler = IncumbentMoves(
        optuna.samplers.RandomSampler(seed=0), n_startup_trials=3, share=1.0, branch_trials=0, seed=0
    )
    study = optuna.create_study(direction="maximize", sampler=sampler)
    names = [f"k{i}" for i in range(4)]
    choices = [None, 1, 2, 4]

    def add(value: float, choice: int, **attrs: object) -> None:
        params = dict.fromkeys(names, choice)
        distributions = {n: CategoricalDistribution(choices) for n in names}
        study.add_trial(
            create_trial(params=params, distributions=distributions, value=value, user_attrs=attrs)
        )

    def why_asked() -> str:
        trial = study.ask()
        for name in names:
            trial.suggest_categorical(name, choices)
        study.tell(trial, 0.1)
        return str(study.trials[trial.number].system_attrs[PROPOSED_ATTR])

    add(10.0, 1)  # trial 0: the best single measurement
    add(9.0, 2)  # trial 1
    add(5.0, 4)
    assert why_asked().startswith("a move from trial 0, the best so far")
    add(8.5, 2, **{REMEASURE_OF_ATTR: 1})  # trial 1's config measured again: its mean is the answer now
    add(8.8, 2, **{REMEASURE_OF_ATTR: 1})
    best = best_trial(study)
    assert best is not None and best.number == 1
    assert why_asked().startswith("a move from trial 1, the best so far")


def test_the_sampler_table_builds_every_sampler_a_study_file_may_name() -> None:
    assert tuple(SAMPLERS) == SAMPLER_NAMES
    for name in SAMPLER_NAMES:
        assert isinstance(SAMPLERS[name](7), optuna.samplers.BaseSampler), name
    default = build(SamplerSpec())
    assert isinstance(default, IncumbentMoves)


def test_staged_values_are_held_in_every_trial_and_moves_leave_them_alone() -> None:
    # An NCCL all-reduce study's best, measured before the server study: no trial changes it, and the
    # incompatibility memory's holding (which the study loop sets) adds to it instead of replacing it.
    staged = {"k0": 2}
    sampler = tpe(0, n_startup_trials=3, staged=staged)
    assert isinstance(sampler, IncumbentMoves)
    sampler.held = {"k1": None}
    assert sampler.held == {"k0": 2, "k1": None}
    study = optuna.create_study(direction="maximize", sampler=sampler)
    values = []
    for number in range(25):
        trial = study.ask()
        value = 1.0
        for i in range(4):
            value *= 1.0 + 0.1 * (trial.suggest_categorical(f"k{i}", [None, 1, 2, 4]) or 0) / (i + 1)
        values.append(trial.params)
        study.tell(trial, value - 0.001 * number)
    assert all(params["k0"] == 2 for params in values)
    moves = [t for t in study.trials if str(t.system_attrs.get(PROPOSED_ATTR, "")).startswith("a move")]
    assert moves and all("k0" not in t.system_attrs[PROPOSED_ATTR] for t in moves)


def test_sglangs_adaptive_mode_keeps_one_step_beyond_the_accepted_drafts() -> None:
    # accept length = accepted drafts + the bonus token; SGLang keeps round(accepted) + 1 steps.
    assert [adaptive_steps(x) for x in (3.4, 2.6, 1.2, 0.9)] == [3, 3, 1, 1]


def tree_study(best: dict[str, object], accept_length: float | None = None) -> optuna.Study:
    """A study whose best trial has `best`'s tree (on a space of the tree and one other knob), every
    move one knob (`second=0`), no branch trials."""
    sampler = IncumbentMoves(
        optuna.samplers.RandomSampler(seed=0), n_startup_trials=1, share=1.0, second=0.0, branch_trials=0
    )
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.enqueue_trial({ALGO: "EAGLE3", "NCCL_ALGO": None, **best})
    trial = ask_branch(study)
    if accept_length is not None:
        trial.set_user_attr(ACCEPT_LENGTH_ATTR, accept_length)
    study.tell(trial, 1.0)
    return study


def tree_moves(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The trials that moves of a tree knob proposed."""
    return [
        t
        for t in study.trials
        if str(t.system_attrs.get(PROPOSED_ATTR, "")).startswith("a move")
        and any(n in t.system_attrs[PROPOSED_ATTR] for n in (SPEC_STEPS, SPEC_TOPK, SPEC_DRAFT))
    ]


def test_a_move_of_a_tree_knob_goes_to_a_neighbouring_tree() -> None:
    study = tree_study({SPEC_STEPS: 5, SPEC_TOPK: 4, SPEC_DRAFT: 8})
    neighbours = {(4, 4, 8), (6, 4, 8), (5, 2, 4), (5, 8, 16), (5, 4, 16), (5, 4, 4)}
    for _ in range(20):
        study.tell(ask_branch(study), 0.5)  # worse: every move starts from the first trial
    seen = {tree(t) for t in tree_moves(study)}
    assert seen == neighbours
    # A chain's steps also move to those SGLang's adaptive mode keeps for its accept length.
    study = tree_study({SPEC_STEPS: 2, SPEC_TOPK: 1}, accept_length=4.2)
    for _ in range(20):
        study.tell(ask_branch(study), 0.5)
    chains = {tree(t)[0] for t in tree_moves(study) if tree(t)[1] == 1}
    assert chains == {1, 3, 4}  # a step either way, and round(4.2)


def test_moves_from_one_best_try_each_knob_before_any_twice() -> None:
    sampler = IncumbentMoves(
        optuna.samplers.RandomSampler(seed=0), n_startup_trials=1, share=1.0, second=0.0, branch_trials=0
    )
    study = optuna.create_study(direction="maximize", sampler=sampler)
    names = [f"k{i}" for i in range(6)]
    for number in range(7):
        trial = study.ask()
        for name in names:
            trial.suggest_categorical(name, [None, 1, 2, 4])
        study.tell(trial, 1.0 if number == 0 else 0.5)
    best = study.trials[0].params
    moved = [next(n for n in names if t.params[n] != best[n]) for t in study.trials[1:]]
    assert sorted(moved) == names  # a sweep: six moves, six knobs


def test_ngram_gets_draft_tokens_on_purpose_not_an_eagle_tree() -> None:
    """NGRAM (SGLang's `_handle_ngram`) takes draft tokens alone, 12 by default: its branch trials are 12,
    half and twice that, labelled so; an EAGLE-3 branch beside it keeps its trees."""
    sampler = IncumbentMoves(optuna.samplers.RandomSampler(seed=0), n_startup_trials=1, share=0.0, seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)

    def ask() -> optuna.Trial:  # the search space's order: SpeculativeRules.decide skips steps and topk
        trial = study.ask()
        algorithm = trial.suggest_categorical(ALGO, [None, "EAGLE3", "NGRAM"])
        if algorithm == "EAGLE3":
            trial.suggest_int(SPEC_STEPS, 1, 6)
            trial.suggest_categorical(SPEC_TOPK, [1, 4])
        if algorithm is not None:
            trial.suggest_int(SPEC_DRAFT, 2, 16)
        return trial

    study.enqueue_trial({ALGO: None})
    for _ in range(8):
        study.tell(ask(), 0.5)
    planned = [t for t in study.trials if PROPOSED_ATTR in t.system_attrs]
    ngram = [t for t in planned if t.params[ALGO] == "NGRAM"]
    assert [t.params for t in ngram] == [{ALGO: "NGRAM", SPEC_DRAFT: d} for d in (12, 6, 16)]
    assert [t.system_attrs[PROPOSED_ATTR].split(" with ")[1] for t in ngram] == [
        "SGLang's ngram default of 12 draft tokens",
        "half the ngram draft tokens",
        "twice the ngram draft tokens",
    ]
    eagle = [t for t in planned if t.params[ALGO] == "EAGLE3"]
    assert eagle and "SGLang's documented tree" in eagle[0].system_attrs[PROPOSED_ATTR]
    assert tree(eagle[0])[:2] == (5, 4)


def climb_study(
    trials: list[tuple[float, float | None]],
    climb: bool = True,
    other: int = 0,
    first: dict | None = None,
    running: int | None = None,
) -> optuna.Study:
    """A study of the memory fraction and one other knob whose trials ran at these (fraction, value) pairs
    (None: ran out of memory), the other knob alike in all but the last `other` trials (NCCL_ALGO Ring
    there), the first with the user attributes `first`, each with --max-running-requests `running` where
    it is set; moves off (`share=0`), no start."""
    sampler = IncumbentMoves(
        optuna.samplers.RandomSampler(seed=0), n_startup_trials=1, share=0.0, branch_trials=0, climb=climb
    )
    study = optuna.create_study(direction="maximize", sampler=sampler)
    distributions = {
        MEM: FloatDistribution(0.70, 0.95, step=0.01),
        "NCCL_ALGO": CategoricalDistribution([None, "Ring"]),
    }
    for number, (fraction, value) in enumerate(trials):
        failed = {"state": optuna.trial.TrialState.PRUNED, "system_attrs": {"constraints": [1.0]}}
        done = {"value": value} if value is not None else failed
        params = {MEM: fraction, "NCCL_ALGO": "Ring" if number >= len(trials) - other else None}
        if running is not None:
            distributions[MAX_RUNNING] = CategoricalDistribution([None, 2, 4, 8])
            params[MAX_RUNNING] = running
        attrs = (first or {}) if number == 0 else {}
        study.add_trial(create_trial(params=params, distributions=distributions, user_attrs=attrs, **done))
    return study


def ask_fraction(study: optuna.Study) -> float:
    trial = study.ask()
    fraction = trial.suggest_float(MEM, 0.70, 0.95, step=0.01)
    trial.suggest_categorical("NCCL_ALGO", [None, "Ring"])
    return fraction


def planned_by_line_search(study: optuna.Study) -> bool:
    ask_fraction(study)
    return "a line search" in str(study.trials[-1].system_attrs.get(PROPOSED_ATTR))


def test_a_line_search_pushes_the_memory_fraction_on_to_the_edge_where_it_ran_out() -> None:
    # A best with no trial on its line: a probe one step up, once two configs that differ in the fraction
    # alone differ by more than the margin (here under another NCCL_ALGO); before, none.
    assert not planned_by_line_search(climb_study([(0.82, 700.0)]))
    study = climb_study([(0.82, 700.0), (0.80, 600.0), (0.81, 650.0)], other=2)
    assert ask_fraction(study) == pytest.approx(0.83)
    # Not where another config ran out of memory one step up already; and expanding steps stop there too.
    assert not planned_by_line_search(climb_study([(0.82, 700.0), (0.83, None)], other=1))
    study = climb_study([(0.84, 700.0), (0.85, 720.0), (0.88, None)], other=1)
    assert ask_fraction(study) == pytest.approx(0.87)
    # 0.84 did worse than 0.85: the next goes twice as far the other way, then twice again.
    study = climb_study([(0.84, 700.0), (0.85, 720.0)])
    assert ask_fraction(study) == pytest.approx(0.87)
    assert "a line search from trial 1" in study.trials[-1].system_attrs[PROPOSED_ATTR]
    study = climb_study([(0.84, 700.0), (0.85, 720.0), (0.87, 760.0)])
    assert ask_fraction(study) == pytest.approx(0.91)
    # Past the edge (out of memory at 0.95): halfway back, then the last step between.
    study = climb_study([(0.87, 760.0), (0.91, 800.0), (0.95, None)])
    assert ask_fraction(study) == pytest.approx(0.93)
    study = climb_study([(0.87, 760.0), (0.91, 800.0), (0.93, None), (0.95, None)])
    assert ask_fraction(study) == pytest.approx(0.92)


def pool_study(
    held: int,
    trials: list[tuple[float, float | None]],
    token_kb: float = 4.5,
    other: int = 0,
    running: int | None = None,
) -> optuna.Study:
    """climb_study's trials (the last `other` off the best's line), the first (the best) with a memory
    report at its fraction: 60 GB of weights per GPU and a KV pool of `held` tokens of `token_kb` kB each;
    the workload keeps 116,000 tokens in flight (4 requests of 28,000 + 1,000, the seed's)."""
    kv_gb = held * token_kb * 1e-6
    memory = {"weights_gb": 60.0, "kv_cache_gb": kv_gb, "kv_cache_tokens": float(held)}
    study = climb_study(trials, other=other, first={SERVER_MEMORY_ATTR: memory}, running=running)
    assert isinstance(study.sampler, IncumbentMoves)
    study.sampler.in_flight = lambda _params: InFlight(4, 29_000)
    return study


def test_a_best_whose_kv_pool_held_fewer_tokens_than_the_workload_sends_raises_its_fraction() -> None:
    # 105,675 tokens held (the seed's EAGLE-3 best at 0.86), 10,325 short: 0.046 GB more, on a GPU of
    # (60 + 0.476) / 0.86 = 70.3 GB, is +0.0007 of it: the next step, 0.87. No trial had shown that the
    # fraction matters (a lone best), which the plain line search waits for.
    study = pool_study(105_675, [(0.86, 700.0)])
    asked: list[dict[str, object]] = []  # the requests in flight are the best's: its --dp-size, if searched
    assert isinstance(study.sampler, IncumbentMoves)
    study.sampler.in_flight = lambda params: asked.append(dict(params)) or InFlight(4, 29_000)
    assert ask_fraction(study) == pytest.approx(0.87)
    assert asked and all(params["--mem-fraction-static"] == 0.86 for params in asked)
    why = study.trials[-1].system_attrs[PROPOSED_ATTR]
    assert "its KV pool held 105675 of the workload's 116000 tokens in flight" in why, why
    # Far short, it goes POOL_STEPS at once: 96,000 tokens of 45 kB are 4.32 GB, on a GPU of
    # (60 + 0.9) / 0.80 = 76.1 GB +0.057 of it (0.86), so 0.83; two steps short, two steps.
    assert ask_fraction(pool_study(20_000, [(0.80, 700.0)], token_kb=45.0)) == pytest.approx(0.83)
    assert ask_fraction(pool_study(90_000, [(0.80, 700.0)], token_kb=45.0)) == pytest.approx(0.82)
    # Short of a value another config ran out of memory at (0.83: 0.82); none where that leaves no step.
    study = pool_study(20_000, [(0.80, 700.0), (0.83, None)], token_kb=45.0, other=1)
    assert ask_fraction(study) == pytest.approx(0.82)
    study = pool_study(20_000, [(0.80, 700.0), (0.81, None)], token_kb=45.0, other=1)
    assert not planned_by_line_search(study)
    # Nothing where the pool held the workload, nor with no workload's figure (a prompts file, a ladder).
    assert not planned_by_line_search(pool_study(116_000, [(0.86, 700.0)]))
    study = pool_study(105_675, [(0.86, 700.0)])
    assert isinstance(study.sampler, IncumbentMoves)
    study.sampler.in_flight = lambda _params: None
    assert not planned_by_line_search(study)
    # 8 requests of 29,000 tokens of 45 kB: 232,000, 0.076 short, so three steps up (0.89); a best that
    # runs at most 4 at once (--max-running-requests) uses room for 116,000 (0.87); one that runs 2, none.
    for running, fraction in ((None, 0.89), (4, 0.87)):
        study = pool_study(105_675, [(0.86, 700.0)], token_kb=45.0, running=running)
        assert isinstance(study.sampler, IncumbentMoves)
        study.sampler.in_flight = lambda _params: InFlight(8, 29_000)
        assert ask_fraction(study) == pytest.approx(fraction), running
    assert "of the workload's 116000 tokens in flight" in study.trials[-1].system_attrs[PROPOSED_ATTR]
    study = pool_study(105_675, [(0.86, 700.0)], token_kb=45.0, running=2)
    assert isinstance(study.sampler, IncumbentMoves)
    study.sampler.in_flight = lambda _params: InFlight(8, 29_000)
    assert not planned_by_line_search(study)
    # A trial above the best on its line ran (and did worse): the plain line search goes the other way.
    study = pool_study(105_675, [(0.86, 700.0), (0.87, 690.0)])
    assert ask_fraction(study) == pytest.approx(0.84)
    assert "KV pool" not in study.trials[-1].system_attrs[PROPOSED_ATTR]


def test_a_line_search_from_a_best_whose_knob_is_now_held_does_not_repeat_a_tried_config() -> None:
    # The best ran with NCCL_ALGO Ring; then the study held NCCL_ALGO at None (screening found it moves
    # nothing beyond noise). Its line search's probe, 0.86, is asked as (0.86, None): trial 2's config.
    # Planned from the best's own params it was launched again and again (20 repeats on the seed profile).
    study = climb_study([(0.84, 700.0), (0.85, 720.0), (0.86, 690.0), (0.85, 730.0)], other=1)
    sampler = study.sampler
    assert isinstance(sampler, IncumbentMoves)
    sampler.staged = {"NCCL_ALGO": None}
    assert not planned_by_line_search(study), study.trials[-1].params
    # Held at Ring, the same trials plan the probe: what the line search does stays where it can.
    study = climb_study([(0.84, 700.0), (0.85, 720.0), (0.86, 690.0), (0.85, 730.0)], other=1)
    assert isinstance(study.sampler, IncumbentMoves)
    study.sampler.staged = {"NCCL_ALGO": "Ring"}
    assert ask_fraction(study) == pytest.approx(0.86)


def test_a_line_search_stops_where_the_slope_is_within_noise_or_the_best_is_bracketed() -> None:
    def planned(trials: list[tuple[float, float | None]]) -> bool:
        study = climb_study(trials)
        ask_fraction(study)
        return PROPOSED_ATTR in study.trials[-1].system_attrs

    assert not planned([(0.84, 719.0), (0.85, 720.0)])  # 0.14% worse: within CLIMB_MARGIN
    assert not planned([(0.84, 700.0), (0.85, 720.0), (0.86, 710.0)])  # worse either side
    assert not planned([(0.91, 700.0), (0.92, 720.0), (0.93, None)])  # no step between the best and the edge
    assert not planned([(0.93, 700.0), (0.95, 720.0)])  # at the range's end
    # Without the line search (`climb=False`) the same trials leave the proposal to the base sampler.
    study = climb_study([(0.84, 700.0), (0.85, 720.0)], climb=False)
    ask_fraction(study)
    assert PROPOSED_ATTR not in study.trials[-1].system_attrs


def test_at_the_edge_the_config_that_ran_out_of_memory_under_load_runs_with_a_smaller_prefill_chunk() -> None:
    """0.93 ran out of memory while serving (a prefill batch's activations); 0.92 is the best: the line search
    runs 0.93 again with the next smaller chunk than the 8192 the server chose, and only once."""
    chunk = "--chunked-prefill-size"
    sampler = IncumbentMoves(
        optuna.samplers.RandomSampler(seed=0), n_startup_trials=1, share=0.0, branch_trials=0
    )
    study = optuna.create_study(direction="maximize", sampler=sampler)
    distributions = {
        MEM: FloatDistribution(0.70, 0.95, step=0.01),
        chunk: CategoricalDistribution([None, 2048, 4096]),
    }
    for fraction, value in ((0.91, 760.0), (0.92, 800.0), (0.93, None)):
        failed = {
            "state": optuna.trial.TrialState.PRUNED,
            "system_attrs": {"constraints": [1.0]},
            "user_attrs": {"failure_kind": "oom_under_load", SERVER_CHOICES_ATTR: {chunk: 8192.0}},
        }
        done = {"value": value} if value is not None else failed
        study.add_trial(
            create_trial(params={MEM: fraction, chunk: None}, distributions=distributions, **done)
        )

    def ask() -> dict[str, object]:
        trial = study.ask()
        params = {
            MEM: trial.suggest_float(MEM, 0.70, 0.95, step=0.01),
            chunk: trial.suggest_categorical(chunk, [None, 2048, 4096]),
        }
        study.tell(trial, 700.0)
        return params

    assert ask() == {MEM: pytest.approx(0.93), chunk: 4096}
    assert (
        "trial 2's config (oom_under_load) with --chunked-prefill-size 4096"
        in study.trials[-1].system_attrs[PROPOSED_ATTR]
    )
    ask()
    assert PROPOSED_ATTR not in study.trials[-1].system_attrs  # once: the next is the base sampler's


def test_a_line_searchs_launch_past_the_edge_is_not_repaired() -> None:
    """The line search went past the edge on purpose: it goes back itself, and at the edge runs the failed
    config with the next smaller graph batch, so the repair's smallest one would be a launch too many."""
    from autotune.study import optuna_internals

    study = repairs_study()
    study.enqueue_trial({ALGO: "EAGLE3", GRAPH_BS: 128})
    trial = ask_launch(study)
    optuna_internals.set_system_attr(
        study, trial, PROPOSED_ATTR, "a line search from trial 0, the best so far"
    )
    tell_failed(study, trial, "cuda_graph_oom")
    ask_launch(study)
    assert PROPOSED_ATTR not in study.trials[-1].system_attrs  # the base sampler's, not a repair


def test_the_default_sampler_starts_with_the_baseline_and_one_proposal() -> None:
    # A start of 10, then 3, cost every profile node hours for the same answers: benchmarks/RESULTS.md.
    sampler = build(SamplerSpec(name="tpe", seed=1))
    assert isinstance(sampler, IncumbentMoves) and sampler.n_startup_trials == START_TRIALS == 2
    assert not isinstance(build(SamplerSpec(name="random", seed=1)), IncumbentMoves)


def no_rate_start(baseline_value: float, trees: tuple[str, ...] = ("EAGLE3",)) -> optuna.Study:
    """The default sampler's study after its baseline (SGLang's defaults, at `baseline_value`) and its start's
    proposal, on a space of the memory fraction, an NCCL knob and EAGLE-3's tree."""
    sampler = build(SamplerSpec(name="tpe", seed=1))
    assert isinstance(sampler, IncumbentMoves) and isinstance(sampler.base, DefaultsStartSampler)
    sampler.base.tree_algorithms = trees  # as the study loop tells it (Study.tree_algorithms)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.set_user_attr(SERVER_CHOICES_ATTR, {MEM: 0.85})
    study.enqueue_trial({}, user_attrs={BASELINE_ATTR: True})
    study.tell(study.ask(), baseline_value)
    proposal = ask_branch(study)
    proposal.suggest_float(MEM, 0.70, 0.95, step=0.01)
    study.tell(proposal, 0.65)
    return study


def test_where_the_defaults_met_the_slo_at_no_rate_the_start_speculates_with_the_documented_tree() -> None:
    # On 4x L40S the defaults serve no rate within the cookbook's SLO: a proposal near them walked its load
    # search down the slow rates (555-837 s of a 2.9 node-hour budget, an hour without one) and measured 0.
    study = no_rate_start(0.0)
    proposal = study.trials[1]
    assert tree(proposal) == (5, 4, 8) and proposal.params[ALGO] == "EAGLE3"
    assert proposal.params["NCCL_ALGO"] is None and near(proposal.params[MEM])  # the rest: the defaults
    why = proposal.system_attrs[PROPOSED_ATTR]
    assert why.startswith("exploring --speculative-algorithm EAGLE3: SGLang's defaults with SGLang's docum")
    assert why.endswith("(SGLang's defaults met your SLO at no rate)")
    # The branch counts it as its documented tree: its next tree is the chain, not the same tree again.
    trees = []
    for _ in range(3):
        trial = ask_branch(study)
        trial.suggest_float(MEM, 0.70, 0.95, step=0.01)
        trees.append(tree(study.trials[trial.number]))
        study.tell(trial, 0.1)
    assert (5, 4, 8) not in trees and any(topk == 1 for _, topk, _ in trees if topk is not None)


@pytest.mark.parametrize(("baseline_value", "trees"), [(0.4, ("EAGLE3",)), (0.0, ())])
def test_a_start_speculates_only_where_the_defaults_met_no_rate_and_the_space_has_a_tree(
    baseline_value: float, trees: tuple[str, ...]
) -> None:
    proposal = no_rate_start(baseline_value, trees).trials[1]
    assert PROPOSED_ATTR not in proposal.system_attrs  # the start's proposal near the defaults, as before


def cap_study(over: dict[str, int], in_flight: float = 6.6, cap: int | None = None) -> optuna.Study:
    """A study whose best trial's load search missed at 0.875 req/s with `over` requests over each limit and
    `in_flight` running at once on average, its running-request cap at `cap`; no branches, no line search."""
    sampler = IncumbentMoves(
        optuna.samplers.RandomSampler(seed=0), n_startup_trials=1, share=0.0, branch_trials=0, climb=False
    )
    study = optuna.create_study(direction="maximize", sampler=sampler)
    missed = {"load": 0.875, "over": over, "in_flight": in_flight}
    study.enqueue_trial({MAX_RUNNING: cap, "NCCL_ALGO": None}, user_attrs={"load_missed": missed})
    study.tell(ask_cap(study), 0.82)
    return study


def ask_cap(study: optuna.Study) -> optuna.Trial:
    trial = study.ask()
    trial.suggest_categorical(MAX_RUNNING, [None, 8, 16, 32, 64])
    trial.suggest_categorical("NCCL_ALGO", [None, "Ring", "Tree"])
    return trial


def test_a_best_whose_slo_misses_broke_the_tpot_limit_runs_again_with_its_running_requests_capped() -> None:
    # On 4x L40S the best known config is EAGLE-3's with a cap of 8 running requests (0.875 req/s within the
    # cookbook's SLO against 0.818 unset): bursts wait in the queue instead of slowing every decode.
    study = cap_study({"ttft_ms": 1, "tpot_ms": 10})
    capped = ask_cap(study)
    assert capped.params == {MAX_RUNNING: 8, "NCCL_ALGO": None}  # the smallest cap at or above 6.6 at once
    why = study.trials[capped.number].system_attrs[PROPOSED_ATTR]
    assert why == (
        f"a cap on running requests from trial 0, the best so far: {MAX_RUNNING} 8 "
        "(10 requests broke tpot_ms at 0.875, 6.6 running at once on average)"
    )
    assert ask_cap(cap_study({"tpot_ms": 10}, in_flight=9.5)).params[MAX_RUNNING] == 16
    # `autotune status` says what the best's misses broke, and the capped trial why it ran.
    assert "the SLO missed at 0.875: 1 over ttft_ms, 10 over tpot_ms; 6.6 running at once on average" in (
        _status_notes(_trial_record(study.trials[0]))
    )
    assert why in _status_notes(_trial_record(study.trials[capped.number]))


@pytest.mark.parametrize(
    ("over", "cap"),
    [
        ({"ttft_ms": 10, "tpot_ms": 3}, None),  # its misses broke the TTFT limit: a cap would queue more
        ({"ttft_ms": 0, "tpot_ms": 0}, None),  # nothing broke the TPOT limit
        ({"ttft_ms": 5, "tpot_ms": 5}, None),  # as many broke the TTFT limit
        ({"ttft_ms": 0, "tpot_ms": 10}, 8),  # capped at the space's smallest already
    ],
)
def test_the_cap_is_left_alone_where_the_misses_say_nothing_of_it(
    over: dict[str, int], cap: int | None
) -> None:
    study = cap_study(over, cap=cap)
    trial = ask_cap(study)
    assert not str(study.trials[trial.number].system_attrs.get(PROPOSED_ATTR, "")).startswith("a cap")


def test_a_capped_best_still_missing_on_tpot_steps_its_cap_down_one_value() -> None:
    # Capped at 32 with 30 running at once on average: the next value down (on real SGLang a 1.1B model's
    # defaults missed 4 ms a token with 30 at once, and a cap of 4 met it to the search's max).
    assert ask_cap(cap_study({"tpot_ms": 10}, in_flight=30.0, cap=32)).params[MAX_RUNNING] == 16
    assert ask_cap(cap_study({"tpot_ms": 10}, in_flight=12.0, cap=64)).params[MAX_RUNNING] == 16
