"""Tier 3: issue 14's reliability suite, reduced (``--quick`` sizes), against real CPU servers.

The full suite is ``bash scripts/reliability.sh`` (``continuum-reliability``); these tests run a few
of its probes and assert what the suite reports: nothing failed that should not, the server is
healthy afterwards, pins and pool are back to empty. The probes share one continuum server with
short lifetimes; ``oov_tokens`` runs after the others (it would take the server down if it could),
and the SIGKILL test last (it kills the shared server, then restarts it).
"""

import json

import pytest

from continuum_lab.cli import reliability as rel
from continuum_lab.cli.reliability.hostile import PATTERNS as HOSTILE_PATTERNS
from tests.support import fixed_ttl_rules

pytestmark = pytest.mark.e2e

E = rel.E
# pins live 10 s (long enough for the flush probe), vanished programs are forgotten after 15 s,
# statistics saved every second
SHARED_ENV = {
    E + "RULES": fixed_ttl_rules(
        10.0, program_idle_timeout_s=15.0, max_wait_hold_s=1.0, max_host_ttl_s=1.0, stats_save_interval_s=1.0
    ),
    E + "MAX_TTL_S": "10",
}


def quick_ctx(tiny_model, out, *extra) -> rel.Ctx:
    return rel.make_ctx(["--quick", "--model", tiny_model, "--out", str(out), *extra])


@pytest.fixture(scope="module")
def shared_ctx(tiny_model, tmp_path_factory):
    """One continuum server for the probes below, started on a stats file of the wrong shape
    (it must start anyway) saved every second; the last test SIGKILLs it."""
    out = tmp_path_factory.mktemp("reliability")
    ctx = quick_ctx(tiny_model, out)
    stats = out / "stats.json"
    stats.write_text('{"tool_stats": []}')
    env = {**SHARED_ENV, E + "STATS_PATH": str(stats)}
    server = ctx.shared = ctx.new_server("shared", env=env).start()
    try:
        yield ctx
    finally:
        server.stop()


def assert_clean(res: rel.ProbeResult) -> None:
    assert not res.server_died, res.problems
    assert res.failed == 0, res.problems
    assert res.healthy_after, res.problems
    assert res.pins_empty is not False, res.problems
    assert res.pool_empty is not False, res.problems
    assert res.ok, res.problems


def test_bad_metadata_is_served_or_refused_and_forges_no_log_line(shared_ctx):
    res = rel.run_probe(shared_ctx, "bad_metadata")
    assert_clean(res)
    assert set(res.details["statuses"]) <= {"200", "400", "422"}, res.details["statuses"]
    assert res.details["forged_log_lines_at_line_start"] == 0
    assert res.details["raw_esc_in_log"] == res.details["raw_nul_in_log"] == 0
    # logged once per program and problem at most: malformed metadata logs 10 lines a minute in all,
    # and the probe's cases before the repeat may have spent them
    assert res.details["repeat_warning_lines"] <= 1


def test_flush_cache_drops_live_pins_and_counts_them(shared_ctx):
    res = rel.run_probe(shared_ctx, "flush_cache")
    assert_clean(res)
    assert res.details["pinned_before_flush"]["pinned_programs"] > 0
    assert res.details["after_flush"]["pinned_programs"] == 0
    assert res.details["after_flush"]["used_tokens"] == 0
    balance = res.details["balance_after_flush"]
    assert balance["pins_flushed_total"] == res.details["pinned_before_flush"]["pinned_programs"]
    assert balance["adds_up"], balance


def test_abort_storm_leaves_no_pin_no_slot_no_program(shared_ctx):
    res = rel.run_probe(shared_ctx, "abort_storm")
    assert_clean(res)
    assert res.details["drain"]["tracked_empty"] is True
    assert sum(res.details["outcomes"].values()) == shared_ctx.sizes.storm_programs


def test_out_of_vocabulary_ids_get_a_4xx_and_the_server_lives(shared_ctx):
    res = rel.run_probe(shared_ctx, "oov_tokens")
    assert_clean(res)
    cases = res.details["per_policy"]["continuum"]["cases"]
    assert all(c["alive_after"] for c in cases.values())
    for name, case in cases.items():
        want = 200 if name.endswith("(valid edge)") else 400
        assert case["status"] == want, (name, case)


def test_sigkill_under_load_then_restart_loads_and_saves_at_sigterm(shared_ctx):
    """The shared server (started on a wrongly shaped stats file) is SIGKILLed under load: the file
    is valid; the restart loads it, serves, and saves its statistics at SIGTERM."""
    res = rel.run_probe(shared_ctx, "sigkill_restart")
    assert_clean(res)
    first, last = res.details["cycles"][0], res.details["cycles"][-1]
    assert first["file"]["schema_ok"] and first["file"]["samples"] > 0
    assert last["loaded_stats_logged"] and last["serves"]
    assert last["saved_at_sigterm"], last


