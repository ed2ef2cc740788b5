"""Tier 3: the wheel built from this checkout, installed into a new virtual environment, serves
``--schedule-policy continuum`` with nothing taken from the checkout.

What docs/install.md tells an operator to run, less the ``[gpu]`` extra (it pulls CUDA wheels):
``pip wheel --no-deps -w dist .`` then an install of ``dist/sglang_continuum-<version>-py3-none-any.whl``
beside an existing SGLang 0.5.23. The installer (uv, from its cache) resolves the plugin's own
dependencies from the wheel's metadata into the new environment. SGLang, torch and the rest of
SGLang's stack are borrowed from ``.venv`` through a filtered view of its site-packages (symlinks,
appended to ``sys.path`` by a ``.pth`` file): installing them afresh from uv's cache takes ~8 s, but
compiling their bytecode ~60 s more on 2 cores (without it every server process imports SGLang at
twice the cost), for packages that are not what this test is about. The view leaves out the
checkout's editable plugin (and the lab) and every distribution the installer put in the new
environment.
"""

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import httpx
import pytest
import tomllib

from continuum_lab.harness.server import SGLangServer, parse_metrics

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
WHEEL = f"sglang_continuum-{VERSION}-py3-none-any.whl"
# what a view of .venv's site-packages must not show the new environment: the checkout's plugin and
# lab (editable dist-infos and finders), and the CPU shim, which is installed there as setup.sh does
BORROWED = "borrowed-site-packages"
NOT_BORROWED = ("sglang_continuum", "__editable__", "continuum_cpushim", "sgl_kernel", "_distutils_hack", "distutils-")
# what the new environment's python may not inherit from the test's: the checkout on the import path
# (the conventions put it on PYTHONPATH) and .venv as the active environment
NOT_INHERITED = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV")

CHECK = """
import importlib.metadata as md, importlib.util, json, sglang_continuum
dists = [d.version for d in md.distributions() if d.metadata["Name"] == "sglang-continuum"]
(plugin,) = [ep for ep in md.entry_points(group="sglang.srt.plugins") if ep.name == "continuum"]
register = plugin.load()
deps = {}
for name in ("numpy", "pydantic", "prometheus_client", "orjson"):
    deps[name] = __import__(name).__file__
print(json.dumps({
    "plugin_file": sglang_continuum.__file__, "plugin_version": sglang_continuum.__version__, "dists": dists,
    "entry_point": f"{register.__module__}:{register.__name__}", "requires": md.requires("sglang-continuum"),
    "sglang_file": str(md.distribution("sglang").locate_file("sglang/__init__.py")),
    "sglang_version": md.version("sglang"), "deps": deps, "lab": importlib.util.find_spec("continuum_lab") is not None,
}))
"""


def build_wheel(out: Path) -> Path:
    """``pip wheel --no-deps`` of a copy of the plugin's sources: a stale ``build/`` in the checkout
    (setuptools copies it into the wheel) cannot leak in, and two runs never share one."""
    src = out / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "sglang_continuum", src / "sglang_continuum", ignore=shutil.ignore_patterns("__pycache__"))
    dist = out / "dist"
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), str(src)]
    subprocess.run(cmd, check=True, timeout=120)
    assert [p.name for p in dist.iterdir()] == [WHEEL]
    return dist / WHEEL


def versions_in_use() -> str:
    """Constraints: every distribution of the test's environment at its version, so the installer
    picks the plugin's dependencies at the versions the borrowed SGLang runs with."""
    pins = {
        d.metadata["Name"]: d.version
        for d in importlib.metadata.distributions()
        if d.metadata["Name"] and not d.metadata["Name"].startswith("sglang-continuum")
    }
    return "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()))


def site_packages(python: Path) -> Path:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(subprocess.run([str(python), "-c", code], check=True, capture_output=True, text=True).stdout.strip())


def project_of(entry: str) -> str | None:
    """The normalised project name of a ``.dist-info`` folder, None for anything else."""
    if not entry.endswith(".dist-info"):
        return None
    return re.sub(r"[-_.]+", "-", entry[: -len(".dist-info")].rsplit("-", 1)[0]).lower()


def borrow_sglang_stack(venv_site: Path, view: Path) -> list[str]:
    """Link every entry of .venv's site-packages the new environment lacks into ``view`` and put
    ``view`` on its path after its own site-packages; returns what was linked."""
    own = set(os.listdir(venv_site))
    own_projects = {project_of(e) for e in own} - {None}
    view.mkdir()
    source = Path(sysconfig.get_paths()["purelib"])  # the test's environment: .venv
    linked = []
    for entry in sorted(os.listdir(source)):
        if entry.startswith(NOT_BORROWED) or entry.endswith(".pth") or entry in own:
            continue
        if project_of(entry) in own_projects:
            continue
        (view / entry).symlink_to(source / entry)
        linked.append(entry)
    # a path line in a .pth file is appended to sys.path after the environment's own site-packages
    (venv_site / "zz_borrowed_sglang_stack.pth").write_text(f"{view}\n")
    return linked


