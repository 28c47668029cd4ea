"""What autotune stores on Optuna trials and studies: the attribute keys, in one place, and typed records.

`TrialRecord.of(trial)` and `StudyRecord.of(optuna_study)` read what was stored; the `record_*` functions
write it
and `marks(...)` builds the attributes a trial is queued with. No other module reads or writes an attribute
by its key. The stored strings never change: a study written by an earlier autotune still reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NotRequired, Protocol, TypedDict

from autotune.trial.failures import FailureKind

if TYPE_CHECKING:  # the CLI's console reads records too, without loading Optuna
    import optuna
    from optuna.trial import FrozenTrial

# A trial's user attributes.
FAILURE_KIND_ATTR = "failure_kind"  # a FailureKind value, or why a trial never launched
FAILURE_ATTR = "failure"  # the (redacted) line that says what went wrong
FAILURE_DESCRIPTION_ATTR = "failure_description"  # what that line means, in a sentence
ADVICE_ATTR = "advice"  # what to change, for the failure kind met
CULPRITS_ATTR = "culprits"  # the flags a failure names
MLFLOW_RUN_ATTR = "mlflow_run_id"
NODE_ATTR = "node"  # the node that ran the trial
NODE_S_ATTR = "node_s"  # the node's seconds on it: start-up and benchmark, or a job's run
HARDWARE_ATTR = "hardware"
DERIVED_ATTR = "derived"  # settings derived from the proposed ones
METRICS_ATTR = "metrics"  # the benchmark's measured metrics
LOAD_STOPPED_BY_ATTR = "load_stopped_by"
LOAD_WARNING_ATTR = "load_warning"  # a load search that ran out of steps before its tolerance
LOAD_DECIDED_ATTR = "load_decided"  # a load search's steps that stopped sending once decided
LOAD_BELOW_ATTR = "load_below"  # a load search stopped below its cutoff: the load its max_load lies below
LOAD_MISSED_ATTR = "load_missed"  # the load step missed just above the max_load: its limits broken, in flight
LOAD_BRACKET_ATTR = "load_bracket"  # the width of the bracket a load search ended in (its resolution)
SERVER_PGID_ATTR = "server_pgid"
SERVER_MEMORY_ATTR = "server_memory"
STARTUP_NOTES_ATTR = "startup_notes"  # what the node changed in the launch to start it faster, and why
STARTUP_PHASES_ATTR = "startup_phases"  # seconds per start-up phase (node.startup_phases)
ACCEPT_LENGTH_ATTR = "accept_length"  # tokens per speculative verify pass (avg_spec_accept_length)
# A workload that shares prefixes: its cache hit rate, designed sharing, turns' TTFT (prefix_cache_text)
PREFIX_CACHE_ATTR = "prefix_cache"

OVER_LIMITS_ATTR = "over_limits"  # metric -> {limit, measured, excess, concurrency} of each broken limit
SHORT_CUTOFF_ATTR = "short_cutoff"  # the short value below which the node was told to stop
SHORT_VALUE_ATTR = "short_value"
PRUNED_BY_ATTR = "pruned_by"
REMEASURE_OF_ATTR = "remeasure_of"
REMEASURE_SETTINGS_ATTR = "remeasure"  # the study's user attr: the settings its re-measurement ran with
BASELINE_ATTR = "baseline"
RETRY_OF_ATTR = "retry_of"
SKIPPED_ATTR = "skipped"  # proposed but never launched (known incompatible): costs no node time or budget
DRIVER_ATTR = "driver"
CONFIG_ATTR = "config"
ABLATION_OF_ATTR = "ablation_of"
ABLATION_PARAM_ATTR = "ablation_param"
SERVER_CHOICES_ATTR = "server_choices"  # a study attribute: what the server chose in the baseline
NVLINK_ATTR = "nvlink"  # a study attribute: every node's GPUs linked by NVLink pair by pair (the node checks)
QUEUED_ATTR = "queued"  # `autotune enqueue`: {set: the knobs a user set, from_trial: the rest from}
LAUNCH_ATTR = "launch"  # the launch's identity (study.rules.launch_identity): flags, and a digest of the rest
SAME_AS_ATTR = "same_as"  # proposed with the same launch as this earlier trial: recorded with its result
CONFIRM_ATTR = "confirm"  # a trial's: {round, position}; the study's: settings, configs
# A trial's: {id, round, position, config} of a `compare` round; the study's: every compare's {id, trial,
# rounds} (study.compare).
COMPARE_ATTR = "compare"
SCREEN_ATTR = "screen"  # a trial's: {knob: value}, a knob moved alone from the defaults (study.screening)
SCREENED_ATTR = "screened"  # a study attribute: knob -> {value, why}, held by screening (study.screening)
NCCL_STAGE_ATTR = "nccl_stage"  # a study attribute: the NCCL stage's held values (study.stages.StageResult)
STAGE_AFTER_KEY = "after_trials"  # in NCCL_STAGE_ATTR: the server trials that finished before the stage ran
STOPPED_ATTR = "stopped"  # a study attribute: why the search stopped early (study.stopping)
# A study attribute: the earlier study it started from (`run --from`: study.warm_start); a trial's: which
# of that study's configs it launches.
WARM_START_ATTR = "warm_start"
PROPOSED_ATTR = "autotune:proposed"  # a trial's system attribute: the move or repair that proposed it
INCOMPATIBLE_ATTR = "incompatible"  # a study attribute: [parameter, value, hardware] (study.incompatible)
BUDGET_ATTR = "node_budget"  # a study attribute: {hours, spent_h, ran_out: {rounds, of, round_h}}

_KINDS = frozenset(kind.value for kind in FailureKind)


class ConfirmMark(TypedDict):
    """A confirmation round's trial: its round and its place in the round's order (study.confirm)."""

    round: int
    position: NotRequired[int]  # a study confirmed before the order was recorded has none


class CompareMark(TypedDict):
    """A `compare` round's trial: which comparison, its round and place, and `default` or `best`."""

    id: int
    round: int
    position: int
    config: str


