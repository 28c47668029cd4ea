"""The study file's `trust` section: what a study does so that its answer can be trusted per GPU-hour.

Five parts, each on by default and each switchable (`off`): no launch of a config already launched
(`skip_same_launch`), the baseline measured again early in the search so the run-to-run noise is measured
(`repeat_baseline_after`), the winner confirmed against SGLang's defaults in interleaved rounds when the
search ends (`confirm`), a study that stops early when further trials are unlikely to beat the best
beyond that noise (`stop_early`), and knobs shown to have no effect beyond that noise held at SGLang's
default (`screen`). `trust: off` switches them all off (and `noise_ties`, off by default).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, model_validator

from autotune.config._yaml import rule_error, switch_or_section

PositiveInt = Annotated[StrictInt, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]


def _switch(value: Any, section: str, example: str) -> Any:
    return switch_or_section(
        value, f"Use `{section}: off` to switch it off, or a section: `{section}: {example}`."
    )


class Confirm(BaseModel):
    """When the search ends, the `top` configs and SGLang's defaults are launched again in interleaved rounds
    (the order alternating per round) until the leader's paired gain over the defaults has a `confidence`
    interval (Bonferroni over the `top` candidates and the rounds it is looked at, `min_rounds` to
    `max_rounds`) narrower than `target_pct` either side, or clear of zero, after `min_rounds`; at most
    `max_rounds`. With `pool_noise` the rounds' spread is pooled with the study's measured noise."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: StrictBool = True
    top: PositiveInt = 2
    # 1 only with `pool_noise` (one round's interval is the study's noise): benchmarks/RESULTS.md measured it
    # claiming a gain a machine change inside a round made (issue 37 item 4, second round).
    min_rounds: Annotated[StrictInt, Field(ge=1)] = 2
    max_rounds: Annotated[StrictInt, Field(ge=2)] = 6
    target_pct: Annotated[float, Field(gt=0)] = 1.0
    confidence: Annotated[float, Field(gt=0.5, lt=1)] = 0.95
    # The search's launches of the baseline and a candidate made one right after the other count as a round
    # (at most min_rounds - 1 of them: study.confirm.search_rounds); benchmarks/RESULTS.md, issue 37 item 4.
    pair_search_launches: StrictBool = True
    # Defaults that measured 0 in every launch (a max_load: no rate tried met the SLO) give no percent gain:
    # the rounds decide once the leader met the SLO in each of min_rounds where they measured 0 beside it.
    decide_at_no_rate: StrictBool = True
    # The leader's interval pools its pairs' own spread with the study's noise estimate from its other
    # launches (study.trust.confirm.pooled_gain), while the pairs spread no more than that noise predicts.
    pool_noise: StrictBool = True

    @model_validator(mode="before")
    @classmethod
    def _on_off(cls, value: Any) -> Any:
        return _switch(value, "confirm", "{top: 2, max_rounds: 6}")

    @model_validator(mode="after")
    def _rounds(self) -> Confirm:
        if self.min_rounds < 2 and not self.pool_noise:
            raise rule_error(
                "`min_rounds >= 2` must hold unless `pool_noise` is on (one round has no spread of its own)",
                loc=("min_rounds",),
                value=self.min_rounds,
                fix="Raise min_rounds to 2, or set `pool_noise: true` to judge a round by the study's noise.",
            )
        if self.min_rounds > self.max_rounds:
            raise rule_error(
                "`min_rounds <= max_rounds` must hold",
                loc=("min_rounds",),
                value=self.min_rounds,
                fix=f"Lower min_rounds to {self.max_rounds} or raise max_rounds.",
            )
        return self


MIN_PATIENCE = 8  # StopEarly.min_patience's default


