"""``continuum-gpu``: real SGLang 0.5.23 with this plugin on the lent H100, without sgl_kernel.

That machine has no network, torch 2.11 and no sglang; a run there gets the working tree plus at
most 64 MiB in all. ``build`` (here, on a CPU machine with PyPI) writes one git-ignored folder,
``.gpu-bundle/``, holding everything the run needs beyond the tree:

    wheels/     sglang 0.5.23 (its four optional Rust extensions dropped) and the import-time
                dependencies the machine's image lacks (requirements/gpu-bundle.txt), cp312 manylinux
    plugin/     a dist-info declaring this package's ``sglang.srt.plugins`` entry point (read from
                pyproject.toml), so SGLang finds the plugin from the tree on PYTHONPATH
    models/llama-3.1-8b-shape/config.json   Llama-3.1-8B's shapes, no weights, no tokenizer
    workloads/swe-gpu.jsonl                  the workload ``scripts/gpu/run.sh`` replays
    manifest.json                            every file, its size and sha256

and fails if the bundle plus the tree would exceed the limit. ``scripts/gpu/run.sh`` is what runs
there; it calls ``env``, ``check-imports`` and ``smoke`` of this tool. See docs/gpu.md.

    python -m continuum_lab.cli.gpu_bundle build      # then: check
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shlex
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Optional

REPO = Path(".")  # the repository root: where this tool runs (scripts/gpu/run.sh cds there)
BUNDLE = REPO / ".gpu-bundle"
REQUIREMENTS = REPO / "requirements" / "gpu-bundle.txt"
MIB = 1 << 20
LIMIT_BYTES = 64 * MIB  # what may travel to the GPU machine in one run: tree + carried folders
MODEL_NAME = "llama-3.1-8b-shape"
WORKLOAD_NAME = "swe-gpu.jsonl"
# continuum-workload arguments of the bench workload: 24 SWE-like programs at a tenth of the paper's
# tokens (~7k per program), tools clipped to 5 s, so that each policy's replay fits a 10-minute run
WORKLOAD_ARGS = ("swe", "--programs", "24", "--token-scale", "0.1", "--max-tool-s", "5", "--seed", "0")
PYTHON_VERSION = "3.12"  # the GPU machine's python3
PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35)) + (
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
# Rust extensions of the sglang wheel that a Python-server run never loads: _server (the Rust HTTP
# server, SGLANG_RUST_SERVER), _bench (sglang.benchmark's Rust client), _grpc (--grpc-port),
# _multimodal (image processors of a few multimodal models). 17 MiB of the wheel's 37. The one
# that stays, mem_cache/rust_tree_core, is the radix tree core every server uses.
SGLANG_DROPPED = tuple(f"sglang/srt/rust_extensions/{m}." for m in ("_server", "_bench", "_grpc", "_multimodal"))
# Llama-3.1-8B (meta-llama/Llama-3.1-8B's config.json) without rope_scaling, which changes no
# shape or FLOP count and differs between transformers 4 and 5
LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
# imported by check-imports on the GPU machine: the launcher, the HTTP server, the scheduler and the
# model path a Llama/Triton run takes (with CUDA, each imports sgl_kernel names at module level)
SERVING_MODULES = (
    "sglang.launch_server",
    "sglang.srt.entrypoints.http_server",
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.tokenizer_manager",
    "sglang.srt.managers.detokenizer_manager",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.models.llama",
    "sglang.srt.layers.layernorm",
    "sglang.srt.layers.activation",
    "sglang.srt.layers.sampler",
    "sglang.srt.layers.attention.triton_backend",
    "sglang.srt.mem_cache.pool_host.mha",
    "sglang.srt.layers.quantization.gguf",
    "sglang_continuum.adapter.plugin",
    "continuum_lab.cli.bench",
)


class BundleError(RuntimeError):
    """The bundle cannot be built or would not work there; the message says why."""


# ---------------------------------------------------------------- requirements and wheels


def read_requirements(path: Path = REQUIREMENTS) -> dict[str, str]:
    """``{normalized name: version}``; every line must pin one exact version (pip --no-deps installs
    exactly these, and two versions of one package stop the whole install)."""
    pins: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)", line)
        if not m:
            raise BundleError(f"{path}:{number}: {line!r} is not NAME==VERSION")
        name = normalize(m.group(1))
        if name in pins:
            raise BundleError(f"{path}:{number}: {name} is pinned twice")
        pins[name] = m.group(2)
    if "sglang" not in pins:
        raise BundleError(f"{path} does not pin sglang")
    return pins


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name_version(path: Path) -> tuple[str, str]:
    """(normalized distribution name, version) from a wheel's file name."""
    parts = path.name[: -len(".whl")].split("-")
    if not path.name.endswith(".whl") or len(parts) < 5:
        raise BundleError(f"{path.name} is not a wheel file name")
    return normalize(parts[0]), parts[1]


