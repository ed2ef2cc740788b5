"""The lab's server helper (``continuum_lab.harness.server``): its HTTP port taken, its cores.

The launcher here is a stand-in for ``sglang.launch_server`` at the one thing under test, the
port: it binds ``--port`` as uvicorn does (SO_REUSEADDR), answers ``/health``, and exits with
uvicorn's "address already in use" when it cannot bind. A real launcher finds that out only ~20 s
into its start-up, which is what made this race worth handling (seen in CI).
"""

import os
import socket
import sys

import httpx
import pytest

from continuum_lab.harness import server as server_module
from continuum_lab.harness.server import SGLangServer, tree_cores

LAUNCHER = r"""
import http.server, os, socket, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
print("started on cores", sorted(os.sched_getaffinity(0)), flush=True)

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass

http.server.HTTPServer.allow_reuse_address = True
try:
    httpd = http.server.HTTPServer(("127.0.0.1", port), Health)
except OSError as e:
    print(f"ERROR: [Errno {e.errno}] error while attempting to bind on address: address already in use")
    sys.exit(1)
httpd.serve_forever()
"""


def launcher_server(**kw) -> SGLangServer:
    srv = SGLangServer("unused", **kw)
    srv.cmd = [sys.executable, "-c", LAUNCHER, "--port", str(srv.port)]
    return srv


@pytest.fixture
def squatter():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_port_lost_before_the_launcher_binds_it_is_swapped_for_a_free_one(squatter, monkeypatch):
    """free_port() found the port free, then someone took it before the launcher bound it: the
    launcher exits, and a port the helper chose is swapped for another; the server that answers
    is the one it started."""
    real_free_port = server_module.free_port
    ports = iter([squatter])
    monkeypatch.setattr(server_module, "free_port", lambda: next(ports, None) or real_free_port())
    monkeypatch.setattr(server_module, "port_is_free", lambda port: True)  # taken after the check
    with launcher_server(startup_timeout_s=30) as srv:
        assert srv.port != squatter and srv.proc.poll() is None
        assert httpx.get(srv.url + "/health", timeout=10).status_code == 200


def test_a_named_port_already_taken_is_refused_before_anything_is_launched(squatter):
    srv = launcher_server(port=squatter)
    with pytest.raises(server_module.PortTaken):  # a port the caller named is never swapped
        srv.start()
    assert srv.proc is None


def test_a_chosen_port_already_taken_is_swapped_before_launching(squatter, monkeypatch):
    real_free_port = server_module.free_port
    ports = iter([squatter])
    monkeypatch.setattr(server_module, "free_port", lambda: next(ports, None) or real_free_port())
    with launcher_server(startup_timeout_s=30) as srv:
        assert srv.port != squatter
        assert httpx.get(srv.url + "/health", timeout=10).status_code == 200


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a core to pin to and another to leave")
def test_a_pinned_server_starts_on_every_core_and_is_pinned_once_it_answers(tmp_path):
    """Start-up on every core (SGLang's three processes import side by side), then every thread on
    the server's cores before anyone measures it, with thread pools sized for those cores."""
    every = sorted(os.sched_getaffinity(0))
    log = tmp_path / "server.log"
    with launcher_server(cpus={every[0]}, log_path=log, startup_timeout_s=30) as srv:
        assert srv.env["OMP_NUM_THREADS"] == "1"
        assert tree_cores(srv.proc.pid) == [every[0]]
    assert f"started on cores {every}" in log.read_text()