class Stopped(TypedDict):
    """Why the search stopped early, after which trial (study.stopping)."""

    why: str
    after_trial: int


class _Settable(Protocol):
    """A trial that takes user attributes: the live `optuna.Trial`, or `optuna_internals.StoredTrial` for one
    this process holds no `Trial` of."""

    def set_user_attr(self, key: str, value: Any) -> None: ...


class _SystemSettable(Protocol):
    def set_system_attr(self, key: str, value: Any) -> None: ...


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class TrialRecord:
    """What autotune stored on one trial, by name and type: read `TrialRecord.of(trial)`, never the keys."""

    user: Mapping[str, Any]
    system: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, trial: FrozenTrial | optuna.Trial) -> TrialRecord:
        """The record of a finished or live trial (a live one's attributes are read once, here)."""
        return cls(trial.user_attrs, getattr(trial, "system_attrs", {}))  # a live Trial shows none

    # -- how the trial came to be ---------------------------------------------------------------------
    @property
    def baseline(self) -> bool:
        """SGLang's own defaults, queued first."""
        return bool(self.user.get(BASELINE_ATTR))

    @property
    def retry_of(self) -> int | None:
        return _int(self.user.get(RETRY_OF_ATTR))

    @property
    def queued(self) -> Mapping[str, Any] | None:
        """`autotune enqueue`'s {set, from_trial}: a config a user queued by hand."""
        return self.user.get(QUEUED_ATTR) or None

    @property
    def remeasure_of(self) -> int | None:
        """The trial whose config this trial measures again."""
        return _int(self.user.get(REMEASURE_OF_ATTR))

    @property
    def ablation_of(self) -> int | None:
        return _int(self.user.get(ABLATION_OF_ATTR))

    @property
    def ablation_param(self) -> str | None:
        return _str(self.user.get(ABLATION_PARAM_ATTR))

    @property
    def confirm(self) -> ConfirmMark | None:
        """Its confirmation round, when it is one."""
        mark = self.user.get(CONFIRM_ATTR)
        if not isinstance(mark, Mapping):
            return None
        if "position" not in mark:
            return ConfirmMark(round=int(mark["round"]))
        return ConfirmMark(round=int(mark["round"]), position=int(mark["position"]))

    @property
    def compare(self) -> CompareMark | None:
        """Its `compare` round, when it is one."""
        mark = self.user.get(COMPARE_ATTR)
        if not isinstance(mark, Mapping):
            return None
        return CompareMark(
            id=int(mark["id"]),
            round=int(mark["round"]),
            position=int(mark["position"]),
            config=str(mark["config"]),
        )

    @property
    def screen(self) -> Mapping[str, Any] | None:
        """The knob moved alone from the defaults, {knob: value}, when screening queued it."""
        return self.user.get(SCREEN_ATTR)

    @property
    def warm_start(self) -> Mapping[str, Any] | None:
        """{study, trial, role}: the earlier study's config it runs again (`run --from`)."""
        return self.user.get(WARM_START_ATTR)

    @property
    def proposed(self) -> str | None:
        """The sampler's move or repair that proposed it (a system attribute)."""
        return _str(self.system.get(PROPOSED_ATTR))

    @property
    def deliberate(self) -> bool:
        """Asked for on purpose, not proposed by the sampler: the baseline (and its repeats), a
        re-measurement or confirmation round, a retry, an ablation, a config queued by hand. It runs even
        when its launch ran before, and is no trial of the search the stopping rule watches."""
        return self.baseline or any(
            key in self.user for key in (REMEASURE_OF_ATTR, QUEUED_ATTR, RETRY_OF_ATTR, ABLATION_OF_ATTR)
        )

    # -- its launch ------------------------------------------------------------------------------------
    @property
    def driver(self) -> str | None:
        """The driver that claimed it (study.storage)."""
        return _str(self.user.get(DRIVER_ATTR))

    @property
    def node(self) -> str | None:
        """The node it was launched on; None: never launched."""
        return _str(self.user.get(NODE_ATTR))

    @property
    def launched(self) -> bool:
        return NODE_ATTR in self.user

    @property
    def hardware(self) -> str | None:
        return _str(self.user.get(HARDWARE_ATTR))

    @property
    def derived(self) -> Mapping[str, Any]:
        return self.user.get(DERIVED_ATTR) or {}

    @property
    def launch(self) -> Any:
        """The launch's identity (study.rules.launch_identity), as stored."""
        return self.user.get(LAUNCH_ATTR)

    @property
    def skipped(self) -> bool:
        """Proposed but never launched: costs no node time nor budget."""
        return bool(self.user.get(SKIPPED_ATTR))

    @property
    def same_as(self) -> int | None:
        """The earlier trial with the same launch, whose result this one was told."""
        return _int(self.user.get(SAME_AS_ATTR))

    @property
    def node_s(self) -> float | None:
        """The node's seconds on it (start-up and benchmark, or a job's run); None: none recorded."""
        return _float(self.user.get(NODE_S_ATTR))

    @property
    def mlflow_run_id(self) -> str | None:
        return _str(self.user.get(MLFLOW_RUN_ATTR))

    @property
    def server_pgid(self) -> int | None:
        return _int(self.user.get(SERVER_PGID_ATTR))

    @property
    def server_memory(self) -> Mapping[str, float]:
        return self.user.get(SERVER_MEMORY_ATTR) or {}

    @property
    def server_choices(self) -> Mapping[str, Any]:
        """What the server chose for the flags left unset."""
        return self.user.get(SERVER_CHOICES_ATTR) or {}

    @property
    def startup_phases(self) -> Mapping[str, float]:
        """Seconds per start-up phase (node.startup_phases)."""
        return self.user.get(STARTUP_PHASES_ATTR) or {}

    @property
    def startup_notes(self) -> list[str]:
        return [str(n) for n in self.user.get(STARTUP_NOTES_ATTR) or []]

    # -- its measurement -------------------------------------------------------------------------------
    @property
    def metrics(self) -> Mapping[str, float]:
        """The benchmark's figures (a `compare` round's, or a job's metrics); empty when none were kept."""
        return self.user.get(METRICS_ATTR) or {}

    @property
    def over_limits(self) -> Mapping[str, Mapping[str, Any]]:
        """Each broken limit: metric -> {limit, measured, excess, concurrency, text}."""
        return self.user.get(OVER_LIMITS_ATTR) or {}

    @property
    def accept_length(self) -> float | None:
        return _float(self.user.get(ACCEPT_LENGTH_ATTR))

    @property
    def load_stopped_by(self) -> str | None:
        return _str(self.user.get(LOAD_STOPPED_BY_ATTR))

    @property
    def load_warning(self) -> str | None:
        return _str(self.user.get(LOAD_WARNING_ATTR))

    @property
    def load_decided(self) -> str | None:
        return _str(self.user.get(LOAD_DECIDED_ATTR))

    @property
    def load_bracket(self) -> float | None:
        return _float(self.user.get(LOAD_BRACKET_ATTR))

    @property
    def load_missed(self) -> Mapping[str, Any] | None:
        """The load step missed just above the max_load: `load`, `over` (requests over each SLO limit) and
        `in_flight` (requests running at once on average); None where the search recorded none."""
        value = self.user.get(LOAD_MISSED_ATTR)
        return value if isinstance(value, Mapping) else None

    @property
    def load_below(self) -> float | None:
        """The load a load search stopped below its cutoff missed at: the launch's max_load lies below it."""
        return _float(self.user.get(LOAD_BELOW_ATTR))

    @property
    def prefix_cache(self) -> Mapping[str, Any] | None:
        """{hit_rate, designed, ttft_first_turn_ms, ttft_later_turns_ms} (prefix_cache_text)."""
        return self.user.get(PREFIX_CACHE_ATTR) or None

    @property
    def short_cutoff(self) -> float | None:
        return _float(self.user.get(SHORT_CUTOFF_ATTR))

    @property
    def short_value(self) -> float | None:
        return _float(self.user.get(SHORT_VALUE_ATTR))

    @property
    def pruned_by(self) -> str | None:
        return _str(self.user.get(PRUNED_BY_ATTR))

    # -- its failure -----------------------------------------------------------------------------------
    @property
    def failure_kind_text(self) -> str | None:
        """The failure kind as stored (shown as is: a kind an older autotune wrote still reads)."""
        return _str(self.user.get(FAILURE_KIND_ATTR))

    @property
    def failure_kind(self) -> FailureKind | None:
        """What went wrong; None when nothing did, or the stored kind is one this autotune does not know."""
        text = self.failure_kind_text
        return FailureKind(text) if text is not None and text in _KINDS else None

    @property
    def failure(self) -> str | None:
        """The (redacted) line that says what went wrong."""
        return _str(self.user.get(FAILURE_ATTR))

    @property
    def failure_description(self) -> str | None:
        return _str(self.user.get(FAILURE_DESCRIPTION_ATTR))

    @property
    def advice(self) -> str | None:
        return self.user.get(ADVICE_ATTR) or None

    @property
    def culprits(self) -> list[str]:
        """The flags the failure names."""
        return [str(c) for c in self.user.get(CULPRITS_ATTR) or []]


