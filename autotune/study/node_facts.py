"""What a run knows of its nodes, from their node checks (`NodePool.facts`): each node's hardware, the flags
its server takes and how it spells them (its dialect), and what its GPU cannot run, learned before the
first launch.
"""

from __future__ import annotations

from autotune.dialect import Dialect, FlagTable
from autotune.node.pool import NodePool
from autotune.study.before_launch import ignored_on_gpu, remember_known_failures
from autotune.study.callbacks import KnobHeld
from autotune.study.records import StudyRecord, record_nvlink
from autotune.study.run_state import RunState
from autotune.study.trust import screening


def flag_tables(pool: NodePool) -> list[FlagTable]:
    """The flags each idle node's server takes, where its node check learned them."""
    return [t for node in pool.idle_nodes() if (facts := pool.facts(node)) and (t := facts.server_flags)]


def hardware_of(run: RunState, pool: NodePool, node: str) -> str | None:
    """The hardware of `node` (None where its check did not say), kept in `run` for what a failure there
    teaches."""
    facts = pool.facts(node)
    hardware = facts.hardware if facts is not None else None
    run.hardware_by_node[node] = hardware
    return hardware


def dialect_of(run: RunState, pool: NodePool, node: str) -> Dialect | None:
    """How the server on `node` spells flags (from the node check), None where it was not learned."""
    facts = pool.facts(node)
    table = facts.server_flags if facts is not None else None
    if table is None:
        return None
    key = (table.version, table.digest)
    if key not in run.dialects:
        run.dialects[key] = Dialect(table, lambda text: run.observers.knob_held(KnobHeld(text)))
    return run.dialects[key]


def learn_nodes(run: RunState, pool: NodePool, *, remember_incompatible: bool) -> None:
    """Before the first launch: the flags' defaults and the hardware of the idle nodes, and (with
    `remember_incompatible`) what each node's GPU cannot run, told to the observers and to the sampler."""
    run.flag_defaults = screening.flag_defaults(flag_tables(pool))
    run.hardware = {hardware_of(run, pool, node) for node in pool.idle_nodes()}
    reports = {node: pool.facts(node) for node in pool.idle_nodes()}
    run.nvlink = bool(reports) and all(r is not None and r.nvlink for r in reports.values())
    if StudyRecord.of(run.optuna_study).nvlink != run.nvlink:  # status counts the stage's jobs by it
        record_nvlink(run.optuna_study, run.nvlink)
    ignored: list[tuple[dict[str, object], str | None]] = []
    for node in reports if remember_incompatible else ():
        facts, hardware = reports[node], run.hardware_by_node[node]
        notice = remember_known_failures(run.known, run.optuna_study, run.study.search_space, facts, hardware)
        if notice:
            run.observers.knob_held(KnobHeld(notice))
        ignored.append(ignored_on_gpu(run.study.search_space, facts))
    # Held where every node's GPU ignores the value (a node that runs it may still gain from it).
    first = ignored[0][0] if ignored else {}
    held = {name: value for name, value in first.items() if all(o.get(name) == value for o, _ in ignored)}
    if held:
        run.ignored = held
        run.observers.knob_held(KnobHeld(next(said for _, said in ignored if said)))
    run.optuna_study.sampler = run.current_sampler()
