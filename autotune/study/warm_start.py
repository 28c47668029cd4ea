"""A study started from an earlier one (`autotune run NEW.yaml --from OLD.yaml`: after an SGLang upgrade, a
new model revision, a new node of the same kind).

The earlier study's answer and its runner-up are queued as the new study's first trials after its baseline;
the values its nodes could not run are known on a node with the same GPUs before they are launched again
(`known_failures`, read when the driver starts: study.before_launch); its noise estimate stands in until the
new study measured its own (study.noise). Everything is checked before anything is written: a missing file
or store, an earlier study without an answer, a knob the new search space lacks or a value it does not take
is a ConfigError naming the file, the field, the value and the fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from autotune.config import Study, load_study
from autotune.errors import ConfigError
from autotune.study import optuna_internals
from autotune.study.enqueue import Queued, Request, plan, stored_study
from autotune.study.records import StudyRecord, marks, record_warm_start
from autotune.study.rules import direction_sign, measurement_groups
from autotune.study.storage import open_study
from autotune.study.trust.answer import study_answer
from autotune.study.trust.noise import noise_estimate

ROLES = ("answer", "runner-up")
# A node's GPUs in its hardware fingerprint (node.check.NodeReport.hardware): "8x NVIDIA H200 (140 GiB",
# without the driver, the SGLang version and its flag set, which an upgrade changes.
_GPUS = re.compile(r"\d+x [^(]+\(\d+ GiB")


def gpu_kind(hardware: str | None) -> str | None:
    """The GPUs part of a hardware fingerprint, or None when it has none."""
    found = _GPUS.match(hardware or "")
    return found.group(0) if found is not None else None


@dataclass(frozen=True)
class EarlierStudy:
    """What a new study takes from an earlier one: its configs to launch first, checked against the new
    search space, its noise estimate, and the values its nodes could not run (name, value, GPUs)."""

    path: Path
    name: str
    configs: tuple[tuple[str, int, Queued], ...]  # (role, its trial in the earlier study, the new config)
    noise: dict[str, Any] | None
    incompatible: tuple[tuple[str, object, str], ...]

    def record(self) -> dict[str, Any]:
        """The new study's record of it (StudyRecord.warm_start)."""
        return {
            "file": str(self.path),
            "study": self.name,
            "configs": [{"role": role, "trial": trial} for role, trial, _ in self.configs],
            "noise": self.noise,
            "incompatible": [list(pair) for pair in self.incompatible],
        }


def read_earlier(old_path: Path, new: Study) -> EarlierStudy:
    """The earlier study `old_path` names, checked for starting `new` from it; nothing is written."""
    if not old_path.is_file():
        raise ConfigError(
            old_path,
            "--from",
            str(old_path),
            "no such study file",
            "Pass the file of the study to start from (the one `autotune run` ran), e.g. --from old.yaml.",
        )
    old = load_study(old_path, for_launch=False)
    if old.name == new.name and old.storage == new.storage:
        raise ConfigError(
            new.path,
            "study",
            new.name,
            f"it is the study {old_path} names, in the same storage: --from starts another study",
            "Give the new study its own `study:` name.",
        )
    optuna_study = stored_study(old)
    if optuna_study is None:
        raise ConfigError(
            old_path,
            "storage",
            old.storage,
            f"no study {old.name!r} is stored there",
            "Run the earlier study first, or pass the file whose `study:` and `storage:` it ran with.",
        )
    answer = study_answer(optuna_study)
    if answer is None:
        raise ConfigError(
            old_path,
            "study",
            old.name,
            "the earlier study has no answer to start from (no feasible trial completed)",
            f"Run it until `autotune best {old_path}` answers, or start the new study without --from.",
        )
    trials = {t.number: t for t in optuna_study.get_trials(deepcopy=False)}
    server = StudyRecord.of(optuna_study).server_choices  # its baseline's choices, same node kind
    configs = []
    for role, number in zip(ROLES, _answer_and_runner_up(optuna_study, answer.leader), strict=False):
        trial = trials[number]
        params = {**optuna_internals.fixed_params(trial), **trial.params}
        configs.append((role, number, _checked(new, old_path, role, number, params, server)))
    noise = noise_estimate(optuna_study)
    pairs = StudyRecord.of(optuna_study).incompatible
    return EarlierStudy(
        old_path,
        old.name,
        tuple(configs),
        {"relative_sd": noise.relative_sd, "dof": noise.dof} if noise is not None and noise.dof else None,
        tuple(
            (str(pair[0]), pair[1], kind)
            for pair in pairs
            if len(pair) > 2 and (kind := gpu_kind(pair[2])) is not None
        ),
    )