@dataclass(frozen=True)
class StudyRecord:
    """What autotune stored on the study itself, by name and type: read `StudyRecord.of(optuna_study)`."""

    attrs: Mapping[str, Any]

    @classmethod
    def of(cls, optuna_study: optuna.Study) -> StudyRecord:
        """The study's attributes, read once from its storage."""
        return cls(optuna_study.user_attrs)

    @property
    def config(self) -> Mapping[str, Any]:
        """The study file as the study was created with it, and its history (study.storage)."""
        return self.attrs.get(CONFIG_ATTR) or {}

    @property
    def server_choices(self) -> dict[str, Any]:
        """What the server chose in the baseline for the flags left unset (a copy)."""
        return dict(self.attrs.get(SERVER_CHOICES_ATTR) or {})

    @property
    def nvlink(self) -> bool:
        """Whether the node checks found every node's GPUs linked by NVLink pair by pair (the NCCL stage's
        knobs: stages.stage_knobs)."""
        return bool(self.attrs.get(NVLINK_ATTR))

    @property
    def remeasure(self) -> Mapping[str, Any]:
        """The settings the study's re-measurement ran with (study.remeasure); empty before one."""
        return self.attrs.get(REMEASURE_SETTINGS_ATTR) or {}

    @property
    def confirm(self) -> Mapping[str, Any] | None:
        """The confirmation's settings, baseline, configs, rounds queued and `since` (study.confirm)."""
        return self.attrs.get(CONFIRM_ATTR)

    @property
    def confirming(self) -> bool:
        return CONFIRM_ATTR in self.attrs

    @property
    def compares(self) -> list[Mapping[str, Any]]:
        """Every `compare`'s {id, trial, rounds}, in order (study.compare)."""
        return list(self.attrs.get(COMPARE_ATTR) or [])

    @property
    def screened(self) -> Mapping[str, Mapping[str, Any]]:
        """knob -> {value, why}: the knobs screening held (study.screening)."""
        return self.attrs.get(SCREENED_ATTR) or {}

    @property
    def nccl_stage(self) -> Mapping[str, Any] | None:
        """The NCCL stage's held values and node seconds (study.stages.StageResult.record)."""
        stage = self.attrs.get(NCCL_STAGE_ATTR)
        return stage if isinstance(stage, Mapping) else None

    @property
    def stopped(self) -> Stopped | None:
        """Why the search stopped early, and after which trial; None: it did not."""
        record = self.attrs.get(STOPPED_ATTR)
        if not isinstance(record, Mapping):
            return None
        return Stopped(why=str(record.get("why") or ""), after_trial=int(record.get("after_trial", -1)))

    @property
    def incompatible(self) -> list[tuple[str, object, str | None]]:
        """The (parameter, value, hardware) pairs learned not to run (an older study's lack hardware)."""
        return [(e[0], e[1], e[2] if len(e) > 2 else None) for e in self.attrs.get(INCOMPATIBLE_ATTR, [])]

    @property
    def budget(self) -> Mapping[str, Any]:
        """The node-hour budget's {hours, spent_h, ran_out} (study.node_budget); empty before one."""
        return self.attrs.get(BUDGET_ATTR) or {}

    @property
    def warm_start(self) -> Mapping[str, Any] | None:
        """The earlier study this one started from (`run --from`, study.warm_start); None: none."""
        return self.attrs.get(WARM_START_ATTR)


