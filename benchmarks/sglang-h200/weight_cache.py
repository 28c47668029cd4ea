#!/usr/bin/env python3
"""SGLang 0.5.17's weight cache daemon on the lent H200: what a restart saves, what it does to the KV pool.

`python -m sglang.srt.weight_cache.daemon` loads a model's weights once and holds them in GPU memory; a
server started with `--weight-cache-mode client` maps them over CUDA IPC instead of reading the
checkpoint. SGLang sizes the KV pool as (free after load) - (free before load) x (1 - f), f being
--mem-fraction-static: a client's "free before load" already lacks the daemon's weights and its load adds
nothing, so at the same f its pool is about W x (1 - f) larger than a disk-loaded server's and its
headroom smaller. At f' = (T x f - W + W_c) / T_c (T: the disk-loaded server's free memory before its
load, W: its weights' mem usage, T_c and W_c the same of the client, W_c about 0) the client should get
the same pool, and the headroom T x (1 - f) less the daemon's own overhead. Steps, one row each:

    normal           a disk-loaded server (weights in the page cache), f = 0.85, then a short bench
    daemon           the weight cache daemon (tp 1): seconds to its ready file, the GPU memory it holds
    client-0.85      a client at f = 0.85: its load (the IPC fetch), ready, KV tokens, bench
    client-fprime    a client at f' from normal's T and W and client-0.85's T_c: the same KV tokens?
    client-again     (if time is left) a client at 0.85 again: a warm restart's time to ready
    daemon-stop      the daemon stopped: is its GPU memory freed?

Each row goes to $OUT/weight_cache.jsonl as it is measured, the table to $OUT/weight_cache.txt (rewritten
after each row), the logs of normal, daemon, client-0.85 and client-fprime to $OUT (client-again's to the
scratch folder: 8 files come back).

    PYTHONPATH=<checkout>:/tmp/site python3 benchmarks/sglang-h200/weight_cache.py --model /tmp/model-8b
    python3 benchmarks/sglang-h200/weight_cache.py --check SERVER_LOG   # the log reading alone, no GPU
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from startup_h200 import KV_TOKENS, bench, read_into_page_cache, resident_share, shards, start, stop

from autotune.trial.startup import compile_cache_env

GIB = 1 << 30
F = 0.85  # the --mem-fraction-static of the normal server and of the first client
THREADS = 8  # SGLang 0.5.17's default loader (multithreaded, 8 threads), given to the daemon too
PORT = 30000
# SGLang's own paths for rank 0 (weight_cache/protocol.py: WEIGHT_CACHE_{SOCKET,READY}_TEMPLATE)
DAEMON_SOCKET = Path("/tmp/sglang_weight_cache_rank0.sock")
DAEMON_READY = Path("/tmp/sglang_weight_cache_rank0.ready")
# Seconds each later step is planned at (a warm-JIT 8B start took 55-74 s on this machine): the normal
# server's start may use what is left after them, a step starts only when its own estimate fits.
EST_S = {"daemon": 60, "client": 80, "again": 70, "daemon-stop": 25}

SERVER_F = re.compile(r"mem_fraction_static=([0-9.]+)")
LOAD_BEGIN = re.compile(r"Load weight begin\. avail mem=([0-9.]+) GB")
LOAD_END = re.compile(
    r"Load weight end\. elapsed=([0-9.]+) s,.* avail mem=([0-9.]+) GB, mem usage=(-?[0-9.]+) GB"
)
KV_SIZE = re.compile(r"KV Cache is allocated\..*K size: ([0-9.]+) GB, V size: ([0-9.]+) GB")
POOL_END = re.compile(r"Memory pool end\. avail mem=([0-9.]+) GB")
FINAL = re.compile(r"max_total_num_tokens=(\d+),.*available_gpu_mem=([0-9.]+) GB")
IPC_FETCHED = re.compile(r"\[IpcModelLoader\] Fetched (\d+) IPC handles from daemon in ([0-9.]+)s")
IPC_LOADED = re.compile(r"\[IpcModelLoader\] Loaded model via IPC .*total=([0-9.]+)s")
IPC_FELL_BACK = "falling back to disk load"
DAEMON_LOADED = re.compile(r"Model loaded from disk in ([0-9.]+)s")
DAEMON_EXPORTED = re.compile(r"Exported (\d+) tensors \((\d+) non-persistent buffers\)")


class Terminated(BaseException):  # no `except Exception` on the way may swallow it
    """SIGTERM (the shell's `timeout`): unwinds to the finally that stops every process started."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Terminated(f"signal {signum}")


def matched_fraction(
    t_gb: float, w_gb: float, t_client_gb: float, f: float, w_client_gb: float = 0.0
) -> float:
    """The --mem-fraction-static at which a weight-cache client gets the KV pool of a disk-loaded server at
    `f`: that server's pool is T x f - W (T free before its load, W its weights' mem usage), the client's
    T_c x f' - W_c (its load's mem usage W_c is about 0: the weights are the daemon's, already missing
    from T_c). So f' = (T x f - W + W_c) / T_c."""
    if min(t_gb, t_client_gb) <= 0 or not 0 < f < 1:
        raise ValueError(f"no matched fraction for T={t_gb} GB, T_c={t_client_gb} GB, f={f}")
    matched = (t_gb * f - w_gb + w_client_gb) / t_client_gb
    if not 0 < matched < 1:
        raise ValueError(
            f"matched fraction (T x f - W + W_c) / T_c = ({t_gb} x {f} - {w_gb} + {w_client_gb})"
            f" / {t_client_gb} = {matched:.4f} is outside (0, 1): wrong readings, or weights that do not fit"
        )
    return matched


def kv_cell_bytes(model: Path) -> int:
    """KV bytes per token of a bf16 MHA/GQA checkpoint: layers x KV heads x head dim x (K, V) x 2 bytes."""
    c = json.loads((model / "config.json").read_text())
    heads = c["num_attention_heads"]
    head_dim = c.get("head_dim") or c["hidden_size"] // heads
    return int(c["num_hidden_layers"] * c.get("num_key_value_heads", heads) * head_dim * 2 * 2)


def predicted_kv_tokens(pre_gb: float, after_load_gb: float, f: float, cell_bytes: int) -> int:
    """SGLang 0.5.17's pool (kv_cache_configurator._profile_available_bytes): the free memory the load
    left, less the free memory before it x (1 - f); from the log's GB (GiB, 2 decimals: +-100 tokens)."""
    return int((after_load_gb - pre_gb * (1 - f)) * GIB) // cell_bytes


def read_server_log(text: str) -> dict[str, Any]:
    """The memory and loading figures a server's log gives (GB as SGLang logs them: GiB)."""
    got: dict[str, Any] = {}
    if m := SERVER_F.search(text):
        got["f_logged"] = float(m.group(1))
    if m := LOAD_BEGIN.search(text):
        got["free_before_load_gb"] = float(m.group(1))
    if m := LOAD_END.search(text):
        got["load_s"], got["free_after_load_gb"], got["weights_gb"] = (float(g) for g in m.groups())
    if m := KV_TOKENS.search(text):
        got["kv_tokens_allocated"] = int(m.group(1))
    if m := KV_SIZE.search(text):
        got["kv_gb"] = round(float(m.group(1)) + float(m.group(2)), 2)
    if m := POOL_END.search(text):
        got["free_after_pool_gb"] = float(m.group(1))
    if m := FINAL.search(text):
        got["kv_tokens"], got["headroom_gb"] = int(m.group(1)), float(m.group(2))
    if m := IPC_FETCHED.search(text):
        got["ipc_handles"], got["ipc_fetch_s"] = int(m.group(1)), float(m.group(2))
    if m := IPC_LOADED.search(text):
        got["ipc_load_s"] = float(m.group(1))
    got["fell_back_to_disk"] = IPC_FELL_BACK in text
    return got


def nvidia_smi(*query: str) -> str:
    try:
        done = subprocess.run(["nvidia-smi", *query], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"nvidia-smi failed: {e}"
    return (done.stdout + done.stderr).strip()


def gpu_used_mib() -> int | None:
    first = nvidia_smi("--query-gpu=memory.used", "--format=csv,noheader,nounits").splitlines()[:1]
    return int(first[0]) if first and first[0].strip().isdigit() else None


def app_mib(apps: str, pid: int) -> int | None:
    """`pid, used_memory` rows (--query-compute-apps, csv,noheader): the MiB of `pid`, if listed (a
    container may show other pids or none)."""
    for line in apps.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            return int(parts[1].split()[0]) if parts[1].split()[0].isdigit() else None
    return None


def wait_gpu_used_at_most(limit_mib: int, timeout_s: float) -> int | None:
    """Polls the GPU's used memory until it is at most `limit_mib` (a stopped process's memory freed)."""
    began, used = time.monotonic(), gpu_used_mib()
    while used is not None and used > limit_mib and time.monotonic() - began < timeout_s:
        time.sleep(0.5)
        used = gpu_used_mib()
    return used


def our_children() -> list[int]:
    """Live children of this process (each started in its own session: pid = process group)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[1] == str(os.getpid()) and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def stop_group(proc: subprocess.Popen[bytes], timeout_s: float = 20) -> None:
    """startup_h200.stop (SIGTERM to the group, SIGKILL after 30 s), then waits for the whole group."""
    stop(proc)
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.3)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def ping_daemon(path: Path = DAEMON_SOCKET) -> bool:
    """The daemon's own `ping` (weight_cache/protocol.py: a 4-byte length, then a pickle)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(str(path))
            data = pickle.dumps({"type": "ping"})
            s.sendall(struct.pack("!I", len(data)) + data)
            buf = b""
            while len(buf) < 4 or len(buf) < 4 + struct.unpack("!I", buf[:4])[0]:
                chunk = s.recv(65536)
                if not chunk:
                    return False
                buf += chunk
            reply = pickle.loads(buf[4:])  # the daemon's own reply on this machine's socket
            return isinstance(reply, dict) and reply.get("status") == "ok"
    except OSError:
        return False


def start_daemon(
    model: Path, log: Path, env: dict[str, str], timeout_s: float
) -> tuple[subprocess.Popen[bytes], float | None]:
    """One daemon for rank 0 (single-rank mode: the process itself loads and serves); ready when SGLang's
    ready file names its pid, which the daemon writes once its socket listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dist_port = s.getsockname()[1]
    argv = [
        sys.executable, "-m", "sglang.srt.weight_cache.daemon", "--model-path", str(model),
        "--gpu-id", "0", "--tp-size", "1", "--tp-rank", "0", "--dist-init-method", f"tcp://127.0.0.1:{dist_port}",
        "--model-loader-extra-config", json.dumps({"enable_multithread_load": True, "num_threads": THREADS}),
    ]
    # The daemon refuses expandable_segments (its memory cannot be exported over CUDA IPC).
    env = {k: v for k, v in env.items() if not (k.endswith("ALLOC_CONF") and "expandable_segments" in v)}
    began = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    while time.monotonic() - began < timeout_s and proc.poll() is None:
        try:
            ready = DAEMON_READY.read_text()
        except OSError:
            ready = ""
        if f"pid={proc.pid}\n" in ready and "config=" in ready:
            return proc, time.monotonic() - began
        time.sleep(0.2)
    return proc, None


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.out, self.began = args, args.out, time.monotonic()
        self.rows: list[dict[str, Any]] = []
        self.cell = kv_cell_bytes(args.model)
        self.daemon: subprocess.Popen[bytes] | None = None
        self.daemon_mib: int | None = None
        self.baseline_mib = gpu_used_mib()
        cache = str(args.scratch / "compile-cache")
        self.env = {
            **os.environ, **compile_cache_env(cache, {}), "NCCL_NVLS_ENABLE": "0",
            "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
        }

    def left(self) -> float:
        return self.args.deadline_s - (time.monotonic() - self.began)

    def note(self, row: dict[str, Any]) -> None:
        row["at_s"] = round(time.monotonic() - self.began, 1)
        self.rows.append(row)
        print(json.dumps(row), flush=True)
        with (self.out / "weight_cache.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")
        (self.out / "weight_cache.txt").write_text(table(self.rows))

    def note_group(self, pid: int) -> None:
        with (self.args.scratch / "pgids").open("a") as f:  # weight_cache.sh's trap stops these
            f.write(f"{pid}\n")

    def server(self, step: str, f: float, log: Path, timeout_s: float, client: bool, run_bench: bool) -> None:
        extra: tuple[str, ...] = ("--mem-fraction-static", f"{f:.5f}".rstrip("0"))
        if client:
            extra += ("--weight-cache-mode", "client", "--weight-cache-socket", str(DAEMON_SOCKET))
        row: dict[str, Any] = {"step": step, "f": round(f, 5), "timeout_s": round(timeout_s)}
        proc, reader, ready_s, argv = start(self.args.model, THREADS, PORT, log, self.env, timeout_s, extra)
        try:
            self.note_group(proc.pid)
            text = log.read_text(errors="replace")
            row.update(ready_s=ready_s and round(ready_s, 1), phases=reader.phases(ready_s))
            row.update(read_server_log(text))
            if "free_before_load_gb" in row and "free_after_load_gb" in row:
                row["kv_tokens_predicted"] = predicted_kv_tokens(
                    row["free_before_load_gb"], row["free_after_load_gb"], f, self.cell
                )
            if ready_s is None:
                row["exit_code"] = proc.poll()
                row["log_tail"] = text.splitlines()[-20:]
            elif run_bench:
                try:
                    row["bench"] = bench(self.args.kit, PORT)
                except (subprocess.SubprocessError, OSError, ValueError) as e:
                    row["bench"] = {"error": repr(e)}
            row["argv_tail"] = argv[argv.index("--model-loader-extra-config") + 2 :]
        finally:
            stop_group(proc)
        if self.daemon is not None:
            row["daemon_alive_after_stop"] = self.daemon.poll() is None
            row["daemon_ping_after_stop"] = ping_daemon()
        limit = (self.baseline_mib or 0) + (self.daemon_mib or 0) + 1024
        row["gpu_used_mib_after_stop"] = wait_gpu_used_at_most(limit, 30)
        self.note(row)
        time.sleep(2)  # the port

    def start_the_daemon(self) -> bool:
        log = self.out / "daemon.log"
        timeout_s = max(min(180.0, self.left() - 2 * EST_S["client"] - EST_S["daemon-stop"]), 30.0)
        proc, ready_s = start_daemon(self.args.model, log, self.env, timeout_s)
        self.daemon = proc
        self.note_group(proc.pid)
        text = log.read_text(errors="replace")
        apps = nvidia_smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
        used = gpu_used_mib()
        row: dict[str, Any] = {
            "step": "daemon", "pid": proc.pid, "ready_s": ready_s and round(ready_s, 1),
            "compute_apps": apps, "gpu_used_mib": used, "baseline_mib": self.baseline_mib,
        }
        if m := DAEMON_LOADED.search(text):
            row["load_s"] = float(m.group(1))
        if m := DAEMON_EXPORTED.search(text):
            row["tensors"], row["non_persistent_buffers"] = int(m.group(1)), int(m.group(2))
        row["daemon_mib_nvidia_smi"] = app_mib(apps, proc.pid)
        if used is not None and self.baseline_mib is not None:
            row["daemon_mib_used_delta"] = used - self.baseline_mib
        self.daemon_mib = row["daemon_mib_nvidia_smi"] or row.get("daemon_mib_used_delta")
        if ready_s is None:
            row["exit_code"] = proc.poll()
            row["log_tail"] = text.splitlines()[-25:]
        else:
            row["ping"] = ping_daemon()
        self.note(row)
        return ready_s is not None

    def stop_the_daemon(self) -> None:
        proc = self.daemon
        if proc is None:
            return
        self.daemon = None
        row: dict[str, Any] = {"step": "daemon-stop", "alive_before_stop": proc.poll() is None}
        row["gpu_used_mib_before_stop"] = gpu_used_mib()
        stop_group(proc)
        row["exit_code"] = proc.returncode
        row["gpu_used_mib_after_stop"] = wait_gpu_used_at_most((self.baseline_mib or 0) + 256, 20)
        row["baseline_mib"] = self.baseline_mib
        row["compute_apps_after_stop"] = nvidia_smi(
            "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"
        )
        row["socket_and_ready_file_removed"] = not DAEMON_SOCKET.exists() and not DAEMON_READY.exists()
        self.note(row)

    def measure(self) -> None:
        args = self.args
        files = shards(args.model)
        if resident_share(files) < 0.99:
            read_into_page_cache(files)
        print(f"weights in the page cache: {resident_share(files):.0%} of {len(files)} shards", flush=True)
        later = EST_S["daemon"] + 2 * EST_S["client"] + EST_S["daemon-stop"]
        budget = max(min(300.0, self.left() - later), 60.0)
        self.server("normal", F, self.out / "server-normal.log", budget, False, True)
        normal = self.rows[-1]
        if not self.start_the_daemon():
            return
        if self.left() < EST_S["client"] + EST_S["daemon-stop"]:
            print("client-0.85: skipped, past the deadline", flush=True)
            return
        budget = min(150.0, self.left() - EST_S["daemon-stop"] - 10)  # ~60 s expected: leaves f' its turn
        self.server("client-0.85", F, self.out / "server-client-0.85.log", budget, True, True)
        client = self.rows[-1]
        if client.get("ready_s") is None:
            print("client-fprime, client-again: skipped, the first client did not start", flush=True)
            return
        try:
            fprime = matched_fraction(
                normal["free_before_load_gb"], normal["weights_gb"], client["free_before_load_gb"], F,
                client.get("weights_gb", 0.0),
            )
        except (KeyError, ValueError) as e:
            print(f"client-fprime: skipped, no f': {e!r}", flush=True)
            fprime = None
        if fprime is not None and self.left() >= EST_S["client"] + EST_S["daemon-stop"]:
            budget = min(150.0, self.left() - EST_S["daemon-stop"] - 10)
            self.server("client-fprime", fprime, self.out / "server-client-fprime.log", budget, True, True)
        if self.left() >= EST_S["again"] + EST_S["daemon-stop"]:
            budget = self.left() - EST_S["daemon-stop"] - 5
            self.server("client-again", F, args.scratch / "server-client-again.log", budget, True, False)
        else:
            print("client-again: skipped, past the deadline", flush=True)


def _cell(value: Any, spec: str = "") -> str:
    return format("-" if value is None else value, spec)  # specs here are widths (">7"), fit for "-" too


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a table, and what they say about f' (GB: GiB as SGLang logs them)."""
    lines = [
        "step            f        T GB    W GB  load s  ready s  KV tokens  predicted  headroom GB   tok/s"
        "  note"
    ]
    by = {r["step"]: r for r in rows}
    for r in rows:
        if r["step"] == "daemon":
            note = (
                f"load {_cell(r.get('load_s'))} s, {_cell(r.get('tensors'))} tensors, GPU "
                f"{_cell(r.get('daemon_mib_nvidia_smi'))} MiB (nvidia-smi) / "
                f"{_cell(r.get('daemon_mib_used_delta'))} MiB (used - baseline), ping {r.get('ping')}"
            ) + ("" if r.get("ready_s") is not None else f"; NOT READY (exit {r.get('exit_code')})")
            lines.append(f"{'daemon':<15} {'':>5}  {'':>6}  {'':>6}  {_cell(r.get('load_s'), '>6')}"
                         f"  {_cell(r.get('ready_s'), '>7')}  {note}")
            continue
        if r["step"] == "daemon-stop":
            lines.append(
                f"daemon-stop     GPU used {_cell(r.get('gpu_used_mib_before_stop'))} -> "
                f"{_cell(r.get('gpu_used_mib_after_stop'))} MiB (baseline {_cell(r.get('baseline_mib'))}),"
                f" exit {r.get('exit_code')}, socket and ready file removed:"
                f" {r.get('socket_and_ready_file_removed')}"
            )
            continue
        bench_row = r["bench"] if isinstance(r.get("bench"), dict) else {}
        load = r.get("ipc_load_s", r.get("load_s"))
        notes = []
        if r["step"] != "normal":
            notes.append("IPC" if "ipc_handles" in r else "NO IPC")
            if r.get("fell_back_to_disk"):
                notes.append("FELL BACK TO DISK")
            alive, ping = r.get("daemon_alive_after_stop"), r.get("daemon_ping_after_stop")
            notes.append(f"daemon after the stop: alive {alive}, ping {ping}")
        if r.get("ready_s") is None:
            notes.append(f"NOT READY (exit {r.get('exit_code')})")
        lines.append(
            f"{r['step']:<15} {r['f']:<7}  {_cell(r.get('free_before_load_gb'), '>6')}"
            f"  {_cell(r.get('weights_gb'), '>6')}  {_cell(load, '>6')}  {_cell(r.get('ready_s'), '>7')}"
            f"  {_cell(r.get('kv_tokens'), '>9')}  {_cell(r.get('kv_tokens_predicted'), '>9')}"
            f"  {_cell(r.get('headroom_gb'), '>11')}  {_cell(bench_row.get('output_tok_s'), '>6')}"
            f"  {'; '.join(notes)}"
        )
    normal, client, fprime = by.get("normal", {}), by.get("client-0.85", {}), by.get("client-fprime", {})
    t, w, tc = normal.get("free_before_load_gb"), normal.get("weights_gb"), client.get("free_before_load_gb")
    if t is not None and w is not None and tc is not None:
        lines.append("")
        lines.append(f"daemon overhead D = T - T_c - W = {t} - {tc} - {w} = {t - tc - w:.2f} GB")
        if "f" in fprime:
            wc = client.get("weights_gb", 0.0)
            lines.append(f"f' = (T x f - W + W_c) / T_c = ({t} x {F} - {w} + {wc}) / {tc} = {fprime['f']}")
        for name, r in (("client-0.85", client), ("client-fprime", fprime)):
            if r.get("kv_tokens") and normal.get("kv_tokens"):
                d = r["kv_tokens"] - normal["kv_tokens"]
                share = d / normal["kv_tokens"]
                lines.append(f"{name}: KV tokens {r['kv_tokens']} = normal {d:+d} ({share:+.2%})")
        if fprime.get("headroom_gb") is not None and normal.get("headroom_gb") is not None:
            lines.append(
                f"headroom: normal {normal['headroom_gb']} GB, client-fprime {fprime['headroom_gb']} GB "
                f"(expected normal - D = {normal['headroom_gb'] - (t - tc - w):.2f})"
            )
    return "\n".join(lines) + "\n"


def check(log: Path, model: Path | None) -> int:
    """The log reading and SGLang's pool formula on a server log already on disk (no GPU)."""
    got = read_server_log(log.read_text(errors="replace"))
    print(json.dumps(got, indent=1))
    cell = kv_cell_bytes(model) if model else None
    if cell is None and got.get("kv_gb") and got.get("kv_tokens_allocated"):
        cell = round(got["kv_gb"] * GIB / got["kv_tokens_allocated"])
    needed = ("free_before_load_gb", "free_after_load_gb", "f_logged")
    if cell and all(k in got for k in needed):
        pre, after = got["free_before_load_gb"], got["free_after_load_gb"]
        predicted = predicted_kv_tokens(pre, after, got["f_logged"], cell)
        print(f"KV bytes per token {cell}; predicted KV tokens {predicted}, logged {got.get('kv_tokens')}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="the checkpoint (make_model.py skeleton + weights)")
    ap.add_argument("--kit", type=Path, default=Path(".sglkit/kit"))
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    ap.add_argument("--scratch", type=Path, default=Path("/tmp/wcache"), help="compile caches, extra logs")
    ap.add_argument("--deadline-s", type=float, default=480, help="no step begins that would end after this")
    ap.add_argument("--check", type=Path, metavar="SERVER_LOG", help="only read this log (no GPU)")
    args = ap.parse_args()
    if args.check:
        return check(args.check, args.model)
    if args.model is None:
        ap.error("--model is required (or --check SERVER_LOG)")
    args.out.mkdir(parents=True, exist_ok=True)
    args.scratch.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _on_sigterm)
    run = Run(args)
    try:
        run.measure()
    except Terminated as e:
        print(f"stopped: {e}", flush=True)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for pid in our_children():  # a server whose start() was cut short by the signal
            if run.daemon is None or pid != run.daemon.pid:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        run.stop_the_daemon()
        (run.out / "weight_cache.txt").write_text(table(run.rows))
    print(table(run.rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
