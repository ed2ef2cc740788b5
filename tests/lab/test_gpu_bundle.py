"""The GPU bundle as far as a CPU machine can check it: the sgl_kernel placeholder's layout, the
config-only model, the plugin's dist-info, wheel slimming, the size limit and the run script's
commands (run with a recording stand-in for python3)."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time
import zipfile
from importlib.metadata import distributions
from pathlib import Path

import pytest

from continuum_lab.cli import gpu_bundle as gb
from continuum_lab.harness.server import GPU_SHIM_ENV, GPU_SHIM_FLAGS

ROOT = Path(__file__).resolve().parents[2]
GPUSHIM = ROOT / "gpushim"
RUN_SH = ROOT / "scripts" / "gpu" / "run.sh"


def _in_shim(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` with gpushim/ first on the path (the venv holds the CPU placeholder too)."""
    env = {**os.environ, "PYTHONPATH": f"{GPUSHIM}{os.pathsep}{ROOT}"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_shim_module_layout():
    r = _in_shim(
        "import json, sgl_kernel, sgl_kernel.utils, sgl_kernel.kvcacheio, sgl_kernel.quantization\n"
        "from sgl_kernel import rmsnorm, fused_add_rmsnorm, silu_and_mul, top_k_renorm_prob\n"
        "from sgl_kernel.kvcacheio import transfer_kv_per_layer, transfer_kv_direct\n"
        "from sgl_kernel.quantization import ggml_dequantize\n"
        "from sgl_kernel.utils import is_arch_support_pdl\n"
        "absent = {}\n"
        "for m in ('scalar_type', 'allreduce', 'flash_attn', 'elementwise'):\n"
        "    try:\n"
        "        __import__('sgl_kernel.' + m)\n"
        "        absent[m] = False\n"
        "    except ModuleNotFoundError:\n"
        "        absent[m] = True\n"
        "try:\n"
        "    rmsnorm(1, 2)\n"
        "    raised = ''\n"
        "except NotImplementedError as e:\n"
        "    raised = str(e)\n"
        "print(json.dumps({'file': sgl_kernel.__file__, 'version': sgl_kernel.__version__,\n"
        "    'pdl': is_arch_support_pdl(), 'absent': absent, 'raised': raised,\n"
        "    'stub_name': transfer_kv_direct.__qualname__}))\n"
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert Path(out["file"]).parent == GPUSHIM / "sgl_kernel"
    assert "placeholder" in out["version"]
    assert out["pdl"] is False  # the Triton backend then never uses PDL intrinsics
    # SGLang imports these inside try/except ImportError and falls back: they must stay absent
    assert out["absent"] == {"scalar_type": True, "allreduce": True, "flash_attn": True, "elementwise": True}
    assert "sgl_kernel.rmsnorm is not available" in out["raised"] and "gpushim" in out["raised"]
    assert out["stub_name"] == "sgl_kernel.kvcacheio.transfer_kv_direct"


def test_shim_hides_dunder_lookups():
    # import machinery and pickling probe __path__/__spec__-like names: no stub for those
    r = _in_shim("import sgl_kernel.utils as u; print(hasattr(u, '__wrapped__'), hasattr(u, 'anything'))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True"]


def test_config_only_model_has_llama_31_8b_shapes(tmp_path):
    config = json.loads((gb.write_model(tmp_path / "m") / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    h, i, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    assert config["num_attention_heads"] * config["head_dim"] == h
    per_layer = h * h * 2 + h * kv * 2 + 3 * h * i + 2 * h  # q, o; k, v; gate, up, down; two norms
    params = layers * per_layer + 2 * config["vocab_size"] * h + h  # untied embedding and lm_head
    assert abs(params - 8.03e9) / 8.03e9 < 0.005  # Llama-3.1-8B: 8.03e9 parameters
    assert (config["vocab_size"], config["max_position_embeddings"]) == (128256, 131072)
    assert not list((tmp_path / "m").glob("*.safetensors")) and not (tmp_path / "m" / "tokenizer.json").exists()


def test_plugin_dist_info_exposes_the_entry_point(tmp_path):
    gb.write_plugin_dist_info(tmp_path)
    eps = [ep for d in distributions(path=[str(tmp_path)]) for ep in d.entry_points]
    assert [(ep.group, ep.name, ep.value) for ep in eps] == [
        ("sglang.srt.plugins", "continuum", "sglang_continuum.adapter.plugin:register")
    ]


def test_requirements_pin_every_package_once_and_match_the_cpu_constraints():
    pins = gb.read_requirements()
    assert pins["sglang"] == "0.5.23"
    assert "sglang-kernel" not in pins and "flashinfer-python" not in pins and "torch" not in pins
    cpu = {}
    for line in (ROOT / "requirements" / "cpu-constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==")
            cpu[gb.normalize(name)] = version
    overlap = set(pins) & set(cpu)
    assert {"sglang", "openai", "xgrammar", "apache-tvm-ffi", "soundfile"} <= overlap
    assert {n: pins[n] for n in overlap} == {n: cpu[n] for n in overlap}


@pytest.mark.parametrize(
    "text, error",
    [
        ("sglang>=0.5\n", "is not NAME==VERSION"),
        ("sglang==0.5.23\nSGLang==0.5.22\n", "pinned twice"),
        ("orjson==3\n", "does not pin sglang"),
    ],
)
def test_requirements_errors(tmp_path, text, error):
    (tmp_path / "r.txt").write_text(text)
    with pytest.raises(gb.BundleError, match=error):
        gb.read_requirements(tmp_path / "r.txt")


def _wheel(path: Path, members: dict[str, bytes]) -> Path:
    dist = "sglang-0.5.23.dist-info"
    record = "".join(f"{n},sha256=x,{len(b)}\n" for n, b in members.items()) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for n, b in members.items():
            z.writestr(n, b)
        z.writestr(f"{dist}/RECORD", record)
    return path


def test_slim_wheel_drops_the_optional_extensions_and_their_record_lines(tmp_path):
    members = {
        "sglang/srt/rust_extensions/__init__.py": b"x",
        "sglang/srt/rust_extensions/loader.py": b"y",
        "sglang/srt/rust_extensions/_server.cpython-312-x86_64-linux-gnu.so": b"s" * 100,
        "sglang/srt/rust_extensions/_grpc.cpython-312-x86_64-linux-gnu.so": b"g",
        "sglang/srt/mem_cache/rust_tree_core/mem_cache.cpython-312-x86_64-linux-gnu.so": b"tree",
    }
    whl = _wheel(tmp_path / "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl", members)
    dropped = gb.slim_wheel(whl)
    assert sorted(dropped) == sorted(n for n in members if "/_server." in n or "/_grpc." in n)
    with zipfile.ZipFile(whl) as z:
        names = set(z.namelist())
        record = z.read("sglang-0.5.23.dist-info/RECORD").decode()
        assert z.read("sglang/srt/mem_cache/rust_tree_core/mem_cache.cpython-312-x86_64-linux-gnu.so") == b"tree"
    assert names == {n for n in members if n not in dropped} | {"sglang-0.5.23.dist-info/RECORD"}
    assert {line.split(",")[0] for line in record.splitlines()} == names
    assert gb.slim_wheel(whl) == []  # already slim


def test_check_wheels_wants_exactly_the_pins(tmp_path):
    pins = {"sglang": "0.5.23", "orjson": "3.13.0"}
    (tmp_path / "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl").touch()
    with pytest.raises(gb.BundleError, match="no wheel for orjson"):
        gb.check_wheels(pins, tmp_path)
    (tmp_path / "orjson-3.12.0-cp312-cp312-manylinux_2_17_x86_64.whl").touch()
    with pytest.raises(gb.BundleError, match="version 3.12.0"):
        gb.check_wheels(pins, tmp_path)
    (tmp_path / "orjson-3.12.0-cp312-cp312-manylinux_2_17_x86_64.whl").unlink()
    (tmp_path / "orjson-3.13.0-cp312-cp312-manylinux_2_17_x86_64.whl").touch()
    assert set(gb.check_wheels(pins, tmp_path)) == {"sglang", "orjson"}
    (tmp_path / "dill-0.4.1-py3-none-any.whl").touch()
    with pytest.raises(gb.BundleError, match="dill is not in the requirements"):
        gb.check_wheels(pins, tmp_path)


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / ".gitignore").write_text("/.gpu-bundle/\n/ignored.bin\n")
    (repo / "tracked.txt").write_bytes(b"t" * 1000)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    (repo / "untracked.txt").write_bytes(b"u" * 500)  # travels: not ignored
    (repo / "ignored.bin").write_bytes(b"i" * 10_000)  # does not travel
    bundle = repo / ".gpu-bundle"
    (bundle / "wheels").mkdir(parents=True)
    (bundle / "wheels" / "a.whl").write_bytes(b"w" * 3000)
    return repo


def test_size_counts_the_tree_and_the_bundle_and_fails_over_the_limit(tmp_path, capsys):
    repo = _repo(tmp_path)
    bundle = repo / ".gpu-bundle"
    tree, own = gb.travel_bytes(bundle, repo)
    assert own == 3000
    assert tree == 1000 + 500 + len((repo / ".gitignore").read_bytes())  # ignored.bin and the bundle left out
    assert gb.check_size(bundle, limit=tree + own, repo=repo) == tree + own
    assert "MiB left" in capsys.readouterr().out
    (bundle / "wheels" / "b.whl").write_bytes(b"w")
    with pytest.raises(gb.BundleError, match="over the 0 MiB a run may take"):
        gb.check_size(bundle, limit=tree + own, repo=repo)


def test_check_bundle_notices_a_changed_file(tmp_path):
    bundle = tmp_path / "b"
    pins = {"sglang": "0.5.23"}
    (bundle / "wheels").mkdir(parents=True)
    _wheel(bundle / "wheels" / "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl", {"sglang/x.py": b"x"})
    gb.write_model(bundle / "models" / gb.MODEL_NAME)
    gb.write_plugin_dist_info(bundle / "plugin")
    (bundle / "workloads").mkdir()
    (bundle / "workloads" / gb.WORKLOAD_NAME).write_text("{}\n")
    (bundle / "manifest.json").write_text(json.dumps(gb.manifest(bundle)))
    assert gb.check_bundle(bundle, pins)["files"]
    (bundle / "workloads" / gb.WORKLOAD_NAME).write_text("{}\n{}\n")
    with pytest.raises(gb.BundleError, match="changed since it was built"):
        gb.check_bundle(bundle, pins)


def test_env_lines_are_the_server_settings():
    lines = gb.shell_env().splitlines()
    exports = dict(re.fullmatch(r"export (\w+)=(\S+)", line).groups() for line in lines[:-1])
    assert exports == GPU_SHIM_ENV
    assert lines[-1] == f"GPU_SHIM_FLAGS='{' '.join(GPU_SHIM_FLAGS)}'"
    flags = " ".join(GPU_SHIM_FLAGS)
    for need in ("--attention-backend triton", "--sampling-backend pytorch", "--disable-decode-cuda-graph"):
        assert need in flags
    assert GPU_SHIM_ENV["SGLANG_FORCE_FUSED_OP_BACKEND"] == "torch"


FAKE_PYTHON = r"""#!/usr/bin/env bash
# records every call; answers the few whose output run.sh reads
printf '%s\n' "PYTHONPATH=$PYTHONPATH" "$*" >> "$CALLS"
case "$*" in
  *"import os, torch"*) echo /fake/torch ;;
  "-m continuum_lab.cli.gpu_bundle env") exec "$REAL_PYTHON" "$@" ;;
  # the real smoke waits for the server to answer; this one for the background server's line,
  # so the kill that follows cannot land before the server has recorded its call
  "-m continuum_lab.cli.gpu_bundle smoke"*)
    for _ in $(seq 300); do grep -q -- "^-m sglang.launch_server" "$CALLS" && break; sleep 0.1; done ;;
esac
exit 0
"""


def test_run_script_commands(tmp_path):
    assert subprocess.run(["bash", "-n", str(RUN_SH)]).returncode == 0
    bundle = tmp_path / "bundle"
    (bundle / "wheels").mkdir(parents=True)
    for name in ("sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl", "orjson-3.13.0-py3-none-any.whl"):
        (bundle / "wheels" / name).touch()
    (bundle / "manifest.json").write_text("{}")
    fake = tmp_path / "python3"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    calls = tmp_path / "calls.txt"
    # only what the GPU machine's shell would have: variables earlier tests' servers and
    # schedulers leave in this process must not steer the script
    env = {
        **{k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ},
        "PYTHON": str(fake),
        "REAL_PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),
        "CALLS": str(calls),
        "BUNDLE": str(bundle),
        "SITE": str(tmp_path / "site"),
        "OUT": str(tmp_path / "out"),
    }
    r = subprocess.run(["bash", str(RUN_SH), "all"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    recorded = calls.read_text().splitlines()
    # the smoke server runs in the background: its two recorded lines may interleave with others
    commands = [line for line in recorded if not line.startswith("PYTHONPATH=")]
    pythonpath = [line for line in recorded if line.startswith("PYTHONPATH=")][-1]
    install = next(c for c in commands if c.startswith("-m pip install"))
    for flag in ("--no-index", "--no-deps", f"--target {tmp_path / 'site'}"):
        assert flag in install
    assert install.endswith(" ".join(str(p) for p in sorted((bundle / "wheels").glob("*.whl"))))
    assert pythonpath.startswith(f"PYTHONPATH={tmp_path / 'site'}:{GPUSHIM}:{bundle}/plugin:{ROOT}")
    assert "-m continuum_lab.cli.gpu_bundle check-imports" in commands
    server = next(c for c in commands if c.startswith("-m sglang.launch_server"))
    assert f"--model-path {bundle}/models/{gb.MODEL_NAME}" in server
    assert " ".join(GPU_SHIM_FLAGS) in server and "--schedule-policy continuum" in server
    assert "--enable-metrics" in server
    smoke = next(c for c in commands if c.startswith("-m continuum_lab.cli.gpu_bundle smoke"))
    assert "--url http://127.0.0.1:30000" in smoke
    # the smoke watches the server it waits for (it died in 40 s once, and the smoke waited 7 minutes)
    assert re.search(r"--server-pid [1-9][0-9]*", smoke), smoke
    steps = next(c for c in commands if c.startswith("-m continuum_lab.cli.gpu_bundle steps"))
    assert "--profile configs/profiles/h100-sglang-llama-3.1-8b.json" in steps
    bench = next(c for c in commands if c.startswith("-m continuum_lab.cli.bench"))
    for part in (
        "--gpu shim",
        f"--model {bundle}/models/{gb.MODEL_NAME}",
        f"--workload {bundle}/workloads/{gb.WORKLOAD_NAME}",
        "--policies fcfs,lpm,continuum",
        "--prefill-profile configs/profiles/h100-sglang-shim-llama-3.1-8b.json",
    ):
        assert part in bench
    # the bench's own flag set is the one check-imports and the smoke server used
    out = r.stdout
    for key, value in GPU_SHIM_ENV.items():
        assert f"{key}={value}" in out


def test_waiting_for_a_server_that_died_fails_at_once():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    t0 = time.monotonic()
    with pytest.raises(gb.BundleError, match="exited before"):
        gb.wait_healthy("http://127.0.0.1:9", wait_s=60, server_pid=dead.pid)
    assert time.monotonic() - t0 < 30  # not the 60 s it would wait for a live one


def test_a_zombie_server_counts_as_dead():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while gb._alive(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)  # exited but not reaped: a zombie, as the shell's server is
        assert not gb._alive(child.pid)
    finally:
        child.wait()
    assert gb._alive(os.getpid())


def test_run_script_refuses_a_missing_bundle(tmp_path):
    env = {**os.environ, "BUNDLE": str(tmp_path), "PYTHON": "/bin/true", "OUT": str(tmp_path / "out")}
    r = subprocess.run(["bash", str(RUN_SH), "smoke"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and "continuum-gpu build" in r.stderr
    r = subprocess.run(["bash", str(RUN_SH), "nonsense"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2


CACHED_WHEELS = ROOT / ".gpu-bundle" / "wheels"


@pytest.mark.skipif(not CACHED_WHEELS.is_dir(), reason="no wheels cached here: run continuum-gpu build once")
def test_build_from_cached_wheels(tmp_path):
    """The real build (from the wheels a previous build downloaded): complete, slim, under the limit."""
    data = gb.build(tmp_path / ".gpu-bundle", find_links=CACHED_WHEELS)
    names = set(data["files"])
    assert {f"models/{gb.MODEL_NAME}/config.json", f"workloads/{gb.WORKLOAD_NAME}"} <= names
    assert len([n for n in names if n.startswith("wheels/")]) == len(gb.read_requirements())
    assert data["bytes"] < gb.LIMIT_BYTES


def test_step_times_set_each_measurement_beside_each_profiles_prediction(monkeypatch):
    monkeypatch.setattr(gb, "_generate_seconds", lambda url, prompts, new_tokens: float(new_tokens))
    profiles = [
        ROOT / "configs/profiles/h100-sglang-llama-3.1-8b.json",
        ROOT / "configs/profiles/h100-llama-3.1-8b.json",
    ]
    rows = gb.step_times("http://127.0.0.1:9", profiles)["rows"]
    prefill = {r["tokens"]: r for r in rows if r["what"] == "prefill"}
    assert prefill[4096]["h100-sglang-llama-3.1-8b"] == 0.0937 and prefill[4096]["h100-llama-3.1-8b"] == 0.125
    decode = [r for r in rows if r["what"] == "decode step"]
    assert [r["measured_s"] for r in decode] == [1.0, 1.0]  # (129 tokens - 1 token) / 128
    assert decode[0]["h100-sglang-llama-3.1-8b"] == 0.00648
    assert all(r["h100-llama-3.1-8b"] is None for r in decode)  # a prefill-only profile predicts no decode