# -- writing -----------------------------------------------------------------------------------------
def marks(
    *,
    baseline: bool = False,
    retry_of: int | None = None,
    queued: Mapping[str, Any] | None = None,
    remeasure_of: int | None = None,
    confirm: ConfirmMark | None = None,
    compare: CompareMark | None = None,
    screen: Mapping[str, Any] | None = None,
    ablation_of: int | None = None,
    ablation_param: str | None = None,
    warm_start: Mapping[str, Any] | None = None,
) -> dict[str, object]:
    """The user attributes a trial is queued with (`enqueue_trial(params, user_attrs=marks(...))`)."""
    given: dict[str, object] = {
        BASELINE_ATTR: True if baseline else None,
        RETRY_OF_ATTR: retry_of,
        QUEUED_ATTR: dict(queued) if queued else None,
        REMEASURE_OF_ATTR: remeasure_of,
        CONFIRM_ATTR: dict(confirm) if confirm is not None else None,
        COMPARE_ATTR: dict(compare) if compare is not None else None,
        SCREEN_ATTR: dict(screen) if screen is not None else None,
        ABLATION_OF_ATTR: ablation_of,
        ABLATION_PARAM_ATTR: ablation_param,
        WARM_START_ATTR: dict(warm_start) if warm_start is not None else None,
    }
    return {key: value for key, value in given.items() if value is not None}


