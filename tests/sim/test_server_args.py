"""SGLang's launch_server command line as the simulated node parses and checks it, plus its log formats."""

from __future__ import annotations

import argparse

import pytest

from autotune.errors import ConfigError
from autotune.sim.logfmt import SimLog, format_interval, rank_prefix, tqdm_line
from autotune.sim.server_args import (
    CudaGraphConfig,
    PhaseConfig,
    build_parser,
    check_server_args,
    server_args_repr,
)
from autotune.sim.sglang_server import (
    DEFAULT_CRASH_AFTER_TOKENS,
    SimOptions,
    count_text_tokens,
    fake_token_id,
    sglang_environment,
)
from autotune.sim.versions import VERSIONS, sglang_version


def parse(*argv: str, version: str = "0.5.17") -> argparse.Namespace:
    return build_parser(version).parse_args(["--model-path", "moonshotai/Kimi-K2.5", *argv])


def test_defaults_match_sglang_0_5_17() -> None:
    ns = parse()
    assert (ns.host, ns.port, ns.tp_size, ns.dp_size, ns.ep_size) == ("127.0.0.1", 30000, 1, 1, 1)
    assert ns.mem_fraction_static is None and ns.cuda_graph_max_bs_decode is None
    assert ns.cuda_graph_backend_decode is None and ns.cuda_graph_backend_prefill is None
    assert ns.chunked_prefill_size is None and ns.max_running_requests is None
    assert (ns.schedule_policy, ns.schedule_conservativeness, ns.stream_interval) == ("fcfs", 1.0, 1)
    assert (ns.moe_a2a_backend, ns.moe_runner_backend, ns.kv_cache_dtype) == ("none", "auto", "auto")
    assert ns.attention_backend is None and ns.speculative_algorithm is None
    assert not ns.disable_cuda_graph and not ns.disable_custom_all_reduce and not ns.skip_server_warmup


def test_aliases_share_sglangs_destination_names() -> None:
    assert parse("--tp", "8").tp_size == 8
    assert parse("--tp-size", "4").tp_size == 4
    assert parse("--tensor-parallel-size", "2").tp_size == 2
    assert parse("--dp-size", "2").dp_size == 2
    assert parse("--ep-size", "8").ep_size == 8
    assert parse("--cuda-graph-max-bs", "128").cuda_graph_max_bs_decode == 128  # 0.5.17's deprecated alias
    assert parse("--cuda-graph-max-bs-decode", "64").cuda_graph_max_bs_decode == 64
    assert parse("--cuda-graph-max-bs-decode", "64", version="0.5.23").cuda_graph_max_bs_decode == 64
    assert parse("--mem-fraction-static", "0.55").mem_fraction_static == 0.55
    assert parse("--speculative-draft-model", "d").speculative_draft_model_path == "d"
    assert build_parser().parse_args(["--model", "m"]).model_path == "m"


def test_tuning_flags_parse_to_their_types() -> None:
    ns = parse(
        "--disable-custom-all-reduce",
        "--enable-flashinfer-allreduce-fusion",
        "--enable-torch-symm-mem",
        "--enable-mscclpp",
        "--enable-symm-mem",
        "--enable-nccl-nvls",
        "--enable-dp-attention",
        "--disable-cuda-graph",
        "--enable-metrics",
        "--trust-remote-code",
        "--chunked-prefill-size",
        "-1",
        "--schedule-conservativeness",
        "0.3",
        "--watchdog-timeout",
        "600",
        "--attention-backend",
        "flashinfer",
        "--moe-a2a-backend",
        "deepep",
        "--kv-cache-dtype",
        "fp8_e4m3",
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-num-steps",
        "3",
    )
    assert ns.disable_custom_all_reduce and ns.enable_flashinfer_allreduce_fusion and ns.enable_torch_symm_mem
    assert ns.enable_mscclpp and ns.enable_symm_mem and ns.enable_nccl_nvls and ns.enable_dp_attention
    assert ns.chunked_prefill_size == -1 and ns.schedule_conservativeness == 0.3
    assert ns.watchdog_timeout == 600.0 and ns.speculative_num_steps == 3