def test_report_is_written(tiny_model, tmp_path):
    """The report (json + markdown table) from results, without a server."""
    ctx = quick_ctx(tiny_model, tmp_path)
    res = rel.ProbeResult("bad_metadata", sent=3, failed=1, healthy_after=True, pins_empty=True, pool_empty=False)
    res.problem("example")
    run = {"command": "continuum-reliability --quick", "started": "now", "git": "x", "probes": ["bad_metadata"]}
    rel.write_report(tmp_path, [res], [run], {"machine": "m", "sizes": {"pool": ctx.sizes.pool}})
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["probes"][0]["ok"] is False and data["probes"][0]["failed"] == 1
    md = (tmp_path / "report.md").read_text()
    assert "continuum-reliability --quick" in md and "| bad_metadata | **no** | 3 | 1 |" in md


def test_chaos_leaves_nothing_behind_and_a_new_program_is_served(tiny_model, tmp_path):
    """Overload with clients that give up, forced retractions, queue-limit rejections, streaming
    sessions and ids used again after ``/close_session`` (sometimes mid-turn) under
    SGLang's strict checks and the plugin's integrity checks: the gauges drain to 0, a fresh
    program is served in seconds, the server lives, and only the requests meant to fail failed."""
    ctx = quick_ctx(tiny_model, tmp_path, "--chaos-s", "12", "--chaos-clients", "12")
    res = rel.run_probe(ctx, "chaos")
    assert res.ok, res.problems
    [row] = res.details["seeds"]
    assert row["gauges_after"] == {"programs_in_flight": 0, "working_set_tokens": 0, "pinned_programs": 0}
    traffic = row["traffic"]  # a Counter's dict: an ending that did not happen has no key
    assert traffic["completed"] > 0 and traffic.get("gave_up", 0) + traffic.get("aborted", 0) > 0
    assert row["traffic"]["sessions_opened"] > 0 and row["traffic"]["sessions_closed"] > 0
    assert row["fresh_first_turn_s"] < 10 and not row["server_died"]


def test_hostile_patterns_beside_honest_agents_leave_the_server_healthy(tiny_model, tmp_path):
    """The load test that attacks, at its quickest: every hostile pattern runs beside honest agent
    programs on a real continuum server (its own: the fake stats peer and the tenant header that
    scopes program ids are start-up settings; the fcfs reference is the full run's). The server
    stays healthy, every honest request is served, the report has a row
    per pattern with the honest programs' throughput, cached share and losses against the
    baseline; with ids scoped, the attacker ends none of the honest programs."""
    ctx = quick_ctx(tiny_model, tmp_path)
    res = rel.run_probe(ctx, "hostile")
    assert not res.server_died and res.ok, res.problems
    assert res.healthy_after and res.failed == 0, res.problems
    rows = {r["pattern"]: r for r in res.details["rows"]}
    assert list(rows) == list(HOSTILE_PATTERNS)
    for name, row in rows.items():
        assert row["healthy"] and row["tracebacks"] == 0, (name, row)
        assert row["attack"]["sent"] > 0, (name, row["attack"])
        assert row["baseline"]["tok_s"], row["baseline"]
        assert {"tput_ratio", "cached_ratio", "losses", "lost_beyond_baseline", "tput_quotient"} <= set(row)
    assert res.details["servers_started"].get("fcfs", 0) == 0 and res.details["servers_started"]["continuum"] == 1
    assert all(row.get("fcfs") is None for row in rows.values())
    table = res.details["report_md"].splitlines()
    assert len(table) == 2 + len(HOSTILE_PATTERNS) and all(f"| {p} (" in res.details["report_md"] for p in rows)
    scoped, unscoped = rows["ending_others"], rows["ending_others_unscoped"]
    assert scoped["attack"]["honest_programs_targeted"] > 0 and scoped["scoped"] and not unscoped["scoped"]
    assert scoped["losses"]["restarted"] == 0 and scoped["losses"]["attack_turns_joined"] == 0, scoped["losses"]
    assert scoped["losses"]["pins_created"] > 0, scoped["losses"]  # fixed rules: the honest programs hold pins
    # the fake peer reached the server: its sound control samples were taken in
    assert rows["peer_stats"]["counters"]["stats_samples_received"] > 0, rows["peer_stats"]["attack"]
