"""The server's dialect: committed SGLang flag tables, translating knobs into them, learning them on nodes."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from autotune.config.search_space import SpeculativeRules, load_search_space, parse_search_space
from autotune.dialect import (
    TABLES_DIR,
    Dialect,
    FlagTable,
    FlagTableError,
    Held,
    all_committed_tables,
    committed_table,
    committed_versions,
    load_table,
    table_from_help,
    unknown_flag,
)
from autotune.errors import ConfigError, ForbiddenLaunchError
from autotune.node.check import GPU, NodeReport, check_node
from autotune.node.runner import LocalCommandRunner
from autotune.trial.launch import TrialConfig, build_server_launch
from tests.builders import REPO, SIM_SERVER

SHIPPED = REPO / "search_spaces" / "sglang-nccl-eagle3.yaml"
SIM = tuple(SIM_SERVER)
STEPS, TOPK, DRAFT = SpeculativeRules.STEPS, SpeculativeRules.TOPK, SpeculativeRules.DRAFT_TOKENS
CONFIGS = 2000  # sampled through the real search space, its rules and Optuna's random sampler


def table(version: str) -> FlagTable:
    found = committed_table(version)
    assert found is not None, f"no committed table for SGLang {version}"
    return found


def parse_error(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """What SGLang's argparse would say about `argv` (None: it parses)."""
    messages: list[str] = []
    parser.error = messages.append  # type: ignore[method-assign,assignment]
    try:
        parser.parse_args(argv)
    except argparse.ArgumentError as exc:
        return str(exc)
    return messages[0] if messages else None


def shipped_configs(n: int = CONFIGS) -> Iterator[TrialConfig]:
    space = load_search_space(SHIPPED)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=7))
    for _ in range(n):
        trial = study.ask()
        yield space.suggest(trial)
        study.tell(trial, 0.0)


optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def configs() -> list[TrialConfig]:
    return list(shipped_configs())


# ---- the committed tables say what the real parsers say ----


def test_tables_are_committed_for_the_versions_autotune_is_checked_against() -> None:
    assert {"0.5.17", "0.5.23"} <= set(committed_versions())
    for version in committed_versions():
        assert table(version).version == version
        assert len(table(version).flags) > 400  # SGLang's whole parser, not a hand-picked list


def test_tables_hold_the_renames_read_from_sglang_source() -> None:
    # 0.5.17 srt/server_args.py:8315-8322: DeprecatedAliasStoreAction, new_flag="--cuda-graph-max-bs-decode"
    old = table("0.5.17").get("--cuda-graph-max-bs")
    assert old is not None and old.deprecated is not None
    assert old.deprecated.use == "--cuda-graph-max-bs-decode" and old.dest == "cuda_graph_max_bs_decode"
    # 0.5.23: gone; `--cuda-graph-max-bs` is only a prefix of two flags.
    assert "--cuda-graph-max-bs" not in table("0.5.23")
    assert {"--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill"} <= table("0.5.23").options
    # 0.5.17 server_args.py:8456-8459 help: "(Deprecated: use --flashinfer-allreduce-fusion-backend=auto)"
    fusion = table("0.5.17").get("--enable-flashinfer-allreduce-fusion")
    assert fusion is not None and fusion.deprecated is not None
    assert (fusion.deprecated.use, fusion.deprecated.value) == (
        "--flashinfer-allreduce-fusion-backend",
        "auto",
    )


def test_the_table_parser_refuses_what_real_sglang_0_5_23_refuses() -> None:
    # Real 0.5.23 (sglang-versions.md A1): "sglang serve: error: ambiguous option: --cuda-graph-max-bs could
    # match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill" (exit 2).
    error = parse_error(table("0.5.23").parser(), ["--cuda-graph-max-bs", "64"])
    assert error is not None and error.startswith("ambiguous option: --cuda-graph-max-bs could match")
    assert parse_error(table("0.5.17").parser(), ["--cuda-graph-max-bs", "64"]) is None
    assert parse_error(table("0.5.23").parser(), ["--attention-backend", "cutlass_mla"]) is not None
    assert parse_error(table("0.5.17").parser(), ["--attention-backend", "cutlass_mla"]) is None


# ---- every command line of the shipped search space parses on every committed version ----


