"""Tier 3: a real ``python -m sglang.launch_server`` with the plugin, driven over HTTP."""

import time

import httpx
import pytest
from openai import OpenAI

from continuum_lab.harness.server import SGLangServer, parse_metrics
from sglang_continuum.client import continuum_extra_body
from sglang_continuum.client.params import RELEASE_PATH, release_body
from tests.e2e.conftest import ARGS, POOL, serving
from tests.support import variant_rules

pytestmark = pytest.mark.e2e
WORDS = "ls cd grep find python pytest git diff patch file line error test tool search fetch".split()


def text(n_words: int, salt: int) -> str:
    return " ".join(WORDS[(i * 7 + salt) % len(WORDS)] + str((i + salt) % 97) for i in range(n_words))


def two_turn_program(url: str) -> tuple:
    """Turn 1, a tool gap in which other requests fill the pool, turn 2 (final)."""
    client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": text(120, 1)}]
    r1 = client.chat.completions.create(
        model="m",
        messages=messages,
        max_tokens=16,
        extra_body=continuum_extra_body("prog-1", last_step=False, tool_name="bash", ignore_eos=True),
    )
    for i in range(5):  # memory pressure: ~5 x 500 tokens through a 2048-token pool
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": text(200, 100 + i)}],
            max_tokens=4,
            extra_body={"ignore_eos": True},
        )
    messages += [
        {"role": "assistant", "content": r1.choices[0].message.content},
        {"role": "user", "content": text(10, 7)},
    ]
    r2 = client.chat.completions.create(
        model="m",
        messages=messages,
        max_tokens=4,
        extra_body=continuum_extra_body("prog-1", last_step=True, ignore_eos=True),
    )
    return r1, r2


def test_second_turn_hits_under_continuum_and_misses_under_fcfs(quiet_server, tiny_model, tmp_path):
    before = parse_metrics(quiet_server.metrics())
    r1, r2 = two_turn_program(quiet_server.url)
    after = parse_metrics(quiet_server.metrics())
    assert r2.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens
    assert after["sglang:continuum_pin_hits_total"] - before.get("sglang:continuum_pin_hits_total", 0) == 1
    assert after["sglang:continuum_pins_created_total"] >= 1
    assert after["sglang:continuum_pinned_programs"] == 0  # last step released everything

    with serving(tiny_model, ["--schedule-policy", "fcfs", *ARGS], log_path=tmp_path / "fcfs.log") as fcfs:
        f1, f2 = two_turn_program(fcfs.url)
        assert "sglang:continuum_" not in fcfs.metrics()  # other policies: SGLang as it was
    assert f2.usage.prompt_tokens_details.cached_tokens < f1.usage.prompt_tokens


def test_metrics_expose_every_pin_series(continuum_server):
    from sglang_continuum.core.series import SERIES

    names = parse_metrics(continuum_server.metrics())
    for series in SERIES:  # every series of the one table (each child of a family too), from the start
        if not series.host_only:
            assert series.key + ("_count" if series.kind == "histogram" else "") in names, series.key
    assert names["sglang:continuum_pin_budget_tokens"] == POOL // 2


