"""continuum-top (sglang_continuum/top.py) without a real server: its frames over a live view a
controller made, and its answers to a stand-in HTTP server (a view, none, an older route, nobody)."""

import ast
import json
import pkgutil
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import tomllib

from sglang_continuum import top
from sglang_continuum.core.metadata import ProgramMeta
from sglang_continuum.core.snapshot import live_view
from tests.support import controller, free_port

ROOT = Path(__file__).resolve().parents[2]


def view(n_programs=2, dp_rank=0):
    c, clock = controller(fixed_ttl_s=25.0)
    for i in range(n_programs):
        meta = ProgramMeta(f"prog-{i}", tool_name="bash", announces_end=True)
        tag = c.turn_arrived(meta)
        c.turn_admitted(tag, 100 + i)
        c.turn_finished(meta, context_tokens=120 + i, handle="h", tag=tag)
    clock.advance(5.0)
    v = json.loads(json.dumps(live_view(c, pool_tokens=2048)))  # as it comes over HTTP
    v["server"]["dp_rank"] = dp_rank
    return v


def test_a_frame_shows_each_rank_then_a_row_per_program():
    lines = top.render([view()], url="http://h:1", interval=2.0, width=200, height=None)
    text = "\n".join(lines)
    assert lines[0].startswith("continuum-top  http://h:1") and "every 2 s" in lines[0]
    assert "dp0  pool 2048 tok  pinned 241/10000 tok (2 programs)" in text
    heads = next(i for i, line in enumerate(lines) if line.startswith("PROGRAM"))
    rows = lines[heads + 1 :]
    assert [r.split()[0] for r in rows] == ["prog-1", "prog-0"]  # the larger pin first
    assert rows[0].split()[:8] == ["prog-1", "tool", "5.0s", "1/1", "121", "121", "20.0s", "-"]
    assert rows[0].endswith("pinned 25.0 s for bash")


def test_a_frame_fits_the_terminal_and_says_what_it_left_out():
    lines = top.render([view(30)], url="u", interval=1.0, width=60, height=12)
    assert len(lines) == 12 and all(len(line) <= 60 for line in lines)
    assert lines[-1].startswith("... 23 more rows")  # 12 lines: 4 heads, 7 rows of 30, this one


def test_several_ranks_get_a_rank_column():
    lines = top.render([view(1, 0), view(1, 1)], url="u", interval=None, width=200, height=None)
    assert sum(line.startswith("dp") for line in lines) == 2
    rows = [line for line in lines if line.startswith(("0 ", "1 "))]
    assert [r.split()[:2] for r in rows] == [["0", "prog-0"], ["1", "prog-0"]]


def test_what_a_server_sends_never_drives_the_terminal():
    v = view(1)
    v["programs"][0]["id"] = "evil\x1b[2J\x07"
    text = "\n".join(top.render([v], url="u", interval=None, width=200, height=None))
    assert "\x1b" not in text and "\x07" not in text and "evil?[2J?" in text


class Stand(BaseHTTPRequestHandler):
    routes: dict = {}

    def do_GET(self):
        body = self.routes.get(self.path)
        self.send_response(404 if body is None else 200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(body or {"detail": "Not Found"}).encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def stand():
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Stand)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield Stand.routes, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    Stand.routes = {}


def test_once_prints_one_frame_from_server_info(stand, capsys):
    routes, url = stand
    routes["/server_info"] = {"internal_states": [{"max_total_num_tokens": 2048, "continuum": view()}]}
    assert top.main(["--url", url, "--once"]) == 0
    out = capsys.readouterr().out
    assert "prog-0" in out and "prog-1" in out and "pinned 25.0 s for bash" in out and "\x1b" not in out


def test_an_older_server_is_asked_under_the_older_route(stand):
    routes, url = stand
    routes["/get_server_info"] = {"internal_states": [{"continuum": view(1)}]}
    [only] = top.fetch(url)
    assert only["programs"][0]["id"] == "prog-0"


def test_a_server_without_the_continuum_policy_is_told_apart(stand, capsys):
    routes, url = stand
    routes["/server_info"] = {"internal_states": [{"max_total_num_tokens": 2048}]}
    assert top.main(["--url", url, "--once"]) == top.EXIT_NOT_CONTINUUM
    err = capsys.readouterr().err
    assert "does not run the continuum policy" in err and "--schedule-policy continuum" in err


def test_nobody_listening_is_said_plainly(capsys):
    assert top.main(["--url", f"http://127.0.0.1:{free_port()}", "--once"]) == top.EXIT_UNREACHABLE
    assert "cannot reach" in capsys.readouterr().err


def test_the_command_is_installed_and_needs_only_the_standard_library():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert pkgutil.resolve_name(scripts["continuum-top"]) is top.main
    tree = ast.parse(Path(top.__file__).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    outside = {name for name in imported if name.split(".")[0] not in sys.stdlib_module_names | {"__future__"}}
    assert not outside, f"continuum-top runs without the plugin's dependencies: {outside}"