def test_unknown_flag_is_argparses_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse("--no-such-flag", "1")
    assert exc.value.code == 2
    assert "sglang serve: error: unrecognized arguments: --no-such-flag 1" in capsys.readouterr().err


def test_missing_model_path_and_bad_choice_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([])
    assert exc.value.code == 2
    assert "the following arguments are required: --model-path/--model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse("--attention-backend", "flash")
    # Real 0.5.17 on an H200 (shared/device-kit/README.md "Real failure lines").
    assert (
        "argument --attention-backend: invalid choice: 'flash' (choose from 'triton', "
        in capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        parse("--kv-cache-dtype", "fp4_e2m1", version="0.5.23")  # removed in 0.5.23 (reference C6)
    assert "invalid choice: 'fp4_e2m1'" in capsys.readouterr().err


def test_speculative_algorithm_is_free_text_checked_by_name() -> None:
    # speculative/spec_info.py:47-60: case-insensitive builtins, else a ValueError.
    check_server_args(parse("--speculative-algorithm", "eagle3"))
    with pytest.raises(ValueError, match=r"^Unknown speculative algorithm name: MEDUSA$"):
        check_server_args(parse("--speculative-algorithm", "MEDUSA"))
    # Printed by real 0.5.17 on an H200 (shared/device-kit/README.md "Real failure lines").
    with pytest.raises(
        ValueError, match=r"^DFLASH speculative decoding requires setting --speculative-draft-model"
    ):
        check_server_args(parse("--speculative-algorithm", "DFLASH"))


def test_token_counts_take_sglangs_human_readable_ints() -> None:
    # utils/common.py:2917-2952.
    assert parse("--context-length", "32k").context_length == 32000
    assert parse("--max-total-tokens", "1Mi").max_total_tokens == 1 << 20
    assert parse("--max-prefill-tokens", "25.6k").max_prefill_tokens == 25600


def test_topk_above_one_with_pages_needs_a_tree_capable_resolved_backend() -> None:
    spec = (
        "--speculative-algorithm",
        "EAGLE",
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "4",
    )
    # B5: SGLang 0.5.17 arg_groups/speculative_hook.py:667-681 checks the resolved backend.
    with pytest.raises(ValueError) as exc:
        check_server_args(parse(*spec, "--page-size", "16", "--attention-backend", "flashmla"))
    assert str(exc.value) == (
        "speculative_eagle_topk > 1 with page_size > 1 is only supported on ('flashinfer', 'fa3', 'triton'); "
        "got attention_backend='flashmla'. Use page_size == 1 or one of those backends."
    )
    for backend in ("flashinfer", "fa3", "triton"):
        check_server_args(parse(*spec, "--page-size", "16", "--attention-backend", backend))
    check_server_args(parse(*spec, "--page-size", "16"), attention_backend="triton")  # resolved for the GPU
    with pytest.raises(ValueError):
        check_server_args(parse(*spec, "--page-size", "16"), attention_backend="trtllm_mla")
    check_server_args(parse(*spec, "--speculative-num-draft-tokens", "8"))  # page size 1 is fine


def test_steps_without_topk_is_sglangs_type_error() -> None:
    # B6: `speculative_eagle_topk > 1` with topk unset (speculative_hook.py:673), both versions.
    for version in ("0.5.17", "0.5.23"):
        ns = parse("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", version=version)
        with pytest.raises(TypeError, match="'>' not supported between instances of 'NoneType' and 'int'"):
            check_server_args(ns)


def test_speculative_value_errors() -> None:
    with pytest.raises(ValueError, match="trtllm_mha backend only supports topk = 1"):
        check_server_args(
            parse(
                "--speculative-algorithm",
                "EAGLE3",
                "--speculative-num-steps",
                "3",
                "--speculative-eagle-topk",
                "2",
                "--attention-backend",
                "trtllm_mha",
            )
        )
    with pytest.raises(ValueError, match="standalone speculative decoding does not support dp attention"):
        check_server_args(parse("--speculative-algorithm", "STANDALONE", "--enable-dp-attention"))
    with pytest.raises(ValueError, match="ngram speculative decoding does not support dp attention"):
        check_server_args(parse("--speculative-algorithm", "NGRAM", "--enable-dp-attention"))
    with pytest.raises(AssertionError):  # topk without steps: SGLang's bare assert
        check_server_args(parse("--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "1"))


def test_speculative_warnings() -> None:
    warnings = check_server_args(
        parse(
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-num-steps",
            "3",
            "--speculative-eagle-topk",
            "1",
        )
    )
    assert any(w.startswith("Max running requests is reset to 48") for w in warnings)
    assert any("speculative_num_draft_tokens is adjusted" in w for w in warnings)
    assert check_server_args(parse()) == []
    # B1: spec v2 keeps the overlap scheduler; SGLang only notes it when the user turns it off
    # (speculative_hook.py:546-552).
    assert check_server_args(parse("--speculative-algorithm", "EAGLE3", "--max-running-requests", "16")) == []
    off = parse(
        "--speculative-algorithm", "EAGLE3", "--max-running-requests", "16", "--disable-overlap-schedule"
    )
    assert check_server_args(off) == [
        "Non-overlap (synchronous) spec v2 is used for eagle/eagle3/standalone speculative decoding."
    ]


def test_deepep_warns_that_ep_follows_tp() -> None:
    warnings = check_server_args(parse("--tp", "8", "--moe-a2a-backend", "deepep"))
    assert warnings == [
        "DeepEP MoE is enabled. The expert parallel size is adjusted to be the same as the tensor "
        "parallel size[8]."
    ]


def test_server_args_repr_is_0_5_17s_dataclass_and_0_5_23s_dict() -> None:
    graphs = CudaGraphConfig(
        decode=PhaseConfig("full", 512, [1, 2]), prefill=PhaseConfig("breakable", 8, [4, 8])
    )
    values = {"model_path": "m", "cuda_graph_max_bs_decode": None, "cuda_graph_config": graphs}
    # engine.py:1059 `logger.info(f"{server_args=}")` over the dataclasses of cuda_graph_config.py:88-131.
    assert server_args_repr(values, VERSIONS["0.5.17"]) == (
        "ServerArgs(model_path='m', cuda_graph_max_bs_decode=None, cuda_graph_config=CudaGraphConfig("
        "decode=PhaseConfig(backend='full', max_bs=512, bs=[1, 2], tc_compiler='eager', "
        "full_prefill_max_req=None, full_prefill_prefix_chunk_tokens=None), prefill=PhaseConfig("
        "backend='breakable', max_bs=8, bs=[4, 8], tc_compiler='eager', full_prefill_max_req=None, "
        "full_prefill_prefix_chunk_tokens=None)))"
    )
    # [23] engine.py:1185 logs `resolved_dict()`: a dict, the graph config a nested dict.
    assert server_args_repr(values, VERSIONS["0.5.23"]).startswith(
        "{'model_path': 'm', 'cuda_graph_max_bs_decode': None, "
        "'cuda_graph_config': {'decode': {'backend': 'full', "
    )


def test_0_5_17_takes_the_old_graph_flag_with_sglangs_deprecation_warning() -> None:
    ns = parse("--cuda-graph-max-bs", "128", "--disable-cuda-graph")
    # arg_groups/argparse_actions.py:98-110 through `print_deprecated_warning` (bold yellow).
    assert check_server_args(ns) == [
        "\033[1;33m'--cuda-graph-max-bs' is deprecated and will be removed in a future release. "
        "Use '--cuda-graph-max-bs-decode' instead.\033[0m",
        "\033[1;33m'--disable-cuda-graph' is deprecated and will be removed in a future release. "
        "Use '--cuda-graph-backend-{decode,prefill}=disabled' instead.\033[0m",
    ]


def test_0_5_23_rejects_the_old_graph_flag_as_argparse_does(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse("--cuda-graph-max-bs", "128", version="0.5.23")
    assert exc.value.code == 2
    # What SGLang 0.5.23's own parser printed for this command line (shared/reference/sglang-versions.md A1).
    assert capsys.readouterr().err.endswith(
        "sglang serve: error: ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, "
        "--cuda-graph-max-bs-prefill\n"
    )
    with pytest.raises(SystemExit):
        parse("--stream-output", version="0.5.23")
    assert "unrecognized arguments: --stream-output" in capsys.readouterr().err


def test_fusion_flag_is_deprecated_for_the_auto_backend() -> None:
    # server_args.py:3950-3959.
    assert check_server_args(parse("--enable-flashinfer-allreduce-fusion")) == [
        "--enable-flashinfer-allreduce-fusion is deprecated. "
        "Please use --flashinfer-allreduce-fusion-backend=auto instead."
    ]


def test_version_comes_from_sglang_sim_version() -> None:
    assert sglang_version({}).name == "0.5.17"
    assert sglang_version({"SGLANG_SIM_VERSION": "0.5.23"}).name == "0.5.23"
    with pytest.raises(ConfigError) as exc:
        sglang_version({"SGLANG_SIM_VERSION": "0.5.4"})
    message = str(exc.value)
    assert "SGLANG_SIM_VERSION" in message and "'0.5.4'" in message and "0.5.17, 0.5.23" in message


def test_rank_prefix_only_for_sizes_above_one() -> None:
    assert rank_prefix(0, 1) == ""
    assert rank_prefix(3, 8) == " TP3"
    assert rank_prefix(5, 8, dp_rank=1, dp_size=2) == " DP1 TP5"
    assert rank_prefix(5, 8, ep_size=8) == " TP5 EP5"


def test_tqdm_lines_look_like_sglangs() -> None:
    desc = "Loading safetensors checkpoint shards"
    assert tqdm_line(desc, 0, 64, 0.0) == f"{desc}:   0% Completed | 0/64 [00:00<?, ?it/s]"
    assert tqdm_line(desc, 12, 64, 114.0) == f"{desc}:  19% Completed | 12/64 [01:54<08:14,  9.50s/it]"
    assert format_interval(3725) == "1:02:05"


def test_log_level_hides_info_lines() -> None:
    import io

    stream = io.StringIO()
    log = SimLog(stream, "warning")
    log.info("hidden", " TP0")
    log.warning("shown", " TP1")
    log.uvicorn("access line")
    assert stream.getvalue().endswith(" TP1] shown\n") and "hidden" not in stream.getvalue()
    assert "access" not in stream.getvalue()


def test_sim_options_from_env() -> None:
    options = SimOptions.from_env(
        {"SGLANG_SIM_TIME_SCALE": "0.001", "SGLANG_SIM_FAULT": "slow_health, crash_benchmark:50"}
    )
    assert options.time_scale == 0.001 and options.faults == {"slow_health", "crash_benchmark"}
    assert options.crash_after_tokens == 50 and options.hardware == "rtx-pro-6000-pcie-x8"
    assert SimOptions.from_env({"SGLANG_SIM_FAULT": "crash_benchmark"}).crash_after_tokens == (
        DEFAULT_CRASH_AFTER_TOKENS
    )
    assert SimOptions.from_env({}, default_seed=7).seed == 7
    with pytest.raises(ConfigError, match=r"SGLANG_SIM_FAULT.*names no known fault"):
        SimOptions.from_env({"SGLANG_SIM_FAULT": "hang_loading"})
    with pytest.raises(ConfigError, match=r"SGLANG_SIM_TIME_SCALE.*must be positive"):
        SimOptions.from_env({"SGLANG_SIM_TIME_SCALE": "0"})
    with pytest.raises(ConfigError, match="is not a number"):
        SimOptions.from_env({"SGLANG_SIM_TIME_SCALE": "fast"})


def test_fake_tokenizer_is_deterministic() -> None:
    assert count_text_tokens("The capital city of France is") == 6
    assert count_text_tokens("") == 1
    assert [fake_token_id(i) for i in range(3)] == [fake_token_id(i) for i in range(3)]


def test_sglang_sets_nccl_cumem_and_nvls_only_when_unset() -> None:
    # B11: engine.py:1582-1591 ([23] 1898-1916): a tuned value takes effect.
    tuned = {"NCCL_CUMEM_ENABLE": "1", "NCCL_NVLS_ENABLE": "1", "NCCL_P2P_LEVEL": "SYS"}
    ran_with = sglang_environment(parse(), tuned)
    assert ran_with["NCCL_CUMEM_ENABLE"] == "1" and ran_with["NCCL_NVLS_ENABLE"] == "1"
    assert ran_with["NCCL_P2P_LEVEL"] == "SYS" and ran_with["CUDA_MODULE_LOADING"] == "AUTO"
    unset = sglang_environment(parse(), {})
    assert unset["NCCL_CUMEM_ENABLE"] == "0" and unset["NCCL_NVLS_ENABLE"] == "0"
    assert sglang_environment(parse("--enable-nccl-nvls"), {})["NCCL_NVLS_ENABLE"] == "1"
    symm = sglang_environment(parse("--enable-symm-mem"), tuned)
    assert symm["NCCL_CUMEM_ENABLE"] == "1" and symm["NCCL_NVLS_ENABLE"] == "1"


@pytest.mark.parametrize(
    ("version", "algorithm", "message"),
    [
        # SGLang 0.5.17 server_args.py:8721-8724.
        (
            "0.5.17",
            "EAGLE",
            "Pipeline parallelism is not compatible with overlap schedule, speculative decoding",
        ),
        # SGLang 0.5.23 arg_groups/validation_hook.py:131-137.
        (
            "0.5.23",
            "EAGLE3",
            "Pipeline parallelism currently only supports EAGLE (non-multi-layer) speculative",
        ),
    ],
)
def test_speculation_with_pipeline_parallelism_is_sglangs_assertion(
    version: str, algorithm: str, message: str
) -> None:
    ns = parse("--pp-size", "2", "--speculative-algorithm", algorithm, version=version)
    with pytest.raises(AssertionError) as exc:
        check_server_args(ns)
    assert str(exc.value).startswith(message)
    check_server_args(parse("--pp-size", "2", "--speculative-algorithm", "EAGLE", version="0.5.23"))


def test_0_5_23_deprecates_dp_attention_for_attn_dp_size() -> None:
    # [23] server_args.py:418-424 (DeprecatedStoreTrueAction).
    assert check_server_args(parse("--enable-dp-attention", version="0.5.23")) == [
        "\033[1;33m'--enable-dp-attention' is deprecated and will be removed in a future release. "
        "Use '--attn-dp-size <dp-size>' instead.\033[0m"
    ]
    assert parse("--enable-dp-attention", version="0.5.23").enable_dp_attention is True
    assert check_server_args(parse("--enable-dp-attention")) == []


def test_ngram_follows_sglangs_handle_ngram() -> None:
    """0.5.17 arg_groups/speculative_hook.py:684-753: draft tokens without steps (12 by default), topk
    from --speculative-ngram-max-bfs-breadth (10), which pages need flashinfer for."""
    warnings = check_server_args(parse("--speculative-algorithm", "NGRAM"))
    assert warnings == [
        "Max running requests is reset to 48 for speculative decoding. You can override this by explicitly "
        "setting --max-running-requests.",
        "speculative_num_draft_tokens is set to 12 by default for ngram speculative decoding. You can "
        "override this by explicitly setting --speculative-num-draft-tokens.",
        "The mixed chunked prefill are disabled because of using ngram speculative decoding.",
    ]
    drafted = parse("--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "8")
    assert not any("set to 12" in w for w in check_server_args(drafted))  # no steps needed
    paged = ("--speculative-algorithm", "NGRAM", "--page-size", "16", "--attention-backend")
    with pytest.raises(ValueError, match=r"speculative_eagle_topk\(10\) > 1 with page_size\(16\) > 1"):
        check_server_args(parse(*paged, "triton"))
    assert check_server_args(parse(*paged, "flashinfer"))
    narrow = parse(*paged, "triton", "--speculative-ngram-max-bfs-breadth", "1")
    assert check_server_args(narrow)
