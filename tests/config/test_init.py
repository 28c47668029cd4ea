"""`autotune init`'s study writer: what config.json says of a model, the class that picks the shipped search
space, `nvidia-smi topo -m` read as real nvidia-smi prints it, and study files that load as `validate` loads
them (no process: the node side is tested in tests/test_init.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.config import load_study
from autotune.config.init import (
    InitError,
    ModelFacts,
    NodeFacts,
    check_fits,
    choose,
    default_port,
    held_knobs,
    model_facts,
    node_spec,
    parse_env,
    study_text,
)
from autotune.config.search_space import load_search_space
from autotune.dialect import committed_table
from autotune.errors import ConfigError
from autotune.node.inspect import slowest_link
from autotune.sim.nvidia_smi import topology
from autotune.sim.profiles import load_hardware_profile
from tests.builders import REPO

MODELS = REPO / "tests" / "data" / "models"
SIM = ["python", "-m", "autotune.sim.sglang_server"]
REAL = ["python3", "-m", "sglang.launch_server"]


def _model(name: str, *, index: int | None = None, files: int | None = None) -> ModelFacts:
    config = json.loads((MODELS / name / "config.json").read_text())
    return model_facts(str(MODELS / name), config, index_total_bytes=index, files_bytes=files)


def _node(gpus: int = 1, links: str | None = None, memory_mib: float = 143771.0) -> NodeFacts:
    return NodeFacts(
        name="local",
        address="local",
        gpus=gpus,
        gpu_name="NVIDIA H200",
        gpu_memory_mib=memory_mib,
        driver="580.159.04",
        links=links,
        sglang_version="0.5.17",
        flags=committed_table("0.5.17"),
    )


DENSE = _model("llama-3-8b-shape", index=14496047104, files=152)
MOE = _model("mixtral-8x7b-shape", index=93405585408, files=76)
DRAFT = _model("eagle3-draft", files=76)


def test_config_json_says_dense_or_moe_and_the_shape() -> None:
    assert (DENSE.architecture, DENSE.moe, DENSE.hidden_size, DENSE.layers, DENSE.kv_heads) == (
        "LlamaForCausalLM",
        False,
        4096,
        32,
        "8",
    )
    assert (MOE.architecture, MOE.experts) == ("MixtralForCausalLM", 8)
    assert DRAFT.eagle3 and not DENSE.eagle3


def test_deepseek_and_multimodal_configs() -> None:
    deepseek = model_facts(
        "/m",
        {
            "architectures": ["DeepseekV3ForCausalLM"],
            "hidden_size": 7168,
            "n_routed_experts": 256,
            "kv_lora_rank": 512,
            "num_key_value_heads": 128,
            "num_hidden_layers": 61,
            "auto_map": {"x": "y"},
        },
        index_total_bytes=None,
        files_bytes=None,
    )
    assert (deepseek.experts, deepseek.kv_heads, deepseek.remote_code, deepseek.weight_bytes) == (
        256,
        "MLA",
        True,
        None,
    )
    kimi = model_facts(
        "/m",
        {
            "architectures": ["KimiK25ForConditionalGeneration"],
            "text_config": {"hidden_size": 7168, "n_routed_experts": 384},
        },
        index_total_bytes=None,
        files_bytes=None,
    )
    assert (kimi.hidden_size, kimi.experts) == (7168, 384)


def test_the_index_total_size_is_the_weights_size_before_the_files() -> None:
    assert (DENSE.weight_bytes, DENSE.weight_source) == (
        14496047104,
        "the safetensors index's metadata.total_size",
    )
    assert (DRAFT.weight_bytes, DRAFT.weight_source) == (76, "the safetensors files' sizes")


@pytest.mark.parametrize(
    ("gpus", "model", "draft", "space"),
    [
        (1, DENSE, None, "one-gpu.yaml"),
        (1, MOE, None, "one-gpu.yaml"),
        (1, DENSE, DRAFT, "one-gpu-eagle3.yaml"),
        (8, DENSE, None, "multi-gpu.yaml"),
        (8, DENSE, DRAFT, "multi-gpu-eagle3.yaml"),
        (8, MOE, None, "multi-gpu-moe.yaml"),
        (8, MOE, DRAFT, "multi-gpu-moe-eagle3.yaml"),
    ],
)
def test_the_class_picks_a_shipped_space_and_the_written_study_loads(
    tmp_path: Path, gpus: int, model: ModelFacts, draft: ModelFacts | None, space: str
) -> None:
    node = _node(gpus, "NV18" if gpus > 1 else None)
    choice = choose(node, model, draft)
    assert choice.search_space == REPO / "search_spaces" / space
    names = set(load_search_space(choice.search_space).parameters)
    assert any(n.startswith("NCCL_") for n in names) == (gpus > 1)
    assert ("--ep-size" in names) == (gpus > 1 and model.moe)
    assert ("--speculative-algorithm" in names) == (draft is not None)
    out = tmp_path / "study.yaml"
    out.write_text(study_text(out=out, name="s", node=node, model=model, draft=draft, command=SIM, env={}))
    study = load_study(out)  # what `autotune validate` reads
    server = study.file.server
    assert study.search_space_path == choice.search_space
    assert server.flags.get("--tp-size") == (str(gpus) if gpus > 1 else None)
    assert server.draft_model_path == (draft.path if draft else None)
    assert study.file.nodes[0].nvidia_smi == ["python", "-m", "autotune.sim.nvidia_smi"]
    if gpus > 1:
        assert study.file.nccl_stage.hidden_size == 4096
        assert study.file.nccl_stage.command == ["python", "-m", "autotune.sim.nccl_job"]
        assert server.env["NCCL_NVLS_ENABLE"] == "0"  # NVLink: multicast off, as never_launch keeps it
    else:
        assert study.file.nccl_stage.hidden_size is None and "NCCL_NVLS_ENABLE" not in server.env


def test_gpu_machine_settings_only_where_they_apply(tmp_path: Path) -> None:
    out = tmp_path / "study.yaml"
    pcie = study_text(out=out, name="s", node=_node(8, "SYS"), model=DENSE, draft=None, command=REAL, env={})
    passed = study_text(
        out=out,
        name="s",
        node=_node(1),
        model=DENSE,
        draft=None,
        command=REAL,
        env={"PYTHONPATH": "/tmp/site"},
    )
    assert "NCCL_NVLS_ENABLE" not in pcie  # no NVSwitch, no multicast to keep off
    assert "nvidia_smi" not in pcie and "autotune.sim" not in pcie  # a real node's own nvidia-smi
    assert "nccl_stage: {hidden_size: 4096}" in pcie
    assert 'PYTHONPATH: "/tmp/site"   # given with --env' in passed
    assert "TRITON_CACHE_DIR" not in passed and "nccl_stage" not in passed


def test_the_simulated_node_runs_on_a_fast_clock_with_seeded_noise(tmp_path: Path) -> None:
    out = tmp_path / "study.yaml"
    sim = study_text(out=out, name="s", node=_node(1), model=DENSE, draft=None, command=SIM, env={})
    out.write_text(sim)
    env = load_study(out).file.server.env
    assert env["SGLANG_SIM_TIME_SCALE"] == "0.2" and env["SGLANG_SIM_STARTUP_TIME_SCALE"] == "0.001"
    assert "draws each trial's noise from this seed" in sim and "(SGLANG_SIM_SEED)" in sim
    clock = {"SGLANG_SIM_TIME_SCALE": "1"}
    given = study_text(out=out, name="s", node=_node(1), model=DENSE, draft=None, command=SIM, env=clock)
    assert 'SGLANG_SIM_TIME_SCALE: "1"' in given and '"0.2"' not in given  # --env's own clock is kept
    real = study_text(out=out, name="s", node=_node(1), model=DENSE, draft=None, command=REAL, env={})
    assert "SGLANG_SIM" not in real and "proposes the same first trials" in real


def test_a_simulated_study_takes_a_free_port_for_each_launch() -> None:
    # Two quickstarts or init-written simulated studies on one machine: no fixed port to collide on.
    assert default_port(SIM) == "auto" and default_port(REAL) == 30000
    for example in ("quickstart", "goodput", "max-load-slo"):
        study = load_study(REPO / "examples" / f"{example}.yaml")
        assert study.file.server.simulated and study.file.server.port == "auto", example


def test_a_secret_given_with_env_is_not_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "study.yaml"
    env = {"HF_TOKEN": "hf_abcdef123456", "PYTHONPATH": "/tmp/site"}
    out.write_text(
        study_text(out=out, name="s", node=_node(1), model=DENSE, draft=None, command=REAL, env=env)
    )
    assert "hf_abcdef123456" not in out.read_text()
    monkeypatch.setenv("HF_TOKEN", "hf_abcdef123456")
    study = load_study(out)  # the study reads it from the environment it runs in
    assert study.file.server.env == env and study.env_references == ("HF_TOKEN",)


def test_every_written_field_has_a_comment(tmp_path: Path) -> None:
    out = tmp_path / "study.yaml"
    text = study_text(out=out, name="s", node=_node(8, "NV18"), model=DENSE, draft=DRAFT, command=SIM, env={})
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if line.strip() and not line.lstrip().startswith(("#", "- ")) and ":" in line:
            before = lines[index - 1].lstrip()
            said = "#" in line or before.startswith("#") or line.rstrip().endswith(":")
            assert said, f"{line!r} has no comment"


def test_an_ssh_node_listens_where_the_driver_reaches_it(tmp_path: Path) -> None:
    out = tmp_path / "study.yaml"
    node = NodeFacts(**{**_node(1).__dict__, "name": "gpu1", "address": "ssh://root@gpu1:22"})
    spec = node_spec(node.address, out, key_file="/k")
    text = study_text(out=out, name="s", node=node, model=DENSE, draft=None, command=REAL, env={}, spec=spec)
    assert 'host: "0.0.0.0"' in text
    assert '{name: "gpu1", address: "ssh://root@gpu1:22", key_file: "/k"}' in text  # known_hosts: the default


def test_a_draft_that_is_not_eagle3_is_refused() -> None:
    with pytest.raises(InitError, match="not an EAGLE-3 head"):
        choose(_node(), DENSE, DENSE)


def test_weights_that_fill_the_gpus_are_refused() -> None:
    big = model_facts("/m", {"architectures": ["X"]}, index_total_bytes=int(600e9), files_bytes=None)
    with pytest.raises(InitError, match=r"600.0 GB\) do not fit on 1x NVIDIA H200"):
        check_fits(_node(1), big, None)
    check_fits(_node(8), big, None)  # 8x 150 GB holds them


def test_the_nodes_sglang_takes_every_knob_of_the_shipped_spaces() -> None:
    table = committed_table("0.5.17")
    assert table is not None
    for path in sorted((REPO / "search_spaces").glob("*gpu*.yaml")):
        assert held_knobs(load_search_space(path), table) == [], path.name


def test_a_knob_an_older_sglang_lacks_is_named(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("parameters:\n  --no-such-knob: {kind: sglang, type: int, low: 1, high: 4}\n")
    table = committed_table("0.5.17")
    assert table is not None
    assert [h.knob for h in held_knobs(load_search_space(space), table)] == ["--no-such-knob"]


def test_an_existing_study_is_kept_without_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "study.yaml"
    out.write_text("study: mine\n")
    assert main(["init", "--model", str(MODELS / "llama-3-8b-shape"), "--out", str(out)]) == 2
    assert out.read_text() == "study: mine\n"
    assert f"{out}: --out: the file exists" in capsys.readouterr().err


def test_cli_arguments_are_checked(tmp_path: Path) -> None:
    out = tmp_path / "study.yaml"
    assert parse_env(["PYTHONPATH=/a=b"], out) == {"PYTHONPATH": "/a=b"}
    with pytest.raises(ConfigError, match="--env: not KEY=VALUE"):
        parse_env(["PYTHONPATH"], out)
    with pytest.raises(ConfigError, match="--node: the address names no user"):
        node_spec("ssh://gpu1", out)
    with pytest.raises(ConfigError, match="--key-file: only an ssh:// node logs in"):
        node_spec("local", out, key_file="/k")
    spec = node_spec("ssh://root@gpu1:2222", out, key_file="k", known_hosts=None)
    assert (spec.name, spec.key_file) == ("gpu1", str(Path("k").resolve()))
    assert "known_hosts" not in spec.model_fields_set  # not written: the default


REAL_TOPOLOGY = (REPO / "benchmarks" / "gpu-run" / "env.txt").read_text()  # a real 2x H200's nvidia-smi
# `nvidia-smi topo -m` on the lent one-GPU H200 (2026-12-03), as it printed it.
REAL_ONE_GPU = (REPO / "tests" / "data" / "nvidia-smi" / "h200-x1-topo-m.txt").read_text()


def test_topology_as_real_nvidia_smi_prints_it() -> None:
    assert "\x1b[4mGPU0\tGPU1" in REAL_TOPOLOGY  # tabs and ANSI codes, as read from the machine
    assert slowest_link(REAL_TOPOLOGY) == "NV18"
    assert slowest_link(REAL_TOPOLOGY, [0]) is None


def test_the_simulated_topology_prints_as_the_real_one() -> None:
    nvlink = topology(load_hardware_profile("h200-nvlink-x8"))
    pcie = topology(load_hardware_profile("rtx-pro-6000-pcie-x8"))
    real_header = next(line for line in REAL_TOPOLOGY.splitlines() if "GPU0" in line)
    assert nvlink.splitlines()[0].replace("\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7", "") == real_header
    assert REAL_TOPOLOGY.split("Legend:")[1].startswith(nvlink.split("Legend:")[1])
    assert slowest_link(nvlink) == "NV18"
    assert (slowest_link(pcie), slowest_link(pcie, [0, 1])) == ("SYS", "PIX")  # four host bridges
    one = topology(load_hardware_profile("h200-x1"))
    assert slowest_link(one) is None and slowest_link(REAL_ONE_GPU) is None
    assert one.replace("0-31", "0-15") + "\n" == REAL_ONE_GPU  # all but the host's cores
