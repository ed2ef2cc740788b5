"""The house's shape, checked from the source (no imports run): one direction of dependency
between the packages, SGLang internals only where the layout says, no module over 600 lines."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "sglang_continuum"
# Lowest first; a package may import only packages of a lower layer (peers are independent).
LAYERS = [
    {"core"},
    {"adapter", "client", "workloads"},
    {"harness"},
    {"bench"},
    {"emulator"},
    {"cli"},
]
LAYER_OF = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}
# Who may import sglang.srt: the plugin's adapter, and the layers that build SGLang in-process.
SGLANG_INTERNALS = {"adapter", "harness", "emulator", "cli"}
MAX_LINES = 600


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def package_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE).parts
    return rel[0] if len(rel) > 1 else ""


def imported(path: Path) -> set[str]:
    """Every module name ``path`` imports, at module level or inside functions."""
    names: set[str] = set()
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = parts[: len(parts) - node.level] if node.level else ()
            module = ".".join([*base, *([node.module] if node.module else [])])
            names.add(module)
            names |= {f"{module}.{a.name}" for a in node.names}
    return names


def test_every_package_has_a_layer():
    packages = {package_of(p) for p in modules()} - {""}
    assert packages == set(LAYER_OF), "a new package needs its place in LAYERS (and in the layout docs)"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path):
    own = package_of(path)
    if not own:
        return
    for name in imported(path):
        parts = name.split(".")
        if parts[0] != "sglang_continuum" or len(parts) < 2 or parts[1] not in LAYER_OF or parts[1] == own:
            continue
        assert LAYER_OF[parts[1]] < LAYER_OF[own], f"{own} (layer {LAYER_OF[own]}) imports {name}: not below it"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_sglang_internals_only_where_the_layout_says(path):
    if package_of(path) in SGLANG_INTERNALS:
        return
    touches = sorted(n for n in imported(path) if n.startswith(("sglang.srt", "torch")))  # sglang.lang is public
    assert not touches, f"{path.name} imports {touches}"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_over_the_limit(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{lines} lines: split it by concern"