class StopEarly(BaseModel):
    """After `min_trials` launched trials, the search stops when its last `patience` search trials did not
    improve the best by more than the measured noise band; it needs a noise estimate of `min_noise_dof`
    degrees of freedom (the baseline is repeated early that many times)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: StrictBool = True
    # Chosen by benchmarks/trust.py (RESULTS.md, "Trust"): 12 and 8 stopped the H200 profile's studies at
    # 0.867 of the best known (median of 5 seeds); 20 and 15 reach 0.954 and still stop a flat search at 18.
    min_trials: PositiveInt = 20
    patience: PositiveInt = 15
    # A patience that grows with the search: `min_patience` trials where the best was last raised early, up
    # to `patience` (study.trust.stopping; null: `patience` always). trust.py, 20 seeds a profile (RESULTS.md,
    # "The KV pool's shortfall"): the seed's node 2.41 -> 1.98 node h to a confirmed answer at 0.995 (min
    # 0.980), L40S 1.34 -> 1.10, others within 0.05; before the KV pool's probe (samplers._pool_short) 2 of
    # the seed's 20 stopped on a plateau at 0.846, which kept it off by default.
    min_patience: PositiveInt | None = MIN_PATIENCE
    # One pair of runs gives an SD anywhere from half to 16 times the true one (90%): too little to stop on.
    min_noise_dof: PositiveInt = 2
    # The rule in node hours beside the one in trials, whichever is met first (issue 37): after
    # `min_node_hours` of launches, stop when the last `patience_node_hours` of search launches did not raise
    # the best beyond the noise band (`patience_node_hours: null` switches it off). Sized on the seed's node
    # (0.2 node h a launch, its answer first launched at 2.8-4.7 h); benchmarks/RESULTS.md ("The stopping
    # rule in node hours"): 10 seeds, the seed's node 7.77 -> 6.63 node h at the same answers, others equal.
    min_node_hours: PositiveFloat | None = 2.5
    patience_node_hours: PositiveFloat | None = 2.0
    # A max_load study whose defaults met the SLO at the load search's `max` in their first two launches is
    # settled: no stage, search or round can measure more (H200 profile: 0.96 -> 0.26 node h; RESULTS-peers).
    at_load_max: StrictBool = True

    @model_validator(mode="before")
    @classmethod
    def _on_off(cls, value: Any) -> Any:
        value = _switch(value, "stop_early", "{min_trials: 20, patience: 15}")
        # A patience set below the default min_patience, which was left unset, is the patience it starts at.
        if isinstance(value, dict) and "min_patience" not in value:
            patience = value.get("patience")
            if isinstance(patience, int) and 0 < patience < MIN_PATIENCE:
                return {**value, "min_patience": patience}
        return value

    @model_validator(mode="after")
    def _patience(self) -> StopEarly:
        if self.min_patience is not None and self.min_patience > self.patience:
            raise rule_error(
                "`min_patience <= patience` must hold (the patience grows from the one to the other)",
                loc=("min_patience",),
                value=self.min_patience,
                fix=f"Lower min_patience to {self.patience} or below, or raise patience.",
            )
        return self


class Screen(BaseModel):
    """Knobs shown to have no effect beyond noise are held at SGLang's default
    (autotune.study.trust.screening): `min_pairs` launches moving a knob alone, to at least two values, all
    within the noise band of `min_noise_dof` degrees of freedom. `method`: `alone` moves each knob alone to
    its extremes right after the baseline (launches of its own); `moves` reads the one-knob moves the search
    makes anyway."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Chosen by benchmarks/trust.py (RESULTS.md, "knob screening"): `moves` stops flat searches after 9 or
    # 10 trials instead of 18 to 22 (node hours -6% to -44%), answers where gains exist worth about as much;
    # `alone` spent 17 launches on the seed's node before searching (9.4 node hours against 7.3, 0.93 of
    # the best known against 0.995).
    enabled: StrictBool = True
    method: Literal["alone", "moves"] = "moves"
    min_pairs: Annotated[StrictInt, Field(ge=2)] = 2
    min_noise_dof: PositiveInt = 2

    @model_validator(mode="before")
    @classmethod
    def _on_off(cls, value: Any) -> Any:
        return _switch(value, "screen", "{method: moves}")


class Trust(BaseModel):
    """The `trust` section of a study file (see the module's docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    skip_same_launch: StrictBool = True
    # The baseline launched again once this many trials were launched, and again after as many more while
    # the stopping rule needs more degrees of freedom (0: never; confirmation measures it again at the end).
    repeat_baseline_after: Annotated[StrictInt, Field(ge=0)] = 3
    # The default sampler's moves start from any config within the noise band of the best, not always from
    # the best single draw (study.noise.move_from). Off: benchmarks/trust.py measured it claiming a false
    # gain in 1 of 5 h200-x1 studies and lowering the worst seed's answer (seed 0.846 of the best known
    # against 0.995, h100x4 0.883 against 0.919), node hours within 3% (RESULTS.md, "knob screening").
    noise_ties: StrictBool = False
    confirm: Confirm = Field(default_factory=Confirm)
    stop_early: StopEarly = Field(default_factory=StopEarly)
    screen: Screen = Field(default_factory=Screen)

    @model_validator(mode="before")
    @classmethod
    def _all(cls, value: Any) -> Any:
        if value is False:  # `trust: off`: every part off
            return {
                "skip_same_launch": False,
                "repeat_baseline_after": 0,
                "noise_ties": False,
                "confirm": False,
                "stop_early": False,
                "screen": False,
            }
        if value is True:  # `trust: on`: the defaults
            return {}
        if value is None or isinstance(value, str | int | float | list):
            return _switch(value, "trust", "{confirm: {top: 2}}")  # the error
        return value