@pytest.mark.parametrize("version", committed_versions())
def test_every_shipped_command_line_parses_on_every_version(version: str, configs: list[TrialConfig]) -> None:
    dialect = Dialect(table(version), notice=lambda text: None)
    parser = table(version).parser()
    spellings: set[str] = set()
    for config in configs:
        launch = build_server_launch(
            command=["sglang", "serve"],
            model_path="/models/m",
            config=config,
            host="127.0.0.1",
            port=30000,
            base_flags={"--tp-size": "8", "--trust-remote-code": None},
            draft_model_path="/models/draft" if config.flags.get(SpeculativeRules.ALGORITHM) else None,
            dialect=dialect,
        )
        argv = list(launch.argv[2:])
        assert parse_error(parser, argv) is None, (version, argv)
        spellings |= {token for token in argv if token.startswith("--")}
    assert "--cuda-graph-max-bs" not in spellings  # the deprecated (0.5.17) or ambiguous (0.5.23) name
    assert "--cuda-graph-max-bs-decode" in spellings
    assert "--enable-flashinfer-allreduce-fusion" not in spellings  # deprecated in both


def test_untranslated_command_lines_fail_on_0_5_23(configs: list[TrialConfig]) -> None:
    # The check above can fail: without the dialect most of these die in argument parsing on 0.5.23 when
    # the decode graph knob is spelled as the search space spelled it before 0.5.15's rename.
    parser = table("0.5.23").parser()
    old = {"--cuda-graph-max-bs-decode": "--cuda-graph-max-bs"}
    refused = [
        c
        for c in configs
        if parse_error(parser, [f for k, v in c.flags.items() for f in (old.get(k, k), v) if f])
    ]
    assert len(refused) > len(configs) // 2


# ---- translation ----


def test_a_knob_is_spelled_as_each_version_spells_it() -> None:
    for version in ("0.5.17", "0.5.23"):
        dialect = Dialect(table(version), notice=lambda text: None)
        for knob in ("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode"):  # old and canonical spelling
            assert dialect.translate_flag(knob, "64") == ("--cuda-graph-max-bs-decode", "64")
        assert dialect.translate_flag("--enable-flashinfer-allreduce-fusion", None) == (
            "--flashinfer-allreduce-fusion-backend",
            "auto",
        )
        assert dialect.translate_flag("--tp", "8") == ("--tp-size", "8")  # argparse's prefix, written out
        assert dialect.translate_flag("--mem-fraction-static", "0.8") == ("--mem-fraction-static", "0.8")


def test_a_knob_the_version_lacks_is_held_with_one_notice_per_study() -> None:
    notices: list[str] = []
    dialect = Dialect(table("0.5.23"), notice=notices.append)
    for _ in range(3):  # three trials
        translated = dialect.translate(
            {"--speculative-skip-dp-mlp-sync": None, "--attention-backend": "cutlass_mla", "--ep-size": "8"}
        )
        assert translated.flags == {"--ep-size": "8"}
        assert [h.knob for h in translated.held] == ["--speculative-skip-dp-mlp-sync", "--attention-backend"]
    assert len(notices) == 2
    assert notices[0] == (
        "--speculative-skip-dp-mlp-sync is held at its default on SGLang 0.5.23: "
        "SGLang 0.5.23 has no such flag (nor another name for it)"
    )
    assert notices[1].startswith(
        "--attention-backend is held at its default on SGLang 0.5.23: it does not take"
    )
    assert (
        Dialect(table("0.5.17"), notice=notices.append)
        .translate({"--speculative-skip-dp-mlp-sync": None})
        .held
        == ()
    )


def test_an_older_server_gets_the_switch_a_newer_flag_value_replaced() -> None:
    # A server from before --flashinfer-allreduce-fusion-backend (its --help lists only the switch).
    parser = argparse.ArgumentParser(prog="sglang serve")
    parser.add_argument("--enable-flashinfer-allreduce-fusion", action="store_true")
    parser.add_argument("--cuda-graph-max-bs", type=int)
    older = Dialect(table_from_help(parser.format_help(), "0.5.4", "help"), notice=lambda text: None)
    assert older.translate_flag("--flashinfer-allreduce-fusion-backend", "auto") == (
        "--enable-flashinfer-allreduce-fusion",
        None,
    )
    assert older.translate_flag("--cuda-graph-max-bs-decode", "64") == ("--cuda-graph-max-bs", "64")
    assert isinstance(older.translate_flag("--flashinfer-allreduce-fusion-backend", "trtllm"), Held)


def test_base_flags_are_translated_too() -> None:
    launch = build_server_launch(
        command=["sglang", "serve"],
        model_path="/m",
        config=TrialConfig(flags={"--cuda-graph-max-bs": "32"}),
        host="h",
        port=1,
        base_flags={"--cuda-graph-max-bs": "16"},
        dialect=Dialect(table("0.5.23")),
    )
    assert launch.argv.count("--cuda-graph-max-bs-decode") == 2 and "--cuda-graph-max-bs" not in launch.argv