@pytest.mark.parametrize(
    "custom_params",
    [None, {"program_id": {"nested": 1}, "is_last_step": "perhaps"}, {"program_id": "", "tool_name": 12}],
    ids=["no-metadata", "garbage", "empty-id"],
)
def test_requests_without_or_with_bad_metadata_are_served(continuum_server, custom_params):
    sp = {"max_new_tokens": 6, "ignore_eos": True}
    if custom_params is not None:
        sp["custom_params"] = custom_params
    r = httpx.post(continuum_server.url + "/generate", json={"text": text(20, 3), "sampling_params": sp}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["completion_tokens"] == 6


def test_native_generate_with_session_id_as_program(quiet_server):
    before = parse_metrics(quiet_server.metrics())["sglang:continuum_pins_created_total"]
    body = {"text": text(30, 9), "session_id": "sess-42", "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}
    assert httpx.post(quiet_server.url + "/generate", json=body, timeout=60).status_code == 200
    after = parse_metrics(quiet_server.metrics())
    assert after["sglang:continuum_pins_created_total"] == before + 1
    body["sampling_params"]["custom_params"] = {"is_last_step": True}  # same program, last step
    assert httpx.post(quiet_server.url + "/generate", json=body, timeout=60).status_code == 200
    final = parse_metrics(quiet_server.metrics())
    assert final["sglang:continuum_pin_hits_total"] == after["sglang:continuum_pin_hits_total"] + 1
    assert final["sglang:continuum_pinned_programs"] == 0


def test_routing_key_header_alone_makes_a_program(quiet_server):
    """A plain OpenAI client behind smg sends only X-SMG-Routing-Key: SGLang puts it on the
    request, and it is the program id (turn 2 hits turn 1's pin)."""
    from sglang_continuum.client import routing_headers

    client = OpenAI(base_url=quiet_server.url + "/v1", api_key="none", max_retries=0, timeout=120)
    before = parse_metrics(quiet_server.metrics())
    messages = [{"role": "user", "content": text(60, 41)}]
    r1 = client.chat.completions.create(
        model="m",
        messages=messages,
        max_tokens=8,
        extra_body={"ignore_eos": True},
        extra_headers=routing_headers("rk-e2e"),
    )
    pinned = parse_metrics(quiet_server.metrics())
    assert pinned["sglang:continuum_pins_created_total"] == before["sglang:continuum_pins_created_total"] + 1
    messages += [
        {"role": "assistant", "content": r1.choices[0].message.content},
        {"role": "user", "content": text(8, 42)},
    ]
    r2 = client.chat.completions.create(
        model="m",
        messages=messages,
        max_tokens=4,
        extra_body={"ignore_eos": True},
        extra_headers=routing_headers("rk-e2e"),
    )
    assert r2.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens
    after = parse_metrics(quiet_server.metrics())
    key = 'sglang:continuum_requests_total{id_source="routing_key"}'
    assert after[key] - before.get(key, 0) == 2
    assert after["sglang:continuum_pin_hits_total"] == before["sglang:continuum_pin_hits_total"] + 1
    httpx.post(quiet_server.url + RELEASE_PATH, json=release_body("rk-e2e"), timeout=30)
    done = wait_for_metrics(quiet_server, lambda m: m["sglang:continuum_pinned_programs"] == 0)
    assert done["sglang:continuum_pinned_programs"] == 0


def test_frontend_program_carries_its_program_id(quiet_server):
    import sglang as sgl

    from sglang_continuum.client import ContinuumRuntimeEndpoint

    @sgl.function
    def agent(s, task):
        s += task
        s += sgl.gen("plan", max_tokens=4, ignore_eos=True)
        s += " tool result: ok "
        s += sgl.gen("answer", max_tokens=4, ignore_eos=True)

    before = parse_metrics(quiet_server.metrics())
    backend = ContinuumRuntimeEndpoint(quiet_server.url)
    state = agent.run(task=text(40, 11), backend=backend)
    assert len(state["answer"]) > 0
    after = parse_metrics(quiet_server.metrics())
    created = after["sglang:continuum_pins_created_total"] - before["sglang:continuum_pins_created_total"]
    hits = after["sglang:continuum_pin_hits_total"] - before["sglang:continuum_pin_hits_total"]
    assert created == 2 and hits == 1  # gen 1 pinned -> gen 2 hit it and pinned again
    assert after["sglang:continuum_pinned_programs"] == 1
    del state  # the run is over (SGLang ends it when the state goes): /close_session releases the pin
    final = wait_for_metrics(quiet_server, lambda m: m["sglang:continuum_pinned_programs"] == 0)
    assert final["sglang:continuum_pin_hits_total"] - before["sglang:continuum_pin_hits_total"] == 1
    released = 'sglang:continuum_programs_ended_total{reason="closed"}'
    assert final[released] - before[released] == 1


def wait_for_metrics(server, done, timeout_s: float = 20.0) -> dict:
    """/close_session is acknowledged before the scheduler handles it: poll for the effect."""
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = parse_metrics(server.metrics())
        if done(metrics) or time.monotonic() > deadline:
            return metrics
        time.sleep(0.2)


def generate(url: str, prompt: str, custom_params: dict, max_new_tokens: int = 4, **extra) -> dict:
    body = {
        "text": prompt,
        "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "custom_params": custom_params},
        **extra,
    }
    r = httpx.post(url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_close_session_ends_a_program_after_the_fact(continuum_server):
    """An agent that could not know its last turn releases the program when the run is over."""
    before = parse_metrics(continuum_server.metrics())
    out = generate(continuum_server.url, text(60, 21), {"program_id": "agent-close", "tool_name": "bash"})
    assert out["text"]
    pinned = parse_metrics(continuum_server.metrics())
    assert pinned["sglang:continuum_pins_created_total"] == before["sglang:continuum_pins_created_total"] + 1
    r = httpx.post(continuum_server.url + RELEASE_PATH, json=release_body("agent-close"), timeout=30)
    assert r.status_code == 200
    key = 'sglang:continuum_programs_ended_total{reason="closed"}'
    after = wait_for_metrics(continuum_server, lambda m: m[key] == before[key] + 1)
    assert after[key] == before[key] + 1
    releases = "sglang:continuum_pin_releases_total"
    assert after[releases] >= pinned[releases] + 1  # its pin went with it, before any TTL (25 s here)
    # closing an id the server never saw (or twice) is harmless
    for pid in ("agent-close", "never-seen"):
        assert httpx.post(continuum_server.url + RELEASE_PATH, json=release_body(pid), timeout=30).status_code == 200
    assert httpx.get(continuum_server.url + "/health", timeout=10).status_code == 200


def test_a_submit_tool_ends_the_program_without_a_pin(continuum_server):
    """The client names the submit tool (the server classes mini-swe-agent's sentinel the same
    way): the turn is the program's last, so no pin is made although no last-step flag came."""
    before = parse_metrics(continuum_server.metrics())
    generate(continuum_server.url, text(50, 31), {"program_id": "agent-submit", "tool_name": "submit"})
    after = wait_for_metrics(
        continuum_server,
        lambda m: (
            m['sglang:continuum_programs_ended_total{reason="terminal_tool"}']
            == before['sglang:continuum_programs_ended_total{reason="terminal_tool"}'] + 1
        ),
    )
    assert (
        after['sglang:continuum_programs_ended_total{reason="terminal_tool"}']
        == before['sglang:continuum_programs_ended_total{reason="terminal_tool"}'] + 1
    )
    assert after["sglang:continuum_pins_created_total"] == before["sglang:continuum_pins_created_total"]


@pytest.mark.parametrize("ids", [[999_999], [-1, 5]], ids=["too-large", "negative"])
def test_out_of_vocabulary_token_ids_get_a_400_and_the_server_lives(continuum_server, ids):
    r = httpx.post(
        continuum_server.url + "/generate",
        json={"input_ids": ids, "sampling_params": {"max_new_tokens": 2}},
        timeout=60,
    )
    assert r.status_code == 400 and "out-of-vocabulary" in r.text
    assert httpx.get(continuum_server.url + "/health", timeout=10).status_code == 200
    ok = httpx.post(
        continuum_server.url + "/generate",
        json={"text": text(5, 1), "sampling_params": {"max_new_tokens": 2}},
        timeout=60,
    )
    assert ok.status_code == 200


def test_the_engines_prefill_cost_is_fitted_to_the_servers_prefill_steps(continuum_server):
    """Without a measured profile a rebuild is priced with the engine's own prefill cost, fitted to
    its prefill steps (``ScheduleBatch.extend_lens``, ``.prefix_lens``) and published once 4,096
    tokens in 8 steps are seen."""
    import random

    rng = random.Random(11)
    for n in (300, 600, 900) * 3:  # 5,400 fresh tokens in 9 prompts, none cached
        ids = [rng.randrange(5, 500) for _ in range(n)]
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 2}}
        assert httpx.post(continuum_server.url + "/generate", json=body, timeout=120).status_code == 200
    names = ("prefill_step_seconds", "prefill_seconds_per_token", "prefill_seconds_per_pair")
    learned = lambda m: [m["sglang:continuum_" + name] for name in names]  # noqa: E731
    metrics = wait_for_metrics(continuum_server, lambda m: sum(learned(m)) > 0)
    c0, c1, c2 = learned(metrics)
    assert min(c0, c1, c2) >= 0
    # a tiny model on two cores: a 1,000-token prompt takes more than 0.1 ms and less than 10 s
    assert 1e-4 < c0 + c1 * 1000 + c2 * 1000**2 < 10, (c0, c1, c2)


def test_control_characters_in_a_program_id_forge_no_log_line(continuum_server):
    sp = {"max_new_tokens": 2, "custom_params": {"program_id": "x\nFAKE LOG LINE \x1b[31m"}}
    assert (
        httpx.post(
            continuum_server.url + "/generate", json={"text": text(5, 2), "sampling_params": sp}, timeout=60
        ).status_code
        == 200
    )
    log = continuum_server.log_path.read_text(errors="replace")
    assert not any(line.startswith("FAKE LOG LINE") for line in log.splitlines())
    assert "\x1b[31m" not in log


def test_flush_cache_with_live_pins_is_counted(continuum_server):
    for i in range(3):  # live pins: first turns of programs whose tools never return
        sp = {"max_new_tokens": 2, "ignore_eos": True, "custom_params": {"program_id": f"flush-{i}"}}
        assert (
            httpx.post(
                continuum_server.url + "/generate", json={"text": text(20, 30 + i), "sampling_params": sp}, timeout=60
            ).status_code
            == 200
        )
    m = parse_metrics(continuum_server.metrics())
    assert m["sglang:continuum_pinned_programs"] >= 3
    assert httpx.post(continuum_server.url + "/flush_cache", timeout=60).status_code == 200
    m = parse_metrics(continuum_server.metrics())
    ended = sum(
        m.get(f"sglang:continuum_{k}_total", 0.0)
        for k in ("pin_hits", "pin_expiries", "pin_sheds", "pin_releases", "pins_flushed")
    )
    assert m["sglang:continuum_pins_flushed_total"] >= 3 and m["sglang:continuum_pinned_programs"] == 0
    assert m["sglang:continuum_pins_created_total"] == ended  # every pin ever created is accounted for


def test_sigterm_to_the_launcher_alone_saves_the_statistics(tiny_model, tmp_path):
    """SGLang stops its schedulers gracefully on a launcher SIGTERM (no signal reaches them): the
    statistics are saved at their exit, not lost until the next periodic save."""
    import json
    import os
    import signal
    import time

    path = tmp_path / "stats.json"
    rules = variant_rules("timed", stats_save_interval_s=3600.0)  # no periodic save during the test
    env = {"SGLANG_CONTINUUM_STATS_PATH": str(path), "SGLANG_CONTINUUM_RULES": rules}
    srv = SGLangServer(tiny_model, ["--schedule-policy", "continuum", *ARGS], env=env, log_path=tmp_path / "s.log")
    with srv:
        for _ in range(3):  # two tool returns: two samples
            sp = {"max_new_tokens": 2, "custom_params": {"program_id": "term", "tool_name": "bash"}}
            assert (
                httpx.post(
                    srv.url + "/generate", json={"text": text(6, 4), "sampling_params": sp}, timeout=60
                ).status_code
                == 200
            )
            time.sleep(0.3)
        os.kill(srv.proc.pid, signal.SIGTERM)  # the launcher only
        srv.proc.wait(timeout=120)
    saved = json.loads(path.read_text())
    assert len(saved["tool_stats"]["tools"]["bash"]) == 2


def test_top_level_job_id_and_is_last_step_of_the_continuum_authors_client(quiet_server):
    """Their mini-swe-agent fork's vLLM client sends ``job_id`` and ``is_last_step`` as top-level
    fields of the chat/completions body, which SGLang's request models drop: the plugin reads them
    as program metadata. Turn 1 of run-3 is pinned for program run-3 (closing run-3 ends a program
    that exists); a top-level ``is_last_step`` on /v1/completions pins nothing; ``custom_params``
    wins over top-level fields."""
    url = quiet_server.url
    by_id, created = 'sglang:continuum_requests_total{id_source="program_id"}', "sglang:continuum_pins_created_total"
    released = 'sglang:continuum_programs_ended_total{reason="closed"}'
    before = parse_metrics(quiet_server.metrics())
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": text(60, 59)}],
        "job_id": "run-3",
        "is_last_step": False,
        "max_tokens": 8,
    }
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    pinned = parse_metrics(quiet_server.metrics())
    assert pinned[by_id] == before[by_id] + 1 and pinned[created] == before[created] + 1
    httpx.post(url + RELEASE_PATH, json=release_body("run-3"), timeout=30)
    # the counter moves when the release is handled, the gauge at the next step's publish: wait for both
    after = wait_for_metrics(
        quiet_server, lambda m: m[released] == before[released] + 1 and m["sglang:continuum_pinned_programs"] == 0
    )
    assert after[released] == before[released] + 1 and after["sglang:continuum_pinned_programs"] == 0
    body = {"model": "m", "prompt": text(40, 60), "job_id": "run-4", "is_last_step": True, "max_tokens": 4}
    assert httpx.post(url + "/v1/completions", json=body, timeout=120).status_code == 200
    last = parse_metrics(quiet_server.metrics())
    assert last[by_id] == after[by_id] + 1 and last[created] == after[created]  # a last step: no pin
    body = {**body, "is_last_step": False, "custom_params": {"program_id": "explicit-5", "is_last_step": True}}
    assert httpx.post(url + "/v1/completions", json=body, timeout=120).status_code == 200
    final = parse_metrics(quiet_server.metrics())
    assert final[by_id] == last[by_id] + 1 and final[created] == last[created]  # custom_params' last step
    body = {**body, "custom_params": None, "job_id": {"nested": {"id": 1}}}  # ignored, the request served
    assert httpx.post(url + "/v1/completions", json=body, timeout=120).status_code == 200
    assert parse_metrics(quiet_server.metrics())[by_id] == final[by_id]