def download(pins: dict[str, str], wheels: Path, find_links: Optional[Path] = None) -> None:
    """``pip download --no-deps`` of every pin for the GPU machine's Python and platform."""
    wheels.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
        "--python-version", PYTHON_VERSION, "--implementation", "cp",
        *(a for p in PLATFORMS for a in ("--platform", p)),
        *(("--no-index", "--find-links", str(find_links)) if find_links else ()),
        "-d", str(wheels), *(f"{n}=={v}" for n, v in pins.items()),
    ]  # fmt: skip
    print("$ " + shlex.join(cmd), flush=True)
    if subprocess.run(cmd).returncode != 0:
        raise BundleError("pip download failed (see above)")


def check_wheels(pins: dict[str, str], wheels: Path) -> dict[str, Path]:
    """Exactly one wheel per pin, at the pinned version, and nothing else."""
    found: dict[str, Path] = {}
    for whl in sorted(wheels.glob("*.whl")):
        name, version = wheel_name_version(whl)
        if name not in pins:
            raise BundleError(f"{whl.name}: {name} is not in the requirements (remove it)")
        if version != pins[name]:
            raise BundleError(f"{whl.name}: version {version}, the requirements pin {pins[name]} (remove it)")
        if name in found:
            raise BundleError(f"two wheels of {name}: {found[name].name}, {whl.name}")
        found[name] = whl
    missing = sorted(set(pins) - set(found))
    if missing:
        raise BundleError(f"no wheel for {', '.join(missing)}")
    return found


def slim_wheel(path: Path, dropped_prefixes: tuple[str, ...] = SGLANG_DROPPED) -> list[str]:
    """Rewrite the wheel without the members under ``dropped_prefixes`` and without their RECORD
    lines (pip then installs a consistent RECORD). Returns the members dropped (none: already slim)."""
    with zipfile.ZipFile(path) as src:
        names = src.namelist()
        drop = [n for n in names if n.startswith(dropped_prefixes)]
        if not drop:
            return []
        records = [n for n in names if n.endswith(".dist-info/RECORD")]
        if len(records) != 1:
            raise BundleError(f"{path.name}: expected one RECORD, found {records}")
        tmp = path.with_suffix(".slim")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                if info.filename in drop:
                    continue
                data = src.read(info)
                if info.filename == records[0]:
                    lines = data.decode().splitlines(keepends=True)
                    data = "".join(line for line in lines if not line.startswith(dropped_prefixes)).encode()
                dst.writestr(info, data)
    tmp.replace(path)
    return drop


# ---------------------------------------------------------------- the rest of the bundle


def write_model(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(LLAMA_31_8B, indent=1) + "\n")
    return directory


def _project(pyproject: Path) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError as exc:  # Python 3.10
        raise BundleError("building the bundle needs Python >= 3.11 (tomllib)") from exc
    return tomllib.loads(pyproject.read_text())["project"]


