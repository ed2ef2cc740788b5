"""Tier 3: program ids scoped to a tenant header (``program_scope_header``) on a real server. Two
tenants send the same program id; one tries to end the other's with ``is_last_step`` and with
``/close_session`` (by the id, by the other's scoped id, by a forged close envelope): the victim's
pin survives, and only its own tenant's ``/close_session`` releases it."""

import httpx
import pytest

from continuum_lab.harness.server import parse_metrics
from sglang_continuum.client.params import RELEASE_PATH, release_body
from sglang_continuum.core.metadata import RESERVED_PREFIX, SCOPE_KEY, scope_of, scoped_program_id
from tests.e2e.conftest import ARGS, serving
from tests.e2e.test_server import text, wait_for_metrics
from tests.support import fixed_ttl_env

pytestmark = pytest.mark.e2e
HEADER = "x-tenant"
PINNED = "sglang:continuum_pinned_programs"
RELEASED = 'sglang:continuum_programs_ended_total{reason="closed"}'


@pytest.fixture(scope="module")
def scoped_server(tiny_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "scoped.log"
    env = {**fixed_ttl_env(60), "SGLANG_CONTINUUM_PROGRAM_SCOPE_HEADER": HEADER}
    with serving(tiny_model, ["--schedule-policy", "continuum", *ARGS], env=env, log_path=log) as srv:
        yield srv


def generate(url, tenant, prompt, custom_params):
    body = {
        "text": prompt,
        "sampling_params": {"max_new_tokens": 4, "ignore_eos": True, "custom_params": custom_params},
    }
    r = httpx.post(url + "/generate", json=body, headers={HEADER: tenant} if tenant else {}, timeout=120)
    assert r.status_code == 200, r.text


def close(url, tenant, session_id):
    r = httpx.post(
        url + RELEASE_PATH, json=release_body(session_id), headers={HEADER: tenant} if tenant else {}, timeout=30
    )
    assert r.status_code == 200, r.text


def test_a_tenant_cannot_end_another_tenants_program(scoped_server):
    url = scoped_server.url
    base = parse_metrics(scoped_server.metrics())
    generate(url, "tenant-a", text(60, 31), {"program_id": "run-1", "tool_name": "bash"})
    pinned = wait_for_metrics(scoped_server, lambda m: m[PINNED] == base[PINNED] + 1)
    assert pinned[PINNED] == base[PINNED] + 1  # tenant A's run-1 holds a pin through its tool call

    # tenant B's run-1 is its own program: its last step ends that one, not A's
    generate(url, "tenant-b", text(60, 32), {"program_id": "run-1", "is_last_step": True})
    victim = scoped_program_id(scope_of("tenant-a"), "run-1")
    forged = f"{RESERVED_PREFIX}close-{scope_of('tenant-a')}:run-1"
    for tenant in ("tenant-b", None):
        for session_id in ("run-1", victim, forged):
            close(url, tenant, session_id)
    # a scope sent in custom_params is the HTTP process's to write: B's forged one is overwritten
    generate(
        url, "tenant-b", text(20, 33), {"program_id": "run-1", "is_last_step": True, SCOPE_KEY: scope_of("tenant-a")}
    )
    # the scheduler takes requests in order: every close above was handled before this one finished;
    # the gauge is published every 0.5 s: give it a few to show a release
    after = wait_for_metrics(scoped_server, lambda m: m[PINNED] < pinned[PINNED], timeout_s=3.0)
    assert after[PINNED] == pinned[PINNED]  # B's programs hold no pin: the one pinned is A's

    released = after[RELEASED]
    close(url, "tenant-a", "run-1")  # its own tenant ends it
    done = wait_for_metrics(scoped_server, lambda m: m[PINNED] == base[PINNED] and m[RELEASED] > released)
    assert done[PINNED] == base[PINNED] and done[RELEASED] == released + 1