def test_a_never_launch_flag_is_refused_under_its_translation_too() -> None:
    with pytest.raises(ForbiddenLaunchError, match="--enable-flashinfer-allreduce-fusion"):
        build_server_launch(
            command=["sglang", "serve"],
            model_path="/m",
            config=TrialConfig(flags={"--enable-flashinfer-allreduce-fusion": None}),
            host="h",
            port=1,
            never_launch_flags=["--enable-flashinfer-allreduce-fusion"],
            dialect=Dialect(table("0.5.17")),  # which writes --flashinfer-allreduce-fusion-backend auto
        )


# ---- the node learns its server's flags ----


@pytest.mark.integration
def test_help_output_becomes_a_table() -> None:
    done = subprocess.run([*SIM, "--help"], capture_output=True, text=True, timeout=120, check=True)
    learned = table_from_help(done.stdout, "0.5.4", "sim --help")
    backend = learned.get("--attention-backend")
    assert backend is not None and backend.choices is not None and "flashinfer" in backend.choices
    tp = learned.get("--tensor-parallel-size")
    assert tp is not None and tp.takes_value
    switch = learned.get("--disable-custom-all-reduce")
    assert switch is not None and not switch.takes_value
    assert "--help" not in learned


SERVER_WITHOUT_TABLE = """
import argparse
__version__ = "9.9.9"  # no committed table: the node check reads this server's --help
if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="sglang serve")
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--mem-fraction-static", type=float)
    parser.add_argument("--attention-backend", choices=["triton", "fa3"])
    parser.add_argument("--disable-custom-all-reduce", action="store_true")
    parser.parse_args()
"""


def test_real_sglang_help_gives_the_committed_table() -> None:
    # tests/data/sglang-0.5.23-help.txt: SGLang 0.5.23's own parser (ServerArgs.add_cli_args, loaded as the
    # dump script does) printed by argparse's format_help with COLUMNS=80, what `sglang serve --help` prints.
    text = (REPO / "tests" / "data" / "sglang-0.5.23-help.txt").read_text()
    learned, dumped = table_from_help(text, "0.5.23", "help"), table("0.5.23")
    hidden = {o for f in dumped for o in f.options if f.help_hidden}
    assert learned.options == dumped.options - hidden and len(hidden) == 2
    for option in learned.options:
        mine, real = learned.get(option), dumped.get(option)
        assert mine is not None and real is not None
        assert (mine.takes_value, mine.choices) == (real.takes_value, real.choices), option


@pytest.mark.integration
def test_node_check_learns_the_flags_from_help_and_keeps_them_in_the_fingerprint(tmp_path: Path) -> None:
    from autotune.sim.nvidia_smi import __file__ as nvidia_smi_sim

    (tmp_path / "server_9_9_9.py").write_text(SERVER_WITHOUT_TABLE)
    report = check_node(
        "n",
        LocalCommandRunner(),
        command=[sys.executable, "-m", "server_9_9_9"],
        env={"SGLANG_SIM_HARDWARE": "h200-nvlink-x8", "PYTHONPATH": str(tmp_path)},
        host="127.0.0.1",
        port=None,
        log_dir=str(tmp_path),
        nvidia_smi=(sys.executable, nvidia_smi_sim),
    )
    assert report.ok, report.problems
    assert report.server_version == "9.9.9" and report.server_flags is not None
    assert report.server_flags.options == {
        "--model-path",
        "--mem-fraction-static",
        "--attention-backend",
        "--disable-custom-all-reduce",
    }
    assert report.server_flags.source.endswith("server_9_9_9 --help")
    assert report.hardware is not None and report.hardware.endswith(
        f", SGLang 9.9.9, flags {report.server_flags.digest}"
    )
    dialect = Dialect(report.server_flags, notice=lambda text: None)
    assert dialect.translate_flag("--attention-backend", "flashinfer") == Held(
        "--attention-backend",
        "flashinfer",
        "9.9.9",
        "it does not take 'flashinfer' (it takes one of triton, fa3)",
    )


@pytest.mark.integration
def test_node_check_takes_the_committed_table_of_its_version(tmp_path: Path) -> None:
    # A server module that declares SGLang 0.5.23 and answers nothing: its --help is never run.
    (tmp_path / "fake_sglang.py").write_text(
        "__version__ = '0.5.23'\nif __name__ == '__main__':\n    exit(1)\n"
    )
    report = check_node(
        "n",
        LocalCommandRunner(),
        command=[sys.executable, "-m", "fake_sglang"],
        env={"PYTHONPATH": str(tmp_path)},
        host="127.0.0.1",
        port=None,
        log_dir=str(tmp_path),
        nvidia_smi=("no-nvidia-smi-here",),
    )
    assert report.server_version == "0.5.23"
    assert report.server_flags == table("0.5.23")