def write_plugin_dist_info(directory: Path, pyproject: Path = REPO / "pyproject.toml") -> Path:
    """A dist-info (no code: the tree is on PYTHONPATH) through which importlib.metadata, and so
    SGLang's ``load_plugins``, finds this package's entry point without installing it."""
    project = _project(pyproject)
    eps = project.get("entry-points", {}).get("sglang.srt.plugins", {})
    if not eps:
        raise BundleError(f"{pyproject} declares no sglang.srt.plugins entry point")
    dist = directory / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    (dist / "entry_points.txt").write_text(
        "[sglang.srt.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in sorted(eps.items()))
    )
    return dist


def write_workload(path: Path) -> Path:
    from continuum_lab.workloads import generate

    path.parent.mkdir(parents=True, exist_ok=True)
    if generate.main([*WORKLOAD_ARGS, "--out", str(path)]) not in (0, None):
        raise BundleError("continuum-workload failed")
    return path


# ---------------------------------------------------------------- sizes


def tree_files(repo: Path = REPO) -> list[Path]:
    """What travels with the working tree: tracked files and untracked files git does not ignore."""
    out = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout
    return [repo / p for p in out.decode().split("\0") if p]


def folder_bytes(folder: Path) -> int:
    return sum(p.lstat().st_size for p in folder.rglob("*") if p.is_file() or p.is_symlink())


def travel_bytes(bundle: Path, repo: Path = REPO) -> tuple[int, int]:
    """(tree bytes, bundle bytes). Files inside the bundle are not part of the tree: it is ignored."""
    tree = sum(p.lstat().st_size for p in tree_files(repo) if p.exists() or p.is_symlink())
    return tree, folder_bytes(bundle)


def check_size(bundle: Path, limit: int = LIMIT_BYTES, repo: Path = REPO) -> int:
    tree, own = travel_bytes(bundle, repo)
    total = tree + own
    print(
        f"bundle {own / MIB:.2f} MiB + working tree {tree / MIB:.2f} MiB = {total / MIB:.2f} MiB "
        f"(limit {limit / MIB:.0f} MiB, {(limit - total) / MIB:+.2f} MiB left)"
    )
    if total > limit:
        raise BundleError(
            f"{total / MIB:.2f} MiB would travel, over the {limit / MIB:.0f} MiB a run may take: shrink the bundle "
            f"({bundle}) or the working tree (untracked files count too)"
        )
    return total


def manifest(bundle: Path) -> dict:
    files = {}
    for p in sorted(bundle.rglob("*")):
        if p.is_file() and p.name != "manifest.json":
            files[str(p.relative_to(bundle))] = {
                "bytes": p.stat().st_size,
                "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
            }
    return {"files": files, "bytes": sum(f["bytes"] for f in files.values())}


def check_bundle(bundle: Path, pins: Optional[dict[str, str]] = None) -> dict:
    """The bundle holds what the run needs, unchanged since it was built."""
    path = bundle / "manifest.json"
    if not path.is_file():
        raise BundleError(f"{path} missing: run `continuum-gpu build` first")
    recorded = json.loads(path.read_text())
    now = manifest(bundle)
    if now["files"] != recorded["files"]:
        changed = sorted(set(now["files"]).symmetric_difference(recorded["files"])) or [
            k for k in now["files"] if now["files"][k] != recorded["files"].get(k)
        ]
        raise BundleError(f"{bundle} changed since it was built ({', '.join(changed[:5])}): build it again")
    check_wheels(pins or read_requirements(), bundle / "wheels")
    for need in (f"models/{MODEL_NAME}/config.json", f"workloads/{WORKLOAD_NAME}"):
        if not (bundle / need).is_file():
            raise BundleError(f"{bundle / need} missing")
    if not list((bundle / "plugin").glob("*.dist-info/entry_points.txt")):
        raise BundleError(f"{bundle / 'plugin'} holds no entry point")
    sglang = next((bundle / "wheels").glob("sglang-*.whl"))
    with zipfile.ZipFile(sglang) as z:
        left = [n for n in z.namelist() if n.startswith(SGLANG_DROPPED)]
    if left:
        raise BundleError(f"{sglang.name} still holds {left[0]}: build it again")
    return recorded


