"""Tier 3: every recipe of docs/clients.md, run as written against a real server.

A recipe is a fenced block whose first line is ``# recipe: <name>``; it runs with the server's
address in place of ``http://localhost:30000``. Each must be served as the program it says it is
(counted by id source in ``/metrics``), and each that can end its program must leave nothing in
flight: the fixture's pins last 25 s, so a program that did not end would still be there."""

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from continuum_lab.harness.server import parse_metrics
from tests.e2e.conftest import wait_until

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "clients.md"
PLACEHOLDER = "http://localhost:30000"
BLOCK = re.compile(r"^```(\w+)\n# recipe: ([\w-]+)\n(.*?)^```", re.S | re.M)
M = "sglang:continuum_"

# recipe -> (id source counted for its requests, at least how many, whether it ends its program)
EXPECTED = {
    "openai": ("program_id", 3, True),
    "curl-chat": ("program_id", 2, True),
    "curl-generate": ("program_id", 2, True),
    "vllm-fields": ("program_id", 2, True),
    "frontend": ("program_id", 2, True),
    "mini-swe-agent": ("program_id", 1, True),
    "claude-code": ("program_id", 3, False),  # ends by silence, as Claude Code does
    "no-ids": ("inferred", 1, False),  # nothing ends it but its silence
}


def requests_by(server, id_source: str) -> float:
    """``sglang:continuum_requests_total{id_source=...}``, summed over the other labels."""
    pattern = re.compile(r'^%srequests_total\{[^}]*id_source="%s"[^}]*\} (\S+)$' % (M, id_source), re.M)
    return sum(float(v) for v in pattern.findall(server.metrics()))


def recipes() -> dict[str, tuple[str, str]]:
    return {name: (lang, code) for lang, name, code in BLOCK.findall(PAGE.read_text())}


# what the server says of its queue and door when a recipe does not finish
STATE = ("programs_in_flight", "programs_held_back", "longest_hold_seconds", "pinned_programs", "working_set_tokens")


def run_recipe(name: str, url: str, cwd: Path, server=None) -> str:
    lang, code = recipes()[name]
    code = code.replace(PLACEHOLDER, url)
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    command = [sys.executable, "-c", code] if lang == "python" else ["bash", "-e", "-o", "pipefail", "-c", code]
    try:  # a hang guard, not a speed target: the CI machine's two cores also run the other e2e half
        done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as e:
        metrics = parse_metrics(server.metrics()) if server is not None else {}
        state = {g: metrics.get(M + g) for g in STATE}
        out = (e.stdout or b"")[-2000:]
        raise AssertionError(f"recipe {name} did not finish in {e.timeout} s; the server: {state}\n{out!r}") from e
    assert done.returncode == 0, f"recipe {name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done.stdout


def wait_in_flight_zero(server, timeout_s: float) -> bool:
    return not wait_until(server, ("programs_in_flight",), timeout_s)


def test_the_page_has_every_recipe_the_test_expects():
    assert set(recipes()) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED, key=lambda n: not EXPECTED[n][2]))  # the ones that end first
def test_recipe_is_served_as_its_program_and_ends_it(continuum_server, name, tmp_path):
    source, at_least, ends = EXPECTED[name]
    if ends:  # a recipe that ends its program is judged from an empty working set
        assert wait_in_flight_zero(continuum_server, 40), "programs of earlier tests still in flight"
    before = requests_by(continuum_server, source)
    run_recipe(name, continuum_server.url, tmp_path, continuum_server)
    assert requests_by(continuum_server, source) - before >= at_least
    if ends:
        assert wait_in_flight_zero(continuum_server, 10), f"recipe {name} left its program in flight"


TURN = re.compile(r"turn (\d+): (\d+) new input tokens, (\d+) cached")


def later_turns_cached_share(stdout: str) -> float:
    turns = [(int(new), int(cached)) for n, new, cached in TURN.findall(stdout) if int(n) > 1]
    assert len(turns) >= 2, stdout
    return sum(c for _, c in turns) / sum(n + c for n, c in turns)


def test_claude_codes_later_turns_are_cached_as_with_explicit_ids(continuum_server, tmp_path):
    """The recipe as Claude Code sends it (session header, a new attribution nonce each turn)
    against the same conversation with an explicit program id and an attribution block that never
    changes."""
    code = recipes()["claude-code"][1]
    explicit = code.replace('headers={"x-claude-code-session-id": session,', "headers={").replace(
        '"messages": messages}', '"messages": messages, "metadata": {"program_id": session}}'
    )
    explicit = explicit.replace("cch={nonce};", "cch=00000;")  # a constant block: nothing to strip
    assert explicit != code
    before = parse_metrics(continuum_server.metrics())
    as_sent = later_turns_cached_share(run_recipe("claude-code", continuum_server.url, tmp_path))
    with_ids = later_turns_cached_share(_run_code(explicit, continuum_server.url, tmp_path))
    after = parse_metrics(continuum_server.metrics())
    assert as_sent >= 0.9 * with_ids and with_ids > 0.5, (as_sent, with_ids)
    assert after[M + "pins_created_total"] - before[M + "pins_created_total"] >= 4  # two pins a conversation


def _run_code(code: str, url: str, cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code.replace(PLACEHOLDER, url)], cwd=cwd, capture_output=True, text=True, timeout=150
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def test_a_claude_code_side_request_is_not_its_conversations_turn(continuum_server):
    """No tools: a title or quota check, served as a request without an id under the same session
    (as under fcfs, or as a new program of its own where id-less requests lately were continued)."""
    idless = ("none", "first_turn", "inferred")
    named, before = requests_by(continuum_server, "program_id"), sum(requests_by(continuum_server, s) for s in idless)
    reply = httpx.post(
        continuum_server.url + "/v1/messages",
        headers={"x-claude-code-session-id": "side-request-session"},
        json={"model": "default", "max_tokens": 4, "messages": [{"role": "user", "content": "quota"}]},
        timeout=120,
    )
    assert reply.status_code == 200, reply.text
    assert requests_by(continuum_server, "program_id") == named
    assert sum(requests_by(continuum_server, s) for s in idless) == before + 1