@pytest.mark.integration
def test_a_command_that_is_no_sglang_is_not_run_with_help(tmp_path: Path) -> None:
    # A job's command declares no version: asking its --help could start the job itself.
    marker = tmp_path / "ran"
    (tmp_path / "some_job.py").write_text(f"if __name__ == '__main__':\n    open({str(marker)!r}, 'w')\n")
    report = check_node(
        "n",
        LocalCommandRunner(),
        command=[sys.executable, "-m", "some_job"],
        env={"PYTHONPATH": str(tmp_path)},
        host="127.0.0.1",
        port=None,
        log_dir=str(tmp_path),
        nvidia_smi=("no-nvidia-smi-here",),
    )
    assert report.ok, report.problems
    assert report.server_flags is None and not marker.exists()


def test_the_fingerprint_changes_with_the_flag_set() -> None:
    gpus = (GPU(0, "NVIDIA H200", 143771.0, 143000.0, "580"),)
    older = NodeReport("n", gpus=gpus, server_version="0.5.23", server_flags=table("0.5.17"))
    newer = NodeReport("n", gpus=gpus, server_version="0.5.23", server_flags=table("0.5.23"))
    assert older.hardware != newer.hardware
    assert table("0.5.17").digest != table("0.5.23").digest


def test_a_broken_table_names_the_file_and_the_fix(tmp_path: Path) -> None:
    broken = tmp_path / "sglang-9.9.9.json"
    broken.write_text('{"flags": [{"dest": "x"}]}')
    with pytest.raises(
        FlagTableError, match=r"sglang-9\.9\.9\.json: not a flag table .*dump_sglang_flags\.py"
    ):
        load_table(broken)


@pytest.mark.integration
def test_dialect_stays_free_of_optuna_and_ray() -> None:
    code = "import sys, autotune.dialect, autotune.node.check; print({'optuna', 'ray'} & set(sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "set()"


def test_the_dump_script_needs_only_the_standard_library() -> None:
    source = (REPO / "scripts" / "dump_sglang_flags.py").read_text()
    assert "autotune" not in "".join(
        line for line in source.splitlines() if line.startswith(("import", "from"))
    )
    assert TABLES_DIR == REPO / "autotune" / "dialect" / "tables"


# SGLang 0.5.17's DefaultModelLoader, the lines the dump reads (sglang/srt/model_loader/loader.py).
_LOADER_0_5_17 = """
class DefaultModelLoader(BaseModelLoader):
    DEFAULT_NUM_THREADS = 8

    def __init__(self, load_config: LoadConfig):
        extra_config = load_config.model_loader_extra_config
        allowed_keys = {"enable_multithread_load", "num_threads"}

    def _get_weights_iterator(self, source):
        extra_config = self.load_config.model_loader_extra_config
        use_multithread = extra_config.get("enable_multithread_load", True)
"""


@pytest.mark.integration
def test_the_dump_writes_the_loaders_keys_and_defaults_read_from_sglangs_source(tmp_path: Path) -> None:
    # A table without them made autotune leave multithreaded loading off for that version.
    package = tmp_path / "src" / "sglang"
    (package / "srt" / "model_loader").mkdir(parents=True)
    for init in (package, package / "srt", package / "srt" / "model_loader"):
        (init / "__init__.py").write_text("")
    (package / "version.py").write_text('__version__ = "9.9.9"\n')
    (package / "srt" / "server_args.py").write_text(
        "class ServerArgs:\n    @staticmethod\n    def add_cli_args(parser):\n"
        "        parser.add_argument('--model-loader-extra-config', type=str, default='{}')\n"
    )
    (package / "srt" / "model_loader" / "loader.py").write_text(_LOADER_0_5_17)
    out = tmp_path / "sglang-9.9.9.json"
    script = REPO / "scripts" / "dump_sglang_flags.py"
    args = [sys.executable, str(script), "--sglang-path", str(tmp_path / "src"), "-o", str(out)]
    subprocess.run(args, check=True, capture_output=True, timeout=60)
    table = load_table(out)
    assert table.loader_defaults == {"enable_multithread_load": True, "num_threads": 8}
    assert table.loader_defaults == load_table(TABLES_DIR / "sglang-0.5.17.json").loader_defaults

    (package / "srt" / "model_loader" / "loader.py").write_text("class DefaultModelLoader:\n    pass\n")
    subprocess.run(args, check=True, capture_output=True, timeout=60)
    assert load_table(out).loader_defaults is None, "a version without the multithreaded loader"