def _answer_and_runner_up(optuna_study: optuna.Study, leader: int) -> list[int]:
    """The first trials of the answer's config (the best candidate, the leader) and of the best other
    candidate by its mean; the baseline's config is left out (the new study launches its own)."""
    sign = direction_sign(optuna_study.direction)
    groups = [g for g in measurement_groups(optuna_study) if not g.baseline and g.n]
    chosen = [g.of for g in groups if leader in (g.of, *g.trials)]
    others = sorted((g for g in groups if g.of not in chosen), key=lambda g: -sign * g.mean)
    return [*chosen[:1], *(g.of for g in others[:1])]


def _checked(
    new: Study, old_path: Path, role: str, number: int, params: dict[str, object], server: dict[str, float]
) -> Queued:
    """The earlier config as the new study launches it: every knob it sets is one of the new search space,
    with a value the new space takes there (enqueue.plan's checks)."""
    space = new.search_space
    for name, value in params.items():
        if name not in space:
            raise ConfigError(
                space.path,
                f"parameters.{name}",
                value,
                f"the earlier study's {role} (trial {number} of {old_path}) sets {name}, which this search "
                "space does not have",
                f"Add {name} to {space.path.name} as the earlier study had it, or start without --from.",
            )
    request = Request(params, None, space.path, f"the earlier study's {role} (trial {number})", "--from")
    try:
        return plan(new, request, [], server)
    except ConfigError as exc:
        raise ConfigError(
            exc.path, exc.field, exc.value, exc.problem, f"{exc.fix} Or start without --from."
        ) from None


def start_from(new: Study, earlier: EarlierStudy, *, accept_changes: bool = False) -> list[int]:
    """Create the new study (its baseline first) and queue the earlier study's configs after it; returns
    their trial numbers. A study that already started from `earlier` is left as it is (a second `run
    --from` resumes it); one with trials of its own is refused."""
    stored = stored_study(new)
    if stored is not None and stored.get_trials(deepcopy=False):
        if (StudyRecord.of(stored).warm_start or {}).get("study") == earlier.name:
            return []
        raise ConfigError(
            new.path,
            "study",
            new.name,
            f"the study already has {len(stored.get_trials(deepcopy=False))} trials: --from starts a new one",
            "Give the new study another `study:` name, or run it without --from to continue it.",
        )
    optuna_study = open_study(new, accept_changes=accept_changes)
    record_warm_start(optuna_study, earlier.record())
    numbers = []
    for role, number, queued in earlier.configs:
        mark = {"study": earlier.name, "trial": number, "role": role}
        optuna_study.enqueue_trial(dict(queued.params), user_attrs=marks(warm_start=mark))
        numbers.append(optuna_study.get_trials(deepcopy=False)[-1].number)
    return numbers


def known_failures(optuna_study: optuna.Study, hardware: str | None) -> list[tuple[str, object]]:
    """The values the earlier study's nodes could not run, where they had the GPUs of `hardware`."""
    record = StudyRecord.of(optuna_study).warm_start or {}
    kind = gpu_kind(hardware)
    if kind is None:
        return []
    return [(str(pair[0]), pair[1]) for pair in record.get("incompatible") or [] if pair[2] == kind]