def make_environment(tmp_path: Path, wheel: Path) -> Path:
    """A new virtual environment with the wheel installed; returns its python."""
    uv = Path(sys.executable).parent / "uv"  # requirements/setup.txt
    venv = tmp_path / "venv"
    subprocess.run([str(uv), "venv", "-q", "--python", sys.executable, str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    constraints = tmp_path / "versions-in-use.txt"
    constraints.write_text(versions_in_use())
    # compiled as setup.sh compiles .venv: this machine's Python writes no .pyc (PYTHONDONTWRITEBYTECODE),
    # and every server process would compile numpy and pydantic again
    install = [str(uv), "pip", "install", "-q", "--compile-bytecode", "--python", str(python)]
    install += ["-c", str(constraints), str(wheel)]
    subprocess.run(install, check=True, timeout=300)
    venv_site = site_packages(python)
    # the CPU shim stands in for GPU kernels (torchvision's ops, sgl_kernel), as scripts/setup.sh
    # installs it: copied into the environment, its .pth installing an import hook
    shim = ROOT / "cpushim"
    shutil.copy2(shim / "continuum_cpushim.py", venv_site)
    shutil.copy2(shim / "continuum_cpushim.pth", venv_site)
    shutil.copytree(shim / "sgl_kernel", venv_site / "sgl_kernel", ignore=shutil.ignore_patterns("__pycache__"))
    linked = borrow_sglang_stack(venv_site, tmp_path / BORROWED)
    assert any(e.startswith("sglang-0.5.23") for e in linked) and "torch" in linked
    return python


def clean_env(python: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    return env


def generate(url: str, text: str, custom_params: dict) -> dict:
    sp = {"max_new_tokens": 4, "ignore_eos": True, "custom_params": custom_params}
    r = httpx.post(url + "/generate", json={"text": text, "sampling_params": sp}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_built_wheel_installs_into_a_clean_environment_and_serves(tiny_model, tmp_path, monkeypatch):
    started = time.monotonic()
    python = make_environment(tmp_path, build_wheel(tmp_path))
    outside = tmp_path / "elsewhere"  # a working directory outside the checkout
    outside.mkdir()
    env = clean_env(python)
    probe = subprocess.run(
        [str(python), "-c", CHECK], cwd=outside, env=env, capture_output=True, text=True, timeout=120
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    venv_site = str(site_packages(python))
    assert found["plugin_file"].startswith(venv_site + os.sep), found["plugin_file"]
    assert found["dists"] == [VERSION] and found["plugin_version"] == VERSION
    assert found["entry_point"] == "sglang_continuum.adapter.plugin:register"
    assert 'sglang==0.5.23; extra == "gpu"' in found["requires"]
    for name, path in found["deps"].items():  # resolved by the installer, not borrowed
        assert path.startswith(venv_site + os.sep), (name, path)
    assert found["sglang_version"] == "0.5.23"
    assert not found["lab"]  # nothing of the checkout on the path
    assert found["sglang_file"].startswith(str(tmp_path / BORROWED) + os.sep), found["sglang_file"]
    installed_s = time.monotonic() - started

    log = tmp_path / "server.log"
    args = ["--schedule-policy", "continuum", "--max-total-tokens", "2048", "--enable-metrics"]
    server = SGLangServer(tiny_model, [*args, "--mem-fraction-static", "0.5"], log_path=log)
    server.cmd[0] = str(python)  # the new environment's python, with none of the test's path
    server.env = env
    monkeypatch.chdir(outside)  # the launcher and its schedulers start here
    server.start()
    try:
        turn = {"program_id": "wheel-install-1", "is_last_step": False, "tool_name": "bash"}
        first = generate(server.url, "ls cd grep find " * 20, turn)
        generate(server.url, "ls cd grep find " * 20 + first["text"] + " ok", {**turn, "is_last_step": True})
        text = server.metrics()
    finally:
        server.stop(graceful=False)  # it keeps nothing worth saving (SIGTERM would cost ~5 s)
    served = parse_metrics(text)
    assert served["sglang:continuum_requests_admitted_total"] >= 2
    assert re.search(r'^sglang:continuum_info\{[^}]*version="' + re.escape(VERSION) + '"', text, re.M)
    assert "continuum: active" in log.read_text()
    print(f"wheel built and installed in {installed_s:.1f} s, {time.monotonic() - started:.1f} s with the server")