# ---------------------------------------------------------------- subcommands


def build(
    bundle: Path = BUNDLE,
    requirements: Path = REQUIREMENTS,
    limit: int = LIMIT_BYTES,
    find_links: Optional[Path] = None,
    repo: Path = REPO,
) -> dict:
    pins = read_requirements(requirements)
    wheels = bundle / "wheels"
    if wheels.is_dir():  # wheels of earlier pins would stop the install
        for whl in wheels.glob("*.whl"):
            name, version = wheel_name_version(whl)
            if pins.get(name) != version:
                whl.unlink()
    download(pins, wheels, find_links)
    found = check_wheels(pins, wheels)
    dropped = slim_wheel(found["sglang"])
    print(f"{found['sglang'].name}: dropped {len(dropped)} optional member(s)" if dropped else "sglang already slim")
    write_model(bundle / "models" / MODEL_NAME)
    write_plugin_dist_info(bundle / "plugin")
    write_workload(bundle / "workloads" / WORKLOAD_NAME)
    data = manifest(bundle) | {
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "requirements": pins,
        "sglang_dropped": list(SGLANG_DROPPED),
        "workload_args": list(WORKLOAD_ARGS),
    }
    (bundle / "manifest.json").write_text(json.dumps(data, indent=1) + "\n")
    check_bundle(bundle, pins)
    print_contents(bundle, data)
    check_size(bundle, limit, repo)
    return data


def print_contents(bundle: Path, data: dict) -> None:
    for name, f in sorted(data["files"].items(), key=lambda kv: -kv[1]["bytes"]):
        print(f"  {f['bytes'] / MIB:8.2f} MiB  {name}")
    print(f"{len(data['files'])} files, {data['bytes'] / MIB:.2f} MiB in {bundle}")


def shell_env() -> str:
    """Lines for ``eval`` in run.sh: the server environment and flags of harness/server.py."""
    from continuum_lab.harness.server import GPU_SHIM_ENV, GPU_SHIM_FLAGS

    lines = [f"export {k}={shlex.quote(v)}" for k, v in GPU_SHIM_ENV.items()]
    lines.append(f"GPU_SHIM_FLAGS={shlex.quote(shlex.join(GPU_SHIM_FLAGS))}")
    return "\n".join(lines)


