"""The GPU run's settings against real SGLang 0.5.23: its server flags parse to the intended
backends, its environment variables are SGLang's own, and every module-level ``sgl_kernel``
import of the modules a server loads resolves with the placeholder in gpushim/."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from continuum_lab.cli.gpu_bundle import SERVING_MODULES
from continuum_lab.harness.server import GPU_SHIM_ENV, GPU_SHIM_FLAGS

pytestmark = pytest.mark.sglang

ROOT = Path(__file__).resolve().parents[2]
GPUSHIM = ROOT / "gpushim"
SHIM_SUBMODULES = {p.stem for p in (GPUSHIM / "sgl_kernel").glob("*.py")} - {"__init__", "_placeholder"}


def test_gpu_flags_select_the_kernel_free_backends():
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(["--model-path", "m", *GPU_SHIM_FLAGS])
    assert ns.attention_backend == "triton"
    assert ns.sampling_backend == "pytorch"
    assert ns.disable_prefill_cuda_graph and ns.disable_decode_cuda_graph
    assert ns.load_format == "dummy" and ns.skip_tokenizer_init


def test_gpu_env_names_are_sglangs_own():
    from sglang.srt.environ import envs

    for name in GPU_SHIM_ENV:
        assert hasattr(envs, name), f"SGLang 0.5.23 has no environment variable {name}"


def _guarded(node: ast.Try) -> bool:
    names = set()
    for handler in node.handlers:
        for t in handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]:
            names.add(getattr(t, "id", None))
    return bool(names & {"ImportError", "ModuleNotFoundError", "Exception", None})


# SGLang's platform flags (``_is_xpu = is_xpu()``) other than CUDA: branches under them never run there
OTHER_PLATFORMS = {
    "_is_xpu",
    "_is_npu",
    "_is_hip",
    "_is_musa",
    "_is_cpu",
    "_is_mps",
    "_use_aiter",
    "_is_cpu_amx_available",
}


def _other_platform(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id in OTHER_PLATFORMS
    return isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) and any(map(_other_platform, test.values))


def _module_level_sgl_kernel_imports(tree: ast.Module):
    """(submodule or '', names) of each import of sgl_kernel run at import time on CUDA: under
    ``if`` too (but not another platform's), not inside functions or classes, not inside a try
    that catches ImportError."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If):
            stack += ([] if _other_platform(node.test) else node.body) + node.orelse
        elif isinstance(node, ast.Try) and not _guarded(node):
            stack += node.body + node.orelse + node.finalbody
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sgl_kernel":
            yield node.module.partition(".")[2], [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "sgl_kernel":
                    yield alias.name.partition(".")[2], []


def test_every_import_time_sgl_kernel_import_of_a_server_resolves_with_the_shim():
    """The modules a server loads are those importing SERVING_MODULES loads here (on CPU; CUDA takes
    the ``if _is_cuda`` branches of the same files, which the scan reads too)."""
    env = {**os.environ, "PYTHONPATH": f"{GPUSHIM}{os.pathsep}{ROOT}"}
    code = (
        "import importlib, json, sys\n"
        f"for m in {list(SERVING_MODULES)!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted({m.__file__ for n, m in list(sys.modules.items())\n"
        "    if n.split('.')[0] == 'sglang' and getattr(m, '__file__', None)})))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    files = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(files) > 300  # the launcher, scheduler, model runner, layers ...
    imports = {}
    for f in files:
        for sub, names in _module_level_sgl_kernel_imports(ast.parse(Path(f).read_text())):
            imports.setdefault(sub, set()).update(names)
    # on a Llama/Triton server these are imported at module level under `if _is_cuda`
    assert {"", "utils", "kvcacheio"} <= set(imports)
    assert {"rmsnorm", "fused_add_rmsnorm", "silu_and_mul"} <= imports[""]
    missing = set(imports) - {""} - SHIM_SUBMODULES
    assert not missing, f"import-time sgl_kernel submodules without a placeholder in gpushim/: {missing}"
    lines = [
        f"from sgl_kernel{'.' + sub if sub else ''} import {name}" for sub, names in imports.items() for name in names
    ]
    lines.append("from sgl_kernel.utils import is_arch_support_pdl; assert is_arch_support_pdl() is False")
    r = subprocess.run([sys.executable, "-c", "\n".join(lines)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


DUAL_GEMM = "sglang.kernels.ops.gemm.cutedsl_dual_gemm"


def test_the_dual_gemm_stand_in_gives_what_its_importers_take_and_says_no():
    """On the H100 a Llama server stopped at model construction: ``DualGemm._select_mode`` imports
    the CuTe DSL module (``import cutlass``, not in the bundle). gpushim/sitecustomize.py stands in
    for it: every name SGLang imports from it exists, and the Llama MLP selects no dual GEMM."""
    import sglang

    wanted = set()
    for f in Path(sglang.__file__).parent.rglob("*.py"):
        text = f.read_text(errors="replace")
        if DUAL_GEMM not in text or f.name == "cutedsl_dual_gemm.py":
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module == DUAL_GEMM:
                wanted |= {a.name for a in node.names}
    assert {"MAX_DUAL_GEMM_DECODE_TOKENS", "DualGemmQuantMode", "can_use_dual_gemm"} <= wanted
    env = {**os.environ, "PYTHONPATH": f"{GPUSHIM}{os.pathsep}{ROOT}"}
    code = (
        "import importlib, sys, types, torch\n"
        f"standin = importlib.import_module({DUAL_GEMM!r})\n"
        f"missing = [n for n in {sorted(wanted)!r} if not hasattr(standin, n)]\n"
        "assert not missing, missing\n"
        "import sglang.srt.layers.dual_gemm as dg\n"
        "from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod\n"
        "dg.is_cuda = lambda: True  # the branch a CUDA server takes\n"
        "proj = types.SimpleNamespace(quant_method=UnquantizedLinearMethod(), params_dtype=torch.bfloat16,\n"
        "                             output_partition_sizes=[14336, 14336])\n"
        "gemm = object.__new__(dg.DualGemm)\n"
        "gemm.down_proj = None\n"
        "assert gemm._select_mode(proj, 4096) is None\n"
        "assert 'cutlass' not in sys.modules\n"
    )
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
