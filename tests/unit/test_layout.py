"""The house's shape, checked from the source (no imports run): the plugin and the lab apart, one
direction of dependency between the packages of each, SGLang internals only where the layout
says, the plugin's dependencies what serving needs, no module over 600 lines."""

import ast
import re
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
# The plugin is held tighter: a file a reviewer reads in one sitting, a function on one screen.
MAX_PRODUCT_LINES = 500
MAX_PRODUCT_FUNCTION_LINES = 60
# The controller routes events; a decision it would grow belongs in a room of its own (core/rules.py).
MAX_CONTROLLER_LINES = 450
OPERATOR_COMMANDS = {"continuum-top": "sglang_continuum.top:main"}


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
    top, path = item
    lines = len(path.read_text().splitlines())
    limit = MAX_PRODUCT_LINES if top == "sglang_continuum" else MAX_LINES
    assert lines <= limit, f"{lines} lines: split it by concern"


def test_the_controller_routes_and_leaves_decisions_to_rooms():
    lines = len((PRODUCT / "core" / "controller.py").read_text().splitlines())
    assert lines <= MAX_CONTROLLER_LINES, f"{lines} lines: move the decision it grew into a room"


@pytest.mark.parametrize("path", modules(PRODUCT), ids=lambda p: str(p.relative_to(PRODUCT)))
def test_no_plugin_function_over_a_screen(path):
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_PRODUCT_FUNCTION_LINES
    ]
    assert not long, f"split by what each part decides: {long}"


def test_the_plugin_depends_on_what_serving_needs():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {dep.split(">")[0].split("=")[0].split("[")[0].strip() for dep in project["dependencies"]}
    assert names <= PLUGIN_DEPENDENCIES, f"plugin dependencies beyond serving's needs: {names - PLUGIN_DEPENDENCIES}"
    # one command for operators, the live view (standard library only: tests/unit/test_top.py); the rest are the lab's
    scripts = project.get("scripts", {})
    assert scripts == OPERATOR_COMMANDS, f"the plugin's command-line tools are the lab's: {sorted(scripts)}"


@pytest.mark.parametrize("path", modules(PRODUCT), ids=lambda p: str(p.relative_to(PRODUCT)))
def test_the_plugin_imports_only_its_dependencies(path):
    stdlib = __import__("sys").stdlib_module_names
    allowed = PLUGIN_IMPORTS | OPTIONAL.get(str(path.relative_to(PRODUCT)), set())
    for name in imported("sglang_continuum", PRODUCT, path):
        top = name.split(".")[0]
        if top in stdlib or top in ("sglang_continuum", "__future__", ""):
            continue
        assert top in allowed, f"{path.name} imports {name}: not a dependency of the plugin"


def climbs(path: Path, root: Path) -> list[str]:
    """Every ``parents[N]`` / ``.parent`` chain on ``__file__`` in ``path`` that leaves ``root``
    (a package is installed on its own: what lies beside it is not there)."""
    depth = len(path.relative_to(root).parts) - 1  # parents[depth] is the package's own folder
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not any(isinstance(n, ast.Name) and n.id == "__file__" for n in ast.walk(node)):
            continue
        up = None
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "parents":
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int):
                up = node.slice.value
        elif isinstance(node, ast.Attribute) and node.attr == "parent":
            chain, inner = 0, node
            while isinstance(inner, ast.Attribute) and inner.attr == "parent":
                chain, inner = chain + 1, inner.value
            up = chain - 1
        if up is not None and up > depth:
            out.append(f"line {node.lineno}: {ast.unparse(node)}")
    return out


@pytest.mark.parametrize("item", ALL, ids=_id)
def test_no_path_climbs_out_of_its_package(item):
    top, path = item
    found = climbs(path, ROOTS[top])
    assert not found, (
        f"reaches outside {top} (take the path as an argument, relative to the working directory): {found}"
    )


TESTS = ROOT / "tests"
# The product's tests use the product: the lab is neither imported nor resolved from a string
# (a rules string such as "continuum_lab.bench.variants:PINS_ONLY" imports it).
PRODUCT_TESTS = sorted((TESTS / "unit").glob("*.py"))
LAB_NAME = re.compile(r"^continuum_lab(\.|:|$)")


def lab_references(path: Path, strings: bool) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        elif strings and isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value]
        found += [f"line {node.lineno}: {n}" for n in names if LAB_NAME.match(n)]
    return found


@pytest.mark.parametrize("path", PRODUCT_TESTS, ids=lambda p: p.name)
def test_no_product_test_imports_the_lab(path):
    found = lab_references(path, strings=path.name != "test_layout.py")
    assert not found, f"tests/unit tests the plugin alone (the lab's tests are in tests/lab): {found}"


def test_the_shared_test_support_imports_no_lab_code():
    found = lab_references(TESTS / "support.py", strings=False)
    assert not found, f"tests/support.py is shared by the product's tests: {found}"


# Private names of the plugin the lab still imports, until the plugin gives them a public name.
PRIVATE_IMPORTS: set[tuple[str, str]] = set()


def private_imports(path: Path) -> set[str]:
    return {
        n
        for n in imported("continuum_lab", LAB, path)
        if n.startswith("sglang_continuum.")
        and any(part.startswith("_") and not part.endswith("__") for part in n.split("."))
    }


def test_the_lab_imports_only_public_names_of_the_plugin():
    found = {(str(p.relative_to(LAB)), n) for p in modules(LAB) for n in private_imports(p)}
    assert found - PRIVATE_IMPORTS == set(), (
        "the lab imports a private name of the plugin: ask the plugin for a public one"
    )
    assert PRIVATE_IMPORTS - found == set(), "no longer imported: drop it from PRIVATE_IMPORTS"