def check_imports() -> int:
    """On the GPU machine, before any server: the serving modules import with the shim, the shim is
    the sgl_kernel found, and SGLang sees this plugin's entry point."""
    from importlib.metadata import entry_points

    import sgl_kernel
    import torch

    print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}", flush=True)
    if "placeholder" not in getattr(sgl_kernel, "__version__", ""):
        raise BundleError(f"sgl_kernel is {sgl_kernel.__file__}, not the placeholder in gpushim/")
    import importlib

    for name in SERVING_MODULES:
        t0 = time.perf_counter()
        importlib.import_module(name)
        print(f"  import {name}: {time.perf_counter() - t0:.2f}s", flush=True)
    import sglang

    eps = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    if eps.get("continuum") != "sglang_continuum.adapter.plugin:register":
        raise BundleError(f"sglang.srt.plugins entry points {eps}: continuum missing")
    print(f"sglang {sglang.__version__} from {Path(sglang.__file__).parent}; plugins {eps}")
    return 0


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (a dead server its shell has not reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_healthy(url: str, wait_s: float, server_pid: Optional[int] = None) -> None:
    """Until ``url``/health answers 200; fails at once if the server process has died."""
    import httpx

    deadline = time.monotonic() + wait_s
    while True:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if server_pid is not None and not _alive(server_pid):
            raise BundleError(f"the server (pid {server_pid}) exited before {url}/health answered")
        if time.monotonic() > deadline:
            raise BundleError(f"{url}/health did not answer 200 within {wait_s:.0f}s")
        time.sleep(2)


def smoke(url: str, new_tokens: int = 32, wait_s: float = 600.0, server_pid: Optional[int] = None) -> dict:
    """Two turns of one program against a running server: the first non-final (with no tool time
    observed yet, the cost model makes no pin), the second continues its context. Fails unless
    both return ``new_tokens`` ids, the second finds its prefix cached, and /metrics carries the
    plugin's series. ``server_pid``: stop waiting at once if that process dies."""
    import httpx

    from continuum_lab.harness.server import parse_metrics
    from sglang_continuum.client.params import continuum_custom_params
    from sglang_continuum.core.series import series_key

    url = url.rstrip("/")
    wait_healthy(url, wait_s, server_pid)
    # token ids below 500, as the replay draws them: valid for the tiny CPU model and Llama's vocabulary
    context = [(17 * i + 3) % 495 + 5 for i in range(512)]
    turns = []
    for step, (tool, last) in enumerate([("pytest", False), (None, True)], 1):
        body = {
            "input_ids": context,
            "sampling_params": {
                "max_new_tokens": new_tokens,
                "ignore_eos": True,
                "temperature": 0.0,
                "custom_params": continuum_custom_params("gpu-smoke", last_step=last, tool_name=tool, step=step),
            },
        }
        t0 = time.perf_counter()
        r = httpx.post(url + "/generate", json=body, timeout=300)
        elapsed = time.perf_counter() - t0
        if r.status_code != 200:
            raise BundleError(f"/generate step {step}: HTTP {r.status_code}: {r.text[:500]}")
        out = r.json()
        ids = out.get("output_ids") or []
        meta = out.get("meta_info", {})
        turns.append(
            {
                "step": step,
                "seconds": round(elapsed, 4),
                "output_ids": len(ids),
                "prompt_tokens": meta.get("prompt_tokens"),
            }
            | {"cached_tokens": meta.get("cached_tokens")}
        )
        print(f"  step {step}: {turns[-1]}", flush=True)
        if len(ids) != new_tokens:
            raise BundleError(f"/generate step {step} returned {len(ids)} output ids, asked for {new_tokens}")
        context = context + list(ids) + [(31 * i + 7) % 495 + 5 for i in range(64)]
    if not turns[1]["cached_tokens"]:
        raise BundleError(f"the second turn found nothing cached: {turns[1]}")
    metrics = parse_metrics(httpx.get(url + "/metrics", timeout=10).text)
    if not metrics:
        raise BundleError("/metrics has no sglang:continuum_ series: the plugin is not running")
    for series in (series_key("programs.seen"), series_key("programs.last_step")):
        if metrics.get(series, 0) < 1:
            raise BundleError(f"{series} is {metrics.get(series)}: the plugin did not see the program's custom_params")
    print(f"  /metrics: {len(metrics)} continuum series, e.g. {dict(list(sorted(metrics.items()))[:4])}")
    return {"turns": turns, "continuum_series": metrics}


def _generate_seconds(url: str, prompts: list[list[int]], new_tokens: int) -> float:
    """Wall seconds until every prompt (sent at once, no program metadata) has its answer."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    def one(ids: list[int]) -> None:
        body = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": new_tokens, "ignore_eos": True, "temperature": 0.0},
        }
        r = httpx.post(url + "/generate", json=body, timeout=300)
        if r.status_code != 200:
            raise BundleError(f"/generate: HTTP {r.status_code}: {r.text[:300]}")

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        list(pool.map(one, prompts))
    return time.perf_counter() - t0


def step_times(url: str, profiles: list[Path], seed: int = 0) -> dict:
    """Prefill and decode step times of the running server, over HTTP, beside what each emulator
    profile predicts for the same batch. Every prompt is fresh random ids (nothing cached).
    Prefill: one request of n tokens and one output token. Decode step: (B requests with 129
    output tokens - the same with 1) / 128. HTTP and scheduling overhead are included."""
    import random

    from continuum_lab.emulator.step_model import StepLatencyModel
    from sglang_continuum.core.cost_model import PrefillProfile

    rng = random.Random(seed)
    url = url.rstrip("/")

    def fresh(n: int) -> list[int]:
        return [rng.randrange(5, 495) for _ in range(n)]  # valid ids for the tiny CPU model too

    _generate_seconds(url, [fresh(1024) for _ in range(4)], 8)  # Triton compiles its kernels
    prefill: dict[str, PrefillProfile] = {}
    decode: dict[str, Optional[StepLatencyModel]] = {}
    for path in profiles:
        name = (fit := PrefillProfile.load(path)).name
        prefill[name] = fit
        try:
            decode[name] = StepLatencyModel.load(path)
        except ValueError:  # a prefill-only profile
            decode[name] = None

    rows = []
    for n in (1024, 4096, 16384):
        measured = min(_generate_seconds(url, [fresh(n)], 1) for _ in range(2))
        rows.append(
            {"what": "prefill", "tokens": n, "measured_s": round(measured, 4)}
            | {name: round(f.seconds(n), 4) for name, f in prefill.items()}
        )
    for batch, ctx in ((1, 1024), (32, 1024)):
        base = _generate_seconds(url, [fresh(ctx) for _ in range(batch)], 1)
        full = _generate_seconds(url, [fresh(ctx) for _ in range(batch)], 129)
        step = max(full - base, 0.0) / 128
        rows.append(
            {"what": "decode step", "batch": batch, "context": ctx, "measured_s": round(step, 5)}
            | {
                name: None if m is None else round(m.decode_seconds(batch, batch * (ctx + 64)), 5)
                for name, m in decode.items()
            }
        )
    for row in rows:
        print("  " + json.dumps(row), flush=True)
    return {"rows": rows, "profiles": [str(p) for p in profiles]}


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="continuum-gpu", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="download, slim and write the bundle; check its size")
    c = sub.add_parser("check", help="the bundle is complete, unchanged and under the limit")
    for p in (b, c):
        p.add_argument("--bundle", type=Path, default=BUNDLE)
        p.add_argument("--limit-mib", type=float, default=LIMIT_BYTES / MIB)
    b.add_argument("--requirements", type=Path, default=REQUIREMENTS)
    b.add_argument("--find-links", type=Path, help="take the wheels from this folder instead of PyPI")
    sub.add_parser("env", help="print the server environment and flags as shell lines (run.sh evals them)")
    sub.add_parser("check-imports", help="GPU machine: import the serving modules with the shim")
    s = sub.add_parser("smoke", help="two turns of one program and /metrics against a running server")
    s.add_argument("--url", required=True)
    s.add_argument("--new-tokens", type=int, default=32)
    s.add_argument("--wait-s", type=float, default=600.0)
    s.add_argument("--out", type=Path, help="write the result here as JSON")
    s.add_argument("--server-pid", type=int, help="fail at once if this process dies while waiting")
    t = sub.add_parser("steps", help="prefill and decode step times of a running server beside the profiles'")
    t.add_argument("--url", required=True)
    t.add_argument("--profile", type=Path, action="append", default=[], help="emulator profile (repeatable)")
    t.add_argument("--out", type=Path, help="write the result here as JSON")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "build":
            build(args.bundle.resolve(), args.requirements, int(args.limit_mib * MIB), args.find_links)
        elif args.cmd == "check":
            data = check_bundle(args.bundle.resolve())
            print_contents(args.bundle, data)
            check_size(args.bundle.resolve(), int(args.limit_mib * MIB))
        elif args.cmd == "env":
            print(shell_env())
        elif args.cmd == "check-imports":
            return check_imports()
        elif args.cmd == "smoke":
            result = smoke(args.url, args.new_tokens, args.wait_s, args.server_pid)
            if args.out:
                args.out.write_text(json.dumps(result, indent=1))
            print("smoke passed")
        elif args.cmd == "steps":
            result = step_times(args.url, args.profile)
            if args.out:
                args.out.write_text(json.dumps(result, indent=1))
    except BundleError as exc:
        print(f"continuum-gpu {args.cmd}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
