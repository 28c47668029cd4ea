"""Build SGLang's `server_args=` log lines (the *.log files here) from the real sglang wheels' field lists.

The test lines of tests/node/test_logwatch.py are not typed by hand: this takes ServerArgs' fields, in their
order, from each version's source (0.5.11, 0.5.17: a dataclass, logged as its repr; 0.5.19, 0.5.23:
`resolved_dict()`, logged as a dict, 0.5.23's fields spread over arg_groups/fields/), and the real
CudaGraphConfig/PhaseConfig (imported from 0.5.17's stdlib-only module; 0.5.19/0.5.23's fields read from
theirs). Fields autotune does not read get None or a plausible value.

    pip download sglang==0.5.17 --no-deps -d wheels && unzip -q wheels/*.whl -d src/0.5.17
    SGLANG_SRC=src python generate.py 0.5.17 [DECODE_MAX_BS [PREFILL_MAX_BS]] > 0.5.17.log
"""

import ast
import glob
import importlib.util
import os
import sys

R = os.environ.get("SGLANG_SRC", "src") + "/{v}/sglang/srt/"


def class_fields(path, cls_names=None):
    tree = ast.parse(open(path).read())
    out = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and (cls_names is None or node.name in cls_names):
            for item in node.body:
                if (
                    isinstance(item, ast.AnnAssign)
                    and isinstance(item.target, ast.Name)
                    and not item.target.id.startswith("_")
                ):
                    out.append(item.target.id)
    return out


def fields(v):
    if v != "0.5.23":
        return class_fields(R.format(v=v) + "server_args.py", {"ServerArgs"})
    names = []
    for f in sorted(glob.glob(R.format(v=v) + "arg_groups/fields/*.py")):
        names += class_fields(f)
    order = ast.literal_eval(
        next(
            n.value
            for n in ast.parse(open(R.format(v=v) + "arg_groups/field_order.py").read()).body
            if isinstance(n, (ast.Assign, ast.AnnAssign)) and "POSITIONAL" in ast.unparse(n)
        )
    )
    return list(dict.fromkeys([*order, *names]))


def cgc(v):
    if v in (
        "0.5.19",
        "0.5.23",
    ):  # their module imports sglang: the same dataclasses, built from their fields
        ph = [f for f in class_fields(R.format(v=v) + "model_executor/cuda_graph_config.py", {"PhaseConfig"})]
        defaults = dict(backend="disabled", tc_compiler="eager")

        class M:
            @staticmethod
            def PhaseConfig(**kw):
                return {f: kw.get(f, defaults.get(f)) for f in ph}

            @staticmethod
            def CudaGraphConfig(decode, prefill):
                return {"decode": decode, "prefill": prefill}

        return M
    spec = importlib.util.spec_from_file_location(
        f"cgc{v}", R.format(v=v) + "model_executor/cuda_graph_config.py"
    )
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


VALUES = dict(
    model_path="/models/Llama-3.1-70B-Instruct",
    tokenizer_path="/models/Llama-3.1-70B-Instruct",
    tp_size=8,
    mem_fraction_static=0.893,
    chunked_prefill_size=8192,
    host="127.0.0.1",
    port=30000,
    trust_remote_code=True,
    dtype="auto",
    attention_backend="fa3",
    torch_compile_max_bs=32,
    cuda_graph_bs=None,
    max_running_requests=None,
)


def line(v, decode_bs=512, prefill_bs=None, flat_decode=None):
    names = fields(v)
    vals = {n: VALUES.get(n) for n in names}
    if "cuda_graph_max_bs" in vals:
        vals["cuda_graph_max_bs"] = decode_bs
    if "cuda_graph_config" in vals:
        m = cgc(v)
        vals["cuda_graph_config"] = m.CudaGraphConfig(
            decode=m.PhaseConfig(backend="full", max_bs=decode_bs, bs=[1, 2, 4, 8, 12, 16, 24, 32]),
            prefill=m.PhaseConfig(backend="breakable", max_bs=prefill_bs),
        )
        vals["cuda_graph_max_bs_decode"] = flat_decode
        vals["cuda_graph_backend_decode"] = None
    if v in ("0.5.11", "0.5.17"):
        return "server_args=ServerArgs(" + ", ".join(f"{k}={val!r}" for k, val in vals.items()) + ")"
    return f"server_args={vals}"


if __name__ == "__main__":
    v = sys.argv[1]
    print(line(v, *[None if a == "None" else int(a) for a in sys.argv[2:]]))