def retry_marks(record: TrialRecord, number: int) -> dict[str, object]:
    """A retry of trial `number`: still the baseline, the user's queued config, a measurement of the same
    config in its round (re-measurement, confirmation)."""
    attrs = marks(retry_of=number, baseline=record.baseline, queued=record.queued)
    for kept in (REMEASURE_OF_ATTR, CONFIRM_ATTR):
        if kept in record.user:
            attrs[kept] = record.user[kept]
    return attrs


def _set(trial: _Settable, key: str, value: object) -> None:
    """Set `key` unless there is nothing to say (None, empty)."""
    if value is None or (isinstance(value, Mapping | list | tuple) and not value):
        return
    trial.set_user_attr(key, value)


def record_server(
    trial: _Settable,
    *,
    pgid: int | None,
    memory: Mapping[str, float],
    startup_phases: Mapping[str, float],
    startup_notes: Sequence[str],
    server_choices: Mapping[str, Any],
) -> None:
    """What the node said of the server it started."""
    _set(trial, SERVER_PGID_ATTR, pgid)
    _set(trial, SERVER_MEMORY_ATTR, dict(memory))
    _set(trial, STARTUP_PHASES_ATTR, dict(startup_phases))
    _set(trial, STARTUP_NOTES_ATTR, list(startup_notes))
    _set(trial, SERVER_CHOICES_ATTR, dict(server_choices))


