"""SGLang's launch_server command line as the simulated node parses and checks it, plus its log formats."""

from __future__ import annotations

import argparse

import pytest

from autotune.errors import ConfigError
from autotune.sim.logfmt import SimLog, format_interval, rank_prefix, tqdm_line
from autotune.sim.server_args import build_parser, check_server_args, server_args_repr
from autotune.sim.sglang_server import (
    DEFAULT_CRASH_AFTER_TOKENS,
    SimOptions,
    count_text_tokens,
    fake_token_id,
    sglang_environment,
)


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["--model-path", "moonshotai/Kimi-K2.5", *argv])


def test_defaults_match_sglang_0_5_4() -> None:
    ns = parse()
    assert (ns.host, ns.port, ns.tp_size, ns.dp_size, ns.ep_size) == ("127.0.0.1", 30000, 1, 1, 1)
    assert ns.mem_fraction_static is None and ns.cuda_graph_max_bs is None
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
    assert parse("--cuda-graph-max-bs", "128").cuda_graph_max_bs == 128
    assert parse("--cuda-graph-max-bs-decode", "64").cuda_graph_max_bs == 64  # 0.5.16's name
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
    assert "launch_server.py: error: unrecognized arguments: --no-such-flag 1" in capsys.readouterr().err


def test_missing_model_path_and_bad_choice_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([])
    assert exc.value.code == 2
    assert "the following arguments are required: --model-path/--model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse("--speculative-algorithm", "MEDUSA")
    assert "argument --speculative-algorithm: invalid choice: 'MEDUSA'" in capsys.readouterr().err


def test_topk_above_one_with_pages_needs_flashinfer() -> None:
    spec = (
        "--speculative-algorithm",
        "EAGLE",
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "4",
    )
    with pytest.raises(ValueError, match="only supported for the 'flashinfer' backend"):
        check_server_args(parse(*spec, "--speculative-num-draft-tokens", "8", "--page-size", "16"))
    check_server_args(parse(*spec, "--page-size", "16", "--attention-backend", "flashinfer"))
    check_server_args(parse(*spec, "--speculative-num-draft-tokens", "8"))  # page size 1 is fine


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
    assert check_server_args(parse("--speculative-algorithm", "EAGLE3", "--max-running-requests", "16")) == [
        "Overlap scheduler is disabled because of using eagle3 or standalone speculative decoding."
    ]


def test_deepep_warns_that_ep_follows_tp() -> None:
    warnings = check_server_args(parse("--tp", "8", "--moe-a2a-backend", "deepep"))
    assert warnings == [
        "DeepEP MoE is enabled. The expert parallel size is adjusted to be the same as the tensor "
        "parallel size[8]."
    ]


def test_server_args_repr_is_a_dataclass_repr() -> None:
    assert server_args_repr({"model_path": "m", "tp_size": 8, "mem_fraction_static": None}) == (
        "ServerArgs(model_path='m', tp_size=8, mem_fraction_static=None)"
    )


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


def test_sglang_0_5_4_overwrites_nccl_cumem_and_nvls() -> None:
    tuned = {"NCCL_CUMEM_ENABLE": "1", "NCCL_NVLS_ENABLE": "1", "NCCL_P2P_LEVEL": "SYS"}
    ran_with = sglang_environment(parse(), tuned)
    assert ran_with["NCCL_CUMEM_ENABLE"] == "0" and ran_with["NCCL_NVLS_ENABLE"] == "0"
    assert ran_with["NCCL_P2P_LEVEL"] == "SYS" and tuned["NCCL_CUMEM_ENABLE"] == "1"
    assert sglang_environment(parse("--enable-nccl-nvls"), {})["NCCL_NVLS_ENABLE"] == "1"
    symm = sglang_environment(parse("--enable-symm-mem"), tuned)
    assert symm["NCCL_CUMEM_ENABLE"] == "1" and symm["NCCL_NVLS_ENABLE"] == "1"
