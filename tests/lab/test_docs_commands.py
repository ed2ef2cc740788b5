"""Every command the docs show (README and docs/): each flag of a lab command (``continuum-bench``,
``continuum-agents``, ..., ``python -m continuum_lab...``) and of the plugin's ``continuum-top`` is
one its argparse defines, each ``--policies`` name is a policy the bench runs today, and each
``SGLANG_CONTINUUM_RULES=...`` resolves. The scan of the pages is ``tests/unit/test_docs.py``'s; this half lives
with the lab's tests because it reads the lab's command-line code. SGLang's own server flags:
``tests/sglang/test_docs_server_flags.py``."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path
from typing import Iterator

from tests.unit.test_docs import ROOT, _doc_pages, _lines, _where

# --- commands and their flags --------------------------------------------------------------------

SCRIPTS = {  # every console script the two distributions declare: name -> module
    name: module
    for pyproject in (ROOT / "pyproject.toml", ROOT / "lab" / "pyproject.toml")
    for name, module in re.findall(r'^(continuum-[a-z-]+) = "([a-z_.]+):main"', pyproject.read_text(), re.M)
}
INLINE = re.compile(r"`([^`]+)`")
SEPARATORS = {"|", "||", "&&", ";", ">", ">>", "2>&1", "&"}


def _command_lines(page: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of each shell command the page shows: lines of fenced and indented code blocks
    (continuations joined) and inline code spans."""
    pending, start = "", 0
    for number, line, fenced in _lines(page):
        code = fenced or line.startswith("    ")
        if code or pending:
            if not pending:
                start = number
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            yield start, pending + line
            pending = ""
        if not fenced:
            for span in INLINE.findall(line):
                yield number, span


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError:  # an unbalanced quote: a fragment, not a command
        return []


def commands(pages: list[Path] | None = None) -> Iterator[tuple[Path, int, str, list[str]]]:
    """(page, line, command, its arguments) for each lab script, ``python -m <module>`` and SGLang
    server launch the pages show; ``sglang.launch_server`` and ``sglang serve`` are named
    "sglang.launch_server"."""
    for page in pages or _doc_pages():
        for number, text in _command_lines(page):
            words = _words(text)
            while words:
                cut = next((i for i, w in enumerate(words) if w in SEPARATORS), len(words))
                part, words = words[:cut], words[cut + 1 :]
                part = [w for w in part if not re.match(r"^[A-Z_][A-Z0-9_]*=", w)] or [""]
                name, args = part[0], part[1:]
                if name.endswith(("python", "python3")) and args[:1] == ["-m"] and len(args) > 1:
                    name, args = args[1], args[2:]
                    if name.startswith("continuum_lab."):
                        yield page, number, name, args
                elif name == "sglang" and args[:1] == ["serve"]:
                    name, args = "sglang.launch_server", args[1:]
                if name in SCRIPTS or name == "sglang.launch_server":
                    yield page, number, name, args


def _module_file(module: str) -> Path:
    path = ROOT / ("" if module.startswith("sglang_continuum.") else "lab") / Path(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _argparse_flags(module: str, seen: set[str] | None = None) -> set[str]:
    """Every ``--flag`` the module's ``add_argument`` calls define, and those of the lab modules it
    imports from (a CLI assembled from several files)."""
    seen = set() if seen is None else seen
    path = _module_file(module)
    if module in seen or not path.is_file():
        return set()
    seen.add(module)
    flags: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            named = [a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")]
            flags.update(named)
            if any(getattr(k.value, "attr", "") == "BooleanOptionalAction" for k in node.keywords):
                flags.update("--no-" + flag[2:] for flag in named)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            ("continuum_lab.cli", "sglang_continuum.top")
        ):
            flags |= _argparse_flags(node.module, seen)
    return flags


def _flags(args: list[str]) -> Iterator[str]:
    for arg in args:
        if arg.startswith("--") and len(arg) > 2 and " " not in arg:  # not a quoted value: '--a 1'
            yield arg.split("=", 1)[0]


def test_every_lab_command_flag_the_docs_show_exists():
    unknown, defined = [], {}
    for page, number, name, args in commands():
        if name == "sglang.launch_server":
            continue  # SGLang's own flags: tests/sglang/test_docs_server_flags.py
        if name not in defined:
            defined[name] = _argparse_flags(SCRIPTS.get(name, name)) | {"--help"}
        unknown += [_where(page, number, f"{name} {flag}") for flag in _flags(args) if flag not in defined[name]]
    assert not unknown, "\n".join(unknown)


def server_flags() -> Iterator[tuple[Path, int, str]]:
    """(page, line, flag) of each SGLang server flag the pages show: on a server launch, and inside
    ``continuum-bench --server-args``."""
    for page, number, name, args in commands():
        if name == "sglang.launch_server":
            yield from ((page, number, flag) for flag in _flags(args))
        for i, arg in enumerate(args):
            if arg.startswith("--server-args"):
                value = arg.split("=", 1)[1] if "=" in arg else (args[i + 1] if i + 1 < len(args) else "")
                yield from ((page, number, flag) for flag in _flags(_words(value)))


def test_every_policy_the_docs_run_is_the_labs():
    """Each name in a command's ``--policies`` (``+hicache...`` and ``@router`` suffixes included)
    is a policy ``continuum-bench`` runs today."""
    from continuum_lab.bench.policies import parse_policy

    unknown = []
    for page, number, name, args in commands():
        for i, arg in enumerate(args):
            value = arg.split("=", 1)[1] if arg.startswith("--policies=") else None
            if arg == "--policies" and i + 1 < len(args):
                value = args[i + 1]
            for policy in (value or "").split(","):
                try:
                    parse_policy(policy.partition("@")[0]) if policy and not policy.startswith("$") else None
                except SystemExit:
                    unknown.append(_where(page, number, f"{name} --policies {policy}"))
    assert not unknown, "\n".join(unknown)


def test_every_rules_value_the_docs_set_resolves():
    """``SGLANG_CONTINUUM_RULES=...`` on a page names a composition that resolves today."""
    from sglang_continuum.core.rules import resolve_rules

    wrong = []
    for page in _doc_pages():
        for number, line, _ in _lines(page):
            for value in re.findall(r"SGLANG_CONTINUUM_RULES=['\"]?([^'\"\s`]+)", line):
                try:
                    resolve_rules(value)
                except (ValueError, ImportError, AttributeError, TypeError):
                    wrong.append(_where(page, number, value))
    assert not wrong, "\n".join(wrong)