def record_measurement(
    trial: _Settable,
    *,
    over_limits: Mapping[str, Mapping[str, Any]],
    accept_length: float | None,
    load_stopped_by: str | None,
    load_warning: str | None,
    prefix_cache: Mapping[str, Any] | None,
    load_decided: str | None = None,
    load_below: float | None = None,
    load_bracket: float | None = None,
    load_missed: Mapping[str, Any] | None = None,
) -> None:
    """What a measurement showed beside its value: broken limits, acceptance, the load search, the cache."""
    _set(trial, OVER_LIMITS_ATTR, {k: dict(v) for k, v in over_limits.items()})
    _set(trial, ACCEPT_LENGTH_ATTR, accept_length)
    _set(trial, LOAD_STOPPED_BY_ATTR, load_stopped_by)
    _set(trial, LOAD_WARNING_ATTR, load_warning)
    _set(trial, LOAD_DECIDED_ATTR, load_decided)
    _set(trial, LOAD_BELOW_ATTR, load_below)
    _set(trial, LOAD_BRACKET_ATTR, load_bracket)
    _set(trial, LOAD_MISSED_ATTR, dict(load_missed) if load_missed is not None else None)
    _set(trial, PREFIX_CACHE_ATTR, dict(prefix_cache) if prefix_cache is not None else None)


def record_metrics(trial: _Settable, metrics: Mapping[str, float]) -> None:
    trial.set_user_attr(METRICS_ATTR, dict(metrics))


def record_short(trial: _Settable, value: float) -> None:
    """The short measurement's objective value."""
    trial.set_user_attr(SHORT_VALUE_ATTR, value)


def record_short_cutoff(trial: _Settable, cutoff: float) -> None:
    """The short value below which the node was told to stop."""
    trial.set_user_attr(SHORT_CUTOFF_ATTR, cutoff)


def record_pruned_by(trial: _Settable, why: str) -> None:
    trial.set_user_attr(PRUNED_BY_ATTR, why)


def record_failure(
    trial: _Settable,
    kind: FailureKind,
    line: str | None = None,
    *,
    description: str | None = None,
    advice: str | None = None,
    culprits: Sequence[str] = (),
) -> None:
    """What went wrong: its kind, the line that says so, what it means, what to change, the flags it names."""
    trial.set_user_attr(FAILURE_KIND_ATTR, kind.value)
    _set(trial, FAILURE_ATTR, line)
    _set(trial, FAILURE_DESCRIPTION_ATTR, description)
    _set(trial, ADVICE_ATTR, advice)
    _set(trial, CULPRITS_ATTR, list(culprits))


def record_skipped(trial: _Settable) -> None:
    """Proposed but never launched: costs no node time nor budget."""
    trial.set_user_attr(SKIPPED_ATTR, True)


def record_same_as(trial: _Settable, earlier: FrozenTrial) -> None:
    """Never launched: the same launch as `earlier`, whose failure and broken limits it carries."""
    record_skipped(trial)
    trial.set_user_attr(SAME_AS_ATTR, earlier.number)
    for key in (FAILURE_KIND_ATTR, FAILURE_ATTR, OVER_LIMITS_ATTR):
        if key in earlier.user_attrs:
            trial.set_user_attr(key, earlier.user_attrs[key])


def record_driver(trial: _Settable, driver: str) -> None:
    trial.set_user_attr(DRIVER_ATTR, driver)


def record_mlflow_run(trial: _Settable, run_id: str) -> None:
    """Where a later driver finds the trial's run to close."""
    trial.set_user_attr(MLFLOW_RUN_ATTR, run_id)


def record_hardware(trial: _Settable, hardware: str) -> None:
    trial.set_user_attr(HARDWARE_ATTR, hardware)