# ---- the EAGLE draft tree (sglang-versions.md A4) ----


def test_no_shipped_config_overflows_the_draft_tree(configs: list[TrialConfig]) -> None:
    trees = 0
    for config in configs:
        flags = config.flags
        if DRAFT in flags and flags[TOPK] != "1":
            trees += 1
            steps, topk = int(flags[STEPS] or 0), int(flags[TOPK] or 0)
            assert int(flags[DRAFT] or 0) - 1 <= topk + (steps - 1) * topk**2, flags
        if STEPS in flags:
            assert TOPK in flags  # B6: steps without topk is a TypeError in SGLang
    assert trees > 100  # the rule was exercised


def test_the_tree_bound_is_sglangs() -> None:
    # 46 of 270 (steps 1-6, topk 2/4/8, draft 2-16) combos overflow (sglang-versions.md A4).
    combos = [(s, k, d) for s in range(1, 7) for k in (2, 4, 8) for d in range(2, 17)]
    assert sum(d > SpeculativeRules.max_draft_tokens(s, k) for s, k, d in combos) == 46
    assert SpeculativeRules.max_draft_tokens(1, 8) == 9 and SpeculativeRules.max_draft_tokens(2, 2) == 7


def spec_space(topk: dict[str, object], draft: dict[str, object]) -> dict[str, object]:
    when = {"--speculative-algorithm": "EAGLE3"}
    return {
        "parameters": {
            "--speculative-algorithm": {
                "kind": "speculative",
                "type": "categorical",
                "choices": [None, "EAGLE3"],
            },
            STEPS: {"kind": "speculative", "type": "int", "low": 1, "high": 6, "when": when},
            TOPK: {"kind": "speculative", "when": when, **topk},
            DRAFT: {"kind": "speculative", "when": when, **draft},
        }
    }


def test_a_space_that_could_set_steps_without_topk_is_refused() -> None:
    draft = {"type": "int", "low": 2, "high": 16}
    with pytest.raises(ConfigError, match="must not be null while --speculative-num-steps is tuned"):
        parse_search_space(spec_space({"type": "categorical", "choices": [None, 2, 4]}, draft))
    with pytest.raises(ConfigError, match=r"must be `type: int`"):
        parse_search_space(
            spec_space(
                {"type": "categorical", "choices": [2, 4]}, {"type": "categorical", "choices": [4, 16]}
            )
        )
    narrower = spec_space({"type": "categorical", "choices": [2]}, draft)
    narrower["parameters"][STEPS]["when"] = {"--speculative-algorithm": ["EAGLE3", "EAGLE"]}  # type: ignore[index]
    narrower["parameters"]["--speculative-algorithm"]["choices"] = [None, "EAGLE3", "EAGLE"]  # type: ignore[index]
    with pytest.raises(ConfigError, match="can be left unset while --speculative-num-steps is set"):
        parse_search_space(narrower)
    parse_search_space(spec_space({"type": "categorical", "choices": [1, 2]}, draft))  # the same `when`: fine


@pytest.mark.integration
def test_a_help_that_never_ends_leaves_the_flags_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server command whose --help outlasts the limit gives no flag table; the node check goes on."""
    from autotune.node import check as nodecheck

    monkeypatch.setattr(nodecheck, "HELP_TIMEOUT_S", 0.5)
    slow = [sys.executable, "-c", "import time; time.sleep(30)", "sglang.launch_server"]
    assert nodecheck.server_flags(LocalCommandRunner(), slow, {}, None) is None


def test_a_flag_is_unknown_only_when_no_known_version_has_it() -> None:
    tables = all_committed_tables()
    assert unknown_flag("--mem-fraction-statik", tables) == (
        "no SGLang version autotune knows (SGLang 0.5.17 to 0.5.23) has this flag",
        "Did you mean '--mem-fraction-static'?",
    )
    assert unknown_flag("--cuda-graph-max-bs", tables) is None, "0.5.17 and 0.5.19 have it"
    assert unknown_flag("--tp", tables) is None, "argparse expands a unique prefix"
    # The node's own table, read from a newer SGLang's --help, knows its new flags.
    newer = table_from_help("  --enable-new-thing    a flag of a newer SGLang\n", "0.6.0", "--help")
    assert unknown_flag("--enable-new-thing", tables) is not None
    assert unknown_flag("--enable-new-thing", [*tables, newer]) is None
