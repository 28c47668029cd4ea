"""The simulated server's parser against the flag table dumped from the real SGLang of the same version.

For every flag a shipped search space or example study sets, the simulated `sglang serve` of each version
must take it exactly when that version's real parser does, with the same choices and the same value-taking,
so that a trial that parses (or dies in parsing) on the simulated node does the same on a real one.
"""

from __future__ import annotations

import argparse

import pytest
import yaml

from autotune.dialect import FlagTable, committed_table
from autotune.sim.server_args import build_parser
from autotune.sim.versions import VERSIONS
from tests.builders import REPO


def shipped_flags() -> set[str]:
    """The server flags the shipped search spaces tune and the example studies hold."""
    flags: set[str] = set()
    for space in sorted((REPO / "search_spaces").glob("*.yaml")):
        flags |= {k for k in yaml.safe_load(space.read_text())["parameters"] if k.startswith("--")}
    for study in sorted((REPO / "examples").glob("*.yaml")):
        server = yaml.safe_load(study.read_text()).get("server") or {}
        flags |= {k for k in server.get("flags") or {} if k.startswith("--")}
    return flags


def test_the_shipped_files_set_flags_to_check() -> None:
    flags = shipped_flags()
    assert {"--mem-fraction-static", "--cuda-graph-max-bs-decode", "--speculative-eagle-topk"} <= flags


def disagreements(table: FlagTable, parser: argparse.ArgumentParser, flags: set[str]) -> list[str]:
    """Where the parser and the real table disagree on `flags`: presence, value-taking, choices."""
    actions = parser._option_string_actions
    found = []
    for option in sorted(flags):
        real, sim = table.get(option), actions.get(option)
        if real is None or sim is None:
            if (real is None) != (sim is None):
                found.append(
                    f"{option}: taken by {'only the real' if sim is None else 'only the simulated'} parser"
                )
            continue
        if real.takes_value != (sim.nargs != 0):
            found.append(f"{option}: takes a value in one parser only")
        if real.choices is not None and sim.choices is not None:
            sim_choices = {str(c) for c in sim.choices}
            if set(real.choices) != sim_choices:
                found.append(f"{option}: choices {sorted(real.choices)} (real) vs {sorted(sim_choices)}")
    return found


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_the_simulated_parser_agrees_with_the_real_table(version: str) -> None:
    table = committed_table(version)
    assert table is not None, f"no committed flag table for SGLang {version}: scripts/dump_sglang_flags.py"
    found = disagreements(table, build_parser(version), shipped_flags())
    assert not found, f"SGLang {version}:\n" + "\n".join(found)


def test_a_disagreement_is_found() -> None:
    """A parser that spells a flag otherwise, takes no value, or offers other choices is caught."""
    table = committed_table("0.5.17")
    assert table is not None
    parser = argparse.ArgumentParser()
    parser.add_argument("--cuda-graph-max-bs-decodes", type=int)
    parser.add_argument("--disable-custom-all-reduce", type=str)
    parser.add_argument("--schedule-policy", choices=["lpm", "fcfs"])
    found = disagreements(
        table, parser, {"--cuda-graph-max-bs-decode", "--disable-custom-all-reduce", "--schedule-policy"}
    )
    assert [f.split(":")[0] for f in found] == [
        "--cuda-graph-max-bs-decode",
        "--disable-custom-all-reduce",
        "--schedule-policy",
    ]
