"""The house's shape, checked from the source (no imports run): the plugin and the lab apart, one
direction of dependency between the packages of each, SGLang internals only where the layout
says, the plugin's dependencies what serving needs, no module over 600 lines."""

import ast
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ROOT / "sglang_continuum"  # the plugin SGLang loads
LAB = ROOT / "lab" / "continuum_lab"  # what measures it
# Lowest first; a package may import only packages of a lower layer (peers are independent). The
# lab's layers all sit above the product's.
LAYERS = {
    "sglang_continuum": [{"core"}, {"adapter", "client"}],
    "continuum_lab": [{"workloads"}, {"harness"}, {"bench"}, {"emulator"}, {"cli"}],
}
ROOTS = {"sglang_continuum": PRODUCT, "continuum_lab": LAB}
# Who may import sglang.srt: the plugin's adapter, and the lab's layers that build SGLang in-process.
SGLANG_INTERNALS = {("sglang_continuum", "adapter"), *(("continuum_lab", p) for p in ("harness", "emulator", "cli"))}
# What the plugin may depend on: serving's needs (sglang itself comes with the server).
PLUGIN_DEPENDENCIES = {"numpy", "pydantic", "prometheus-client", "orjson"}
# Third-party modules the plugin's code may import: those, SGLang's, and what SGLang brings with it.
PLUGIN_IMPORTS = {"numpy", "pydantic", "prometheus_client", "orjson", "sglang", "torch", "zmq", "psutil"}
# Optional client integrations, each behind an extra of its own.
OPTIONAL = {"client/mini_swe_agent.py": {"httpx", "minisweagent"}}
MAX_LINES = 600


def modules(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


ALL = [(name, p) for name, root in ROOTS.items() for p in modules(root)]


def package_of(root: Path, path: Path) -> str:
    rel = path.relative_to(root).parts
    return rel[0] if len(rel) > 1 else ""


def imported(top: str, root: Path, path: Path) -> set[str]:
    """Every module name ``path`` imports, at module level or inside functions."""
    names: set[str] = set()
    parts = (top, *path.relative_to(root).with_suffix("").parts)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = parts[: len(parts) - node.level] if node.level else ()
            module = ".".join([*base, *([node.module] if node.module else [])])
            names.add(module)
            names |= {f"{module}.{a.name}" for a in node.names}
    return names


def layer(top: str, pkg: str) -> int:
    offset = 0 if top == "sglang_continuum" else len(LAYERS["sglang_continuum"])
    return offset + next(i for i, group in enumerate(LAYERS[top]) if pkg in group)


def _id(item) -> str:
    top, path = item
    return f"{top}/{path.relative_to(ROOTS[top])}"


@pytest.mark.parametrize("top", ROOTS)
def test_every_package_has_a_layer(top):
    packages = {package_of(ROOTS[top], p) for p in modules(ROOTS[top])} - {""}
    assert packages == set().union(*LAYERS[top]), "a new package needs its place in LAYERS (and in the layout docs)"


@pytest.mark.parametrize("item", ALL, ids=_id)
def test_imports_point_down(item):
    top, path = item
    own = package_of(ROOTS[top], path)
    for name in imported(top, ROOTS[top], path):
        parts = name.split(".")
        if parts[0] not in ROOTS:
            continue
        if top == "sglang_continuum":
            assert parts[0] == "sglang_continuum", f"the plugin imports the lab: {name}"
        if not own or len(parts) < 2 or (parts[0], parts[1]) == (top, own):
            continue
        if parts[1] not in set().union(*LAYERS[parts[0]]):
            continue  # a top-level module (the package's own __init__)
        below = layer(parts[0], parts[1])
        assert below < layer(top, own), f"{top}.{own} imports {name}: not below it"


@pytest.mark.parametrize("item", ALL, ids=_id)
def test_sglang_internals_only_where_the_layout_says(item):
    top, path = item
    if (top, package_of(ROOTS[top], path)) in SGLANG_INTERNALS:
        return
    touches = sorted(n for n in imported(top, ROOTS[top], path) if n.startswith(("sglang.srt", "torch")))
    assert not touches, f"{path.name} imports {touches}"  # sglang.lang is public


@pytest.mark.parametrize("item", ALL, ids=_id)
def test_no_module_over_the_limit(item):
    lines = len(item[1].read_text().splitlines())
    assert lines <= MAX_LINES, f"{lines} lines: split it by concern"


def test_the_plugin_depends_on_what_serving_needs():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {dep.split(">")[0].split("=")[0].split("[")[0].strip() for dep in project["dependencies"]}
    assert names <= PLUGIN_DEPENDENCIES, f"plugin dependencies beyond serving's needs: {names - PLUGIN_DEPENDENCIES}"
    scripts = project.get("scripts", {})
    assert not scripts, f"the plugin installs no command-line tools (they are the lab's): {sorted(scripts)}"


@pytest.mark.parametrize("path", modules(PRODUCT), ids=lambda p: str(p.relative_to(PRODUCT)))
def test_the_plugin_imports_only_its_dependencies(path):
    stdlib = __import__("sys").stdlib_module_names
    allowed = PLUGIN_IMPORTS | OPTIONAL.get(str(path.relative_to(PRODUCT)), set())
    for name in imported("sglang_continuum", PRODUCT, path):
        top = name.split(".")[0]
        if top in stdlib or top in ("sglang_continuum", "__future__", ""):
            continue
        assert top in allowed, f"{path.name} imports {name}: not a dependency of the plugin"
