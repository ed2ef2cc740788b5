"""Tier 3: the live view over a real ``sglang.launch_server`` (the session's continuum server,
every turn pinned 25 s): ``GET /server_info`` shows the programs sent to it with their pins, and
``continuum-top`` shows them in a real terminal (a detached tmux session) and quits on q or Ctrl-C."""

import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from sglang_continuum.client import continuum_extra_body
from sglang_continuum.client.params import RELEASE_PATH, release_body
from tests.e2e.conftest import POOL

pytestmark = pytest.mark.e2e
WORDS = "ls cd grep find python pytest git diff patch file line error test tool search fetch".split()
ROOT = Path(__file__).resolve().parents[2]


def text(n_words: int, salt: int) -> str:
    return " ".join(WORDS[(i * 5 + salt) % len(WORDS)] + str((i + salt) % 89) for i in range(n_words))


def program_turns(url: str, pid: str, tool: str, turns: int, salt: int) -> None:
    """``turns`` turns of ``pid``, each calling ``tool``, none the last: each leaves a pin."""
    client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": text(80, salt)}]
    for turn in range(turns):
        reply = client.chat.completions.create(
            model="m",
            messages=messages,
            max_tokens=8,
            extra_body=continuum_extra_body(pid, tool_name=tool, ignore_eos=True),
        )
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": text(10, salt + turn + 1)},
        ]


def end_programs(url: str, *pids: str) -> None:
    for pid in pids:
        httpx.post(url + RELEASE_PATH, json=release_body(pid), timeout=30)


def views(url: str) -> list[dict]:
    body = httpx.get(url + "/server_info", timeout=30).json()
    return [state["continuum"] for state in body["internal_states"]]


def test_server_info_shows_each_program_with_its_pin(continuum_server):
    url = continuum_server.url
    a, b = f"view-a-{uuid.uuid4().hex[:6]}", f"view-b-{uuid.uuid4().hex[:6]}"
    try:
        program_turns(url, a, "bash", turns=2, salt=1)
        program_turns(url, b, "grep", turns=1, salt=40)
        [view] = views(url)  # one data-parallel rank
        rows = {row["id"]: row for row in view["programs"]}
        assert view["server"]["dp_rank"] == 0 and view["server"]["pool_tokens"] >= POOL
        assert view["server"]["pin_budget_tokens"] == POOL // 2 and view["server"]["programs_omitted"] == 0
        for pid, tool, turns in ((a, "bash", 2), (b, "grep", 1)):
            row = rows[pid]
            assert row["state"] == "tool" and row["tool"] == tool
            assert (row["turns_admitted"], row["turns_finished"]) == (turns, turns)
            assert row["pinned_tokens"] == row["context_tokens"] > 0
            assert 0 < row["pin_left_s"] <= 25.0 and row["last_decision"] == f"pinned 25.0 s for {tool}"
        # a's second turn found its first turn's context held by the pin
        assert rows[a]["cached_share"] > 0.5 and rows[b]["cached_share"] is None
        assert view["server"]["pinned_tokens"] >= rows[a]["pinned_tokens"] + rows[b]["pinned_tokens"]
    finally:
        end_programs(url, a, b)
    assert not {a, b} & {row["id"] for row in views(url)[0]["programs"]}  # ended: out of the view


def top_command(url: str) -> str:
    """continuum-top as installed, else the module it runs (an install older than the command)."""
    script = Path(sys.executable).parent / "continuum-top"
    launcher = str(script) if script.exists() else f"{sys.executable} -m sglang_continuum.top"
    return f"cd {ROOT} && PYTHONPATH={ROOT} {launcher} --url {url} --interval 0.5"


class Tmux:
    """A tmux server of this test's own (its own socket): nobody else's sessions are touched."""

    def __init__(self, tmp_path: Path) -> None:
        self.socket = f"continuum-top-{uuid.uuid4().hex[:8]}"
        self.tmp = tmp_path

    def tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=check)

    def start(self, name: str, command: str) -> Path:
        rc = self.tmp / f"{name}.rc"
        # the shell traps Ctrl-C (a handler, which the command does not inherit) to write its status
        self.tmux("new-session", "-d", "-s", name, "-x", "220", "-y", "40", f"trap : INT; {command}; echo $? > {rc}")
        return rc

    def screen(self, name: str) -> str:
        return self.tmux("capture-pane", "-p", "-t", name, check=False).stdout

    def wait_for(self, name: str, *needles: str, timeout_s: float = 30.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            shown = self.screen(name)
            if all(n in shown for n in needles):
                return shown
            time.sleep(0.25)
        pytest.fail(f"not on screen after {timeout_s} s: {needles}\n{self.screen(name)}")

    def exit_status(self, rc: Path, timeout_s: float = 10.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if rc.exists() and rc.read_text().strip():
                return rc.read_text().strip()
            time.sleep(0.1)
        pytest.fail("continuum-top did not exit")

    def close(self) -> None:
        self.tmux("kill-server", check=False)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_continuum_top_in_a_terminal_shows_the_programs_and_quits(continuum_server, tmp_path):
    url = continuum_server.url
    pids = [f"tmux-{i}-{uuid.uuid4().hex[:6]}" for i in range(2)]
    term = Tmux(tmp_path)
    try:
        for i, pid in enumerate(pids):
            program_turns(url, pid, "bash", turns=1, salt=60 + 20 * i)
        rc = term.start("top", top_command(url))
        shown = term.wait_for("top", "continuum-top", "LAST DECISION", *pids)
        rows = [line for line in shown.splitlines() if line.startswith(tuple(pids))]
        assert len(rows) == 2 and all(row.rstrip().endswith("pinned 25.0 s for bash") for row in rows), shown
        assert "dp0  pool" in shown and "(q quits)" in shown
        term.tmux("send-keys", "-t", "top", "q")
        assert term.exit_status(rc) == "0"
        assert term.tmux("has-session", "-t", "top", check=False).returncode != 0  # the command ended its window

        rc = term.start("interrupted", top_command(url))
        term.wait_for("interrupted", "LAST DECISION")
        term.tmux("send-keys", "-t", "interrupted", "C-c")
        assert term.exit_status(rc) == "0"  # Ctrl-C quits as q does, no traceback
    finally:
        term.close()
        end_programs(url, *pids)


def test_once_prints_the_programs_for_scripts(continuum_server):
    url = continuum_server.url
    pid = f"once-{uuid.uuid4().hex[:6]}"
    try:
        program_turns(url, pid, "bash", turns=1, salt=3)
        done = subprocess.run(
            [sys.executable, "-m", "sglang_continuum.top", "--url", url, "--once"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
    finally:
        end_programs(url, pid)
    assert done.returncode == 0, done.stderr
    [row] = [line for line in done.stdout.splitlines() if line.startswith(pid)]
    assert row.endswith("pinned 25.0 s for bash") and "\x1b" not in done.stdout