def record_node(trial: _Settable, node: str, derived: Mapping[str, Any]) -> None:
    """The node a trial was launched on, and the settings derived from the proposed ones."""
    trial.set_user_attr(NODE_ATTR, node)
    _set(trial, DERIVED_ATTR, dict(derived))


def record_launch(trial: _Settable, identity: object) -> None:
    """The launch's identity (study.rules.launch_identity)."""
    trial.set_user_attr(LAUNCH_ATTR, identity)


def record_node_s(trial: _Settable, seconds: float) -> None:
    """The node's seconds on the trial, in the node's own clock (study.node_budget)."""
    trial.set_user_attr(NODE_S_ATTR, seconds)


def record_proposed(trial: _SystemSettable, why: str) -> None:
    """The sampler's move or repair that proposed `trial` (a system attribute, as samplers keep theirs)."""
    trial.set_system_attr(PROPOSED_ATTR, why)


def record_study_config(optuna_study: optuna.Study, record: Mapping[str, Any]) -> None:
    optuna_study.set_user_attr(CONFIG_ATTR, dict(record))


def record_nvlink(optuna_study: optuna.Study, nvlink: bool) -> None:
    optuna_study.set_user_attr(NVLINK_ATTR, nvlink)


def record_server_choices(optuna_study: optuna.Study, choices: Mapping[str, Any]) -> None:
    """SGLang's own values in the baseline: where the sampler starts the knobs with no "unset"."""
    optuna_study.set_user_attr(SERVER_CHOICES_ATTR, dict(choices))


def record_remeasure(optuna_study: optuna.Study, settings: Mapping[str, Any]) -> None:
    optuna_study.set_user_attr(REMEASURE_SETTINGS_ATTR, dict(settings))


def record_confirm(optuna_study: optuna.Study, settings: Mapping[str, Any]) -> None:
    optuna_study.set_user_attr(CONFIRM_ATTR, dict(settings))


def record_compares(optuna_study: optuna.Study, compares: Sequence[Mapping[str, Any]]) -> None:
    optuna_study.set_user_attr(COMPARE_ATTR, [dict(c) for c in compares])


def record_screened(optuna_study: optuna.Study, screened: Mapping[str, Mapping[str, Any]]) -> None:
    optuna_study.set_user_attr(SCREENED_ATTR, {k: dict(v) for k, v in screened.items()})


def record_nccl_stage(optuna_study: optuna.Study, record: Mapping[str, Any]) -> None:
    optuna_study.set_user_attr(NCCL_STAGE_ATTR, dict(record))


def record_stopped(optuna_study: optuna.Study, why: str, after_trial: int) -> None:
    optuna_study.set_user_attr(STOPPED_ATTR, {"why": why, "after_trial": after_trial})


def record_incompatible(optuna_study: optuna.Study, pairs: Sequence[tuple[str, object, str | None]]) -> None:
    optuna_study.set_user_attr(INCOMPATIBLE_ATTR, [list(pair) for pair in pairs])


def record_node_budget(optuna_study: optuna.Study, record: Mapping[str, Any]) -> None:
    optuna_study.set_user_attr(BUDGET_ATTR, dict(record))


def record_warm_start(optuna_study: optuna.Study, record: Mapping[str, Any]) -> None:
    optuna_study.set_user_attr(WARM_START_ATTR, dict(record))


def prefix_cache_text(record: Mapping[str, Any] | None) -> str | None:
    """One line for a trial's prefix cache (status, the report): what the server served from its cache
    beside what the workload shares, and sessions' TTFT of first and later turns. None: nothing to say."""
    if not record:
        return None
    hit, designed = record.get("hit_rate"), record.get("designed")
    parts = [
        "prefix cache: "
        + (
            f"{hit:.0%} of prompt tokens served from the server's cache"
            if hit is not None
            else "the server reported no cached tokens"
        )
        + (f" (the workload shares {designed:.0%})" if designed is not None else "")
    ]
    first, later = record.get("ttft_first_turn_ms"), record.get("ttft_later_turns_ms")
    if first is not None and later is not None:
        parts.append(f"TTFT first turns {first:.0f} ms, later turns {later:.0f} ms")
    return "; ".join(parts)
