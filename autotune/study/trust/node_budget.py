"""A study's budget in node hours: what it spent, what its confirmation will cost, when the search ends.

Every launch records its node seconds (`records.NODE_S_ATTR`, counted by `TrialResult.node_seconds` in the
node's own clock); the NCCL stage's all-reduce jobs count too. The confirmation's cost is kept back: its
`min_rounds` rounds of SGLang's defaults and the leader, and SPARE_LAUNCHES toward a round more, each at
the dearest launch the study measured as it would run again (a runner-up is confirmed only where the hours
left pay for its rounds: study.trust.confirm). The search ends when its next launch, priced the same way,
would eat into that reserve; a confirmation round starts only when the
hours left pay for it, so the study always ends with an answer: confirmed, no gain, or unconfirmed because
the budget ran out after k of n rounds (recorded in `records.BUDGET_ATTR`, worded by `ran_out_text`). A
search launch after a confirmation (a resume given more hours) keeps every round back again: the leader it
may make has none.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config import Study
from autotune.errors import ConfigError
from autotune.node.startup_phases import DUMP_PHASE
from autotune.study.records import StudyRecord, TrialRecord, record_node_budget
from autotune.study.rules import (
    ConfigMeasurements,
    best_measured,
    groups_by_trial,
    maximizes,
    measurement_groups,
)
from autotune.study.storage import counts
from autotune.study.trust.confirm import confirmation, defaults_stop_early, stopped_below

__all__ = [
    "STEP_SHARE",
    "NodeHours",
    "check_budget",
    "node_hours",
    "node_hours_record",
    "ran_out",
    "ran_out_text",
    "record_budget",
    "record_ran_out",
    "rounds_pay",
    "step_floor",
]


# The search launches a resume is offered where the stopping rule, which would say how many, is off.
_SEARCH_LAUNCHES = 10
# Launches the reserve keeps beyond the confirmation's min_rounds rounds, toward a round more: a leader
# whose rounds spread wider than the study's noise needs one, and rounds cost less than the dearest launch
# they are priced at. Rounds of the defaults, the leader and the runner-up (top + 1 launches each) instead
# left a third of the seed's 2x auto_benchmark budget unspent; none at all, 86 of 96 answers confirmed
# against 94 (benchmarks/RESULTS.md, "The reserve: the defaults and the leader").
SPARE_LAUNCHES = 1

# A load-search step may take at most this share of the node hours left (`step_floor`): on 4x L40S under
# 2.9 node h, walks down to 1/16 req/s (80 prompts, 1280 s a step) took 0.94 and 0.98 node h for the
# defaults' first launch, 1.10 for a config's, before a config near the best was launched.
STEP_SHARE = 0.1


def spent_s(optuna_study: optuna.Study) -> float:
    """The node seconds the study spent: every finished launch's, and its NCCL stage's."""
    return _spent_s(optuna_study, optuna_study.get_trials(deepcopy=False))


def _spent_s(optuna_study: optuna.Study, trials: list[FrozenTrial]) -> float:
    stage = StudyRecord.of(optuna_study).nccl_stage
    stage_s = float(stage.get("node_s") or 0.0) if stage is not None else 0.0
    return stage_s + math.fsum(TrialRecord.of(t).node_s or 0.0 for t in trials)


def launch_s(optuna_study: optuna.Study) -> float | None:
    """The median node seconds of a launch that ran to its measurement (as every confirmation launch is:
    its configs completed before); of any launch before one completed; None before the first."""
    return _launch_s(optuna_study.get_trials(deepcopy=False))


def _launch_s(trials: list[FrozenTrial]) -> float | None:
    finished = [t for t in trials if t.state.is_finished() and counts(t)]
    complete = [t for t in finished if t.state == TrialState.COMPLETE and TrialRecord.of(t).node_s]
    seconds = [s for t in complete or finished if (s := TrialRecord.of(t).node_s)]
    return statistics.median(seconds) if seconds else None


def _node_firsts(trials: list[FrozenTrial]) -> set[int]:
    """Each node's first launch that spent node time: it reads the weights from disk and fills the node's
    compile cache, which no later launch of the same config (a confirmation's) does again."""
    launched = [t for t in trials if TrialRecord.of(t).node_s and t.datetime_start]
    firsts: dict[str | None, int] = {}  # node -> its first launch that spent node time
    for trial in sorted(launched, key=lambda t: (t.datetime_start, t.number)):
        firsts.setdefault(TrialRecord.of(trial).node, trial.number)
    return set(firsts.values())


def dearest_launch_s(optuna_study: optuna.Study) -> float | None:
    """The node seconds of the dearest launch that ran to its measurement, a node's first launch left out
    where it has others: what the confirmation's reserve prices each launch at. Configs differ in cost (a
    draft model loads and captures graphs too), so the median would leave the reserve short."""
    trials = optuna_study.get_trials(deepcopy=False)
    return _dearest_launch_s(trials, _node_firsts(trials))


def _like_the_next(study: Study, optuna_study: optuna.Study, trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The launches the next one may cost as much as. A load search that stops below the study's best
    (`stop_below_best`) measures at the best before any slower rate (measure.load_search): a launch that
    measured below it walked rates no launch now runs (on 4x L40S, 3965 s at 0.105 req/s against 592 s
    for the best's 0.65), so it is left out; the best's own launches stay."""
    search = study.objective.load_search
    if search is None or not search.stop_below_best:
        return trials
    best = best_measured(trials, optuna_study.direction)  # (a load search's max_load is maximized)
    if best is None or best.value is None:
        return trials
    slower = {
        t.number
        for t in trials
        if t.state == TrialState.COMPLETE and t.value is not None and t.value < best.value
    }
    return [t for t in trials if t.number not in slower]


def _measured_launches(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The launches that ran to their measurement and spent node time."""
    return [t for t in trials if t.state == TrialState.COMPLETE and counts(t) and TrialRecord.of(t).node_s]


def _dearest_launch_s(trials: list[FrozenTrial], firsts: set[int]) -> float | None:
    dearest = _dearest_s(_measured_launches(trials), firsts, _reload_s(trials))
    return dearest if dearest is not None else _launch_s(trials)


def _dearest_s(launches: list[FrozenTrial], firsts: set[int], reload_s: float | None) -> float | None:
    """The node seconds of the dearest of `launches` as they would cost again (`_repeat_s`), the nodes'
    first launches (`firsts`) left out where there are others; None for no launch."""
    later = [t for t in launches if t.number not in firsts] or launches
    return max((s for t in later if (s := _repeat_s(TrialRecord.of(t), reload_s))), default=None)


def _reload_s(trials: list[FrozenTrial]) -> float | None:
    """The median weight load of the launches that wrote no presharded dump: what a launch of a layout
    whose dump is on disk loads again (None before one is measured)."""
    loads = [
        float(load)
        for t in trials
        if (record := TrialRecord.of(t)).node_s
        and DUMP_PHASE not in record.startup_phases
        and isinstance(load := record.startup_phases.get("weight_load_s"), int | float)
    ]
    return statistics.median(loads) if loads else None


def _repeat_s(record: TrialRecord, reload_s: float | None) -> float | None:
    """What the launch would cost again. One that wrote a presharded dump (a one-time cost) would read
    the dump back: its weight load at what the launches without a dump loaded in, else at its own load
    less the dump, which still read the whole checkpoint."""
    if not record.node_s:
        return None
    phases = record.startup_phases
    dump, load = phases.get(DUMP_PHASE), phases.get("weight_load_s")
    if not dump:
        return record.node_s
    if reload_s is not None and load is not None:
        return record.node_s - load + reload_s
    return record.node_s - dump


def _launches_by_config(trials: list[FrozenTrial]) -> dict[int, list[FrozenTrial]]:
    """Each config (its first trial) -> its launches that spent node time."""
    launches: dict[int, list[FrozenTrial]] = {}
    for trial in trials:
        record = TrialRecord.of(trial)
        of = record.remeasure_of if record.remeasure_of is not None else trial.number
        if record.node_s:
            launches.setdefault(of, []).append(trial)
    return launches


def configs_round_s(study: Study, optuna_study: optuna.Study, configs: Iterable[int]) -> float:
    """What a round of `configs` (their first trials) costs: each one's dearest launch so far, a node's
    first launch left out where the config has others (the baseline's first reads the weights from disk:
    pricing every round at it refused a round the hours left paid for); the median launch for a config
    not measured; the defaults' launch that stops at its cutoff as such launches cost (`_round_prices`)."""
    trials = optuna_study.get_trials(deepcopy=False)
    prices = _round_prices(study, trials, _node_firsts(trials), configs, groups_by_trial(optuna_study))
    return math.fsum(prices.values())


def _round_prices(
    study: Study,
    trials: list[FrozenTrial],
    firsts: set[int],
    configs: Iterable[int],
    groups: Mapping[int, ConfigMeasurements],
) -> dict[int, float]:
    """Each of `configs`' launch in a round (`groups`: the study's by first trial). The defaults' where it
    will stop its load search at its cutoff (confirm.defaults_stop_early): their dearest launch that stopped
    there, else the dearest of the others' (a start-up and a few steps at rates near theirs), not their own
    search down to the slowest rates."""
    launches, median, reload_s = _launches_by_config(trials), _launch_s(trials) or 0.0, _reload_s(trials)

    def dearest(of: int) -> float:
        price = _dearest_s(launches[of], firsts, reload_s) if of in launches else None
        return median if price is None else price

    prices = {of: dearest(of) for of in configs}
    base = next((of for of in prices if of in groups and groups[of].baseline), None)
    others = [of for of in prices if of != base and of in groups]
    if (
        base is not None
        and others
        and defaults_stop_early(study, groups[base], [groups[of] for of in others])
    ):
        stopped = [s for t in launches.get(base, []) if stopped_below(t) and (s := TrialRecord.of(t).node_s)]
        prices[base] = max(stopped, default=max(prices[of] for of in others))
    return prices


@dataclass(frozen=True)
class _LoadSearchPrices:
    """A load-search objective's launches as a confirmation round would pay them (`_load_search_prices`)."""

    defaults_s: float
    leader_s: float | None  # None before a config other than the defaults was measured


def _load_search_prices(
    study: Study, optuna_study: optuna.Study, trials: list[FrozenTrial], firsts: set[int]
) -> _LoadSearchPrices | None:
    """For a load-search objective: SGLang's defaults' and the leader's launch as each measured. Such a launch
    is mostly its load search, which the worst configs make longest (the slow rates they pass: 3813 s against
    420-620 s for the configs near the best on 4x L40S), so the dearest launch would price the rounds of a
    leader at a config that does not lead. None for another objective, or before the defaults were
    measured."""
    if study.objective.load_search is None:
        return None
    measured = measurement_groups(optuna_study)
    groups = [g for g in measured if g.n and not g.failed]
    base = next((g for g in groups if g.baseline), None)
    if base is None:
        return None
    sign = 1.0 if maximizes(optuna_study.direction) else -1.0
    leader = max((g for g in groups if not g.baseline), key=lambda g: sign * g.mean, default=None)
    configs = (base.of,) if leader is None else (base.of, leader.of)
    prices = _round_prices(study, trials, firsts, configs, groups_by_trial(optuna_study, measured))
    return _LoadSearchPrices(prices[base.of], None if leader is None else prices[leader.of])


def round_s(study: Study, optuna_study: optuna.Study) -> float | None:
    """What the confirmation's next round costs (`configs_round_s` of its configs); None before the rounds
    began."""
    state = confirmation(optuna_study)
    if state is None:
        return None
    return configs_round_s(study, optuna_study, {state.baseline, *state.configs})


def _confirm_launches(study: Study) -> tuple[int, int]:
    """(rounds, launches a round) the confirmation's reserve pays for: its `min_rounds` rounds of SGLang's
    defaults and the leader; (0, 0) without one. A runner-up is confirmed only where the hours left pay
    for its rounds too (study.trust.confirm)."""
    confirm = study.file.trust.confirm
    return (confirm.min_rounds, 2) if confirm.enabled else (0, 0)


@dataclass(frozen=True)
class NodeHours:
    """Where a study stands against its node-hour budget (`budget_h` None: no budget)."""

    budget_h: float | None
    spent_s: float
    launch_s: float | None  # the median launch measured
    reserve_s: float  # kept back for the confirmation's rounds still to run
    search_reserve_s: float  # what a search launch must leave: every round, for a leader it may make
    # What the next search launch is priced at: the dearest launch as it would run again (`dearest_launch_s`,
    # the reserve's price too); the median would count first launches that read the weights from disk or
    # wrote a dump, which the search's next launch of the same layout does not. None: `launch_s`.
    next_launch_s: float | None = None
    # A load-search leader's rounds cost more than the hours left (`_load_search_prices`): no launch can keep
    # them whole, so the search goes on while its launches fit, for a leader cheaper to confirm.
    reserve_unpaid: bool = False
    # SGLang's defaults launched again as they measured (`_defaults_s`): a load search's, unlike the next
    # search launch (`_like_the_next`), runs down to the slowest rates when theirs are slow. None: not yet.
    defaults_s: float | None = None

    @property
    def next_price_s(self) -> float | None:
        """What the next launch is priced at: `next_launch_s`, else the median launch."""
        return self.next_launch_s or self.launch_s

    @property
    def left_s(self) -> float | None:
        return None if self.budget_h is None else self.budget_h * 3600 - self.spent_s

    def search_may_launch(self, running: int = 0, defaults: bool = False) -> bool:
        """Whether one more search launch (with `running` ones under way) leaves the reserve whole: every
        round of a confirmation, whose rounds so far a new leader would not have. `defaults`: a launch of
        SGLang's defaults, at what theirs cost (`defaults_s`), which keeps the reserve even where it is
        unpaid: it cannot be the leader cheaper to confirm that an unpaid reserve searches on for."""
        if self.left_s is None or self.launch_s is None:
            return True  # no budget, or nothing measured yet: the baseline runs first
        reserve = 0.0 if self.reserve_unpaid and not defaults else self.search_reserve_s
        price = (self.defaults_s if defaults else None) or self.next_price_s or 0.0
        return running * (self.next_price_s or 0.0) + price + reserve <= self.left_s

    def text(self, pace: float | None = None) -> str:
        """ "node hours: 1.52 spent of 2.00, 0.48 left (0.36 kept for confirmation), ETA ~4 min"."""
        spent = self.spent_s / 3600
        if self.budget_h is None or self.left_s is None:
            return f"node hours: {spent:.2f} spent"
        left = max(self.left_s, 0.0) / 3600
        line = f"node hours: {spent:.2f} spent of {self.budget_h:.2f}, {left:.2f} left"
        if self.reserve_s:
            line += f" ({self.reserve_s / 3600:.2f} kept for confirmation)"
        if pace is not None and pace > 0:  # wall seconds per node second, as measured so far
            line += f", ETA ~{_duration(max(self.left_s, 0.0) * pace)}"
        return line


def search_ended_text(study: Study, optuna_study: optuna.Study, hours: NodeHours) -> str:
    """Why the search ends on the budget: its share is spent; or, where no search launch ran yet, that the
    budget left it none (the baseline's launch priced the confirmation past it), with the hours a resume
    needs for the launches the stopping rule looks at first."""
    searched = any(
        not (record := TrialRecord.of(t)).deliberate and record.node_s
        for t in optuna_study.get_trials(deepcopy=False)
    )
    if searched or hours.left_s is None or not hours.launch_s:
        return (
            f"search ended: its share of the node-hour budget is spent ("
            f"{hours.text().removeprefix('node hours: ')}); the rest pays for confirmation"
        )
    left = max(hours.left_s, 0.0) / 3600
    short = (
        f"the {left:.2f} node h left do not pay for a launch ({hours.launch_s / 3600:.2f} node h, the median "
        f"measured) beside the {hours.reserve_s / 3600:.2f} kept for confirmation"
    )
    stop = study.file.trust.stop_early
    launches = stop.min_trials if stop.enabled else _SEARCH_LAUNCHES
    need = (hours.spent_s + hours.reserve_s + launches * hours.launch_s) / 3600
    return (
        f"search ended before its first launch: {short}; `autotune resume --hours {_up(need):.2f}` gives the "
        f"search {launches} launches"
    )


def _up(hours: float) -> float:
    """Hours rounded up to the hundredth a user passes to --hours."""
    return math.ceil(hours * 100) / 100


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.0f} min"


def node_hours(study: Study, optuna_study: optuna.Study, *, given: bool = False) -> NodeHours:
    """The study's node hours now, against the budget its last run was given (`record_budget`: the file's
    `budget.node_hours` or `--hours`), else (or with `given`: a run about to start) the study file's."""
    rounds, per_round = _confirm_launches(study)
    trials = optuna_study.get_trials(deepcopy=False)  # read once: every part below is of them
    firsts = _node_firsts(trials)
    dearest = _dearest_launch_s(_like_the_next(study, optuna_study, trials), firsts) or 0.0
    price, spare_s = per_round * dearest, dearest  # a round's launches, each at the dearest
    loads = _load_search_prices(study, optuna_study, trials, firsts)
    if loads is not None and loads.leader_s is not None:
        price, spare_s = loads.defaults_s + loads.leader_s, loads.leader_s
    left = _rounds_left(optuna_study, rounds)
    spare = SPARE_LAUNCHES * spare_s if rounds else 0.0
    reserve = left * price + (spare if left else 0.0)
    budget = _budget_h(study, optuna_study, given)
    median = _launch_s(trials)
    # Priced at a node's first launch alone (it read the weights from disk, and no launch after it is
    # measured yet), the search's first launch keeps back one round: a launch after it prices the rest.
    firsts_only = all(t.number in firsts for t in trials if TrialRecord.of(t).node_s)
    search_rounds = min(rounds, 1) if firsts_only else rounds
    search_reserve = search_rounds * price + (spare if search_rounds else 0.0)
    spent = _spent_s(optuna_study, trials)
    # A load search's rounds cost more than the hours left: no launch can keep them whole, and a leader that
    # serves more runs a shorter load search, so the search goes on while its launches fit. (Keeping the
    # defaults' launches in the rounds back instead: 8/16 -> 2/16 confirmed on 4x L40S, RESULTS-peers.md.)
    # A leader's rounds alone (a spare launch that does not fit leaves them to run, not the search); before
    # one, the whole reserve, priced at the defaults' own launch, which its rounds would not run.
    kept = search_rounds * price if loads is not None and loads.leader_s is not None else search_reserve
    unpaid = loads is not None and budget is not None and kept > budget * 3600 - spent
    defaults_s = _defaults_s(trials, firsts)
    return NodeHours(budget, spent, median, reserve, search_reserve, dearest or None, unpaid, defaults_s)


def _budget_h(study: Study, optuna_study: optuna.Study, given: bool = False) -> float | None:
    """The node-hour budget the study's last run was given (`record_budget`: the file's `budget.node_hours`
    or `--hours`), else (or with `given`: a run about to start) the study file's; None: no budget."""
    record = StudyRecord.of(optuna_study).budget
    return record["hours"] if "hours" in record and not given else study.file.budget.node_hours


def _defaults_s(trials: list[FrozenTrial], firsts: set[int]) -> float | None:
    """SGLang's defaults' dearest launch that ran its whole measurement, as it would cost again."""
    launches = [t for t in _measured_launches(trials) if TrialRecord.of(t).baseline]
    return _dearest_s(launches, firsts, _reload_s(trials))


def step_floor(study: Study, optuna_study: optuna.Study) -> float | None:
    """The slowest request rate at which one load-search step (its num_prompts) takes no more than
    STEP_SHARE of the node hours left: where the load search stops halving under a budget (LoadSearchPlan's
    `budget_floor`). None without a budget, or for a search of requests in flight (a step's time is not
    its prompts over its rate)."""
    search, workload = study.objective.load_search, study.objective.workload
    if search is None or search.vary != "request_rate" or workload is None:
        return None
    budget = _budget_h(study, optuna_study)
    if budget is None:
        return None
    left = budget * 3600 - spent_s(optuna_study)  # NodeHours.left_s, without pricing what is left
    return workload.num_prompts / (STEP_SHARE * max(left, 1.0))


def record_budget(study: Study, optuna_study: optuna.Study) -> None:
    """Remember the node-hour budget this run was given (None: none), for `status` and the report."""
    record = StudyRecord.of(optuna_study).budget
    if record.get("hours", "unset") != study.file.budget.node_hours:
        record_node_budget(optuna_study, {**record, "hours": study.file.budget.node_hours})


def node_hours_record(study: Study, optuna_study: optuna.Study) -> dict[str, Any]:
    """`status --json`'s node hours: spent, the budget, left, kept for confirmation, a launch's median."""
    hours = node_hours(study, optuna_study)
    return {
        "spent": hours.spent_s / 3600,
        "budget": hours.budget_h,
        "left": None if hours.left_s is None else hours.left_s / 3600,
        "kept_for_confirmation": hours.reserve_s / 3600,
        "launch_median": None if hours.launch_s is None else hours.launch_s / 3600,
        "ran_out": ran_out(optuna_study),
    }


def _rounds_left(optuna_study: optuna.Study, rounds: int) -> int:
    """The confirmation's `rounds` less those queued so far (each paid for as it runs) and those the
    search's launches made (study.confirm.search_rounds); none where the defaults at the load search's max
    decided it with no round."""
    state = confirmation(optuna_study)
    if state is None:
        return rounds
    if state.defaults_at_max:
        return 0
    return max(rounds - state.queued - state.searched, 0)


def check_budget(study: Study, optuna_study: optuna.Study, field: str) -> None:
    """Refuse, before any launch, a budget that cannot pay for one more launch than it spent (`field`: the
    file's `budget.node_hours` or `--hours`)."""
    hours = node_hours(study, optuna_study, given=True)
    if hours.budget_h is None or hours.launch_s is None or hours.left_s is None:
        return
    if hours.left_s < hours.launch_s:
        need = (hours.spent_s + hours.launch_s * (1 + _confirm_launches(study)[1])) / 3600
        raise ConfigError(
            study.path,
            field,
            hours.budget_h,
            f"the budget cannot pay for one launch: {hours.spent_s / 3600:.2f} node h spent, a launch "
            f"costs {hours.launch_s / 3600:.2f} node h (the median this study measured)",
            f"Give at least {need:.2f} hours in total, e.g. `autotune resume --hours {_up(need):.2f}`.",
        )


def round_fits(study: Study, optuna_study: optuna.Study, launches: int) -> bool:
    """Whether the hours left pay for the next confirmation round (of `launches`)."""
    hours = node_hours(study, optuna_study)
    if hours.left_s is None or hours.launch_s is None:
        return True
    cost = round_s(study, optuna_study)
    return (cost if cost is not None else launches * hours.launch_s) <= hours.left_s


def rounds_pay(study: Study, optuna_study: optuna.Study, configs: Sequence[int]) -> bool:
    """Whether the hours left pay for the confirmation's `min_rounds` rounds of `configs` (first trials)."""
    hours = node_hours(study, optuna_study)
    if hours.left_s is None:
        return True
    return _confirm_launches(study)[0] * configs_round_s(study, optuna_study, configs) <= hours.left_s


def record_ran_out(study: Study, optuna_study: optuna.Study, rounds: int) -> None:
    """Remember that the budget ran out after `rounds` confirmation rounds, and what a round costs."""
    need, per_round = _confirm_launches(study)
    cost = round_s(study, optuna_study)
    cost = cost if cost is not None else per_round * (launch_s(optuna_study) or 0.0)
    record = StudyRecord.of(optuna_study).budget
    ran = {"rounds": rounds, "of": max(need, rounds + 1), "round_h": cost / 3600}
    record_node_budget(optuna_study, {**record, "spent_h": spent_s(optuna_study) / 3600, "ran_out": ran})


def clear_ran_out(optuna_study: optuna.Study) -> None:
    """Forget an earlier run's ran-out record: this run's rounds decide again."""
    record = StudyRecord.of(optuna_study).budget
    if record.get("ran_out"):
        record_node_budget(optuna_study, {k: v for k, v in record.items() if k != "ran_out"})


def ran_out(optuna_study: optuna.Study) -> dict[str, Any] | None:
    """The record of a budget that ran out before the confirmation's rounds, or None."""
    return StudyRecord.of(optuna_study).budget.get("ran_out") or None


def ran_out_text(optuna_study: optuna.Study) -> str | None:
    """ "unconfirmed: the budget ran out after 1 of 2 rounds; `autotune resume --hours 2.31` buys ..."."""
    record = ran_out(optuna_study)
    if record is None:
        return None
    spent = float(StudyRecord.of(optuna_study).budget.get("spent_h") or 0.0)
    rounds, of, round_h = int(record["rounds"]), int(record["of"]), float(record["round_h"])
    missing = of - rounds
    total = _up(spent + missing * round_h)
    return (
        f"unconfirmed: the budget ran out after {rounds} of {of} rounds; "
        f"`autotune resume --hours {total:.2f}` buys the {missing} round{'s' if missing != 1 else ''} left "
        f"({round_h:.2f} node h each)"
    )
