"""Probe ``hostile``: each hostile traffic pattern beside ordinary agent traffic, on a continuum
server and on a stock fcfs server as the reference.

A continuum server (``--enable-metrics``, the event log on, a fake stats peer configured, program
ids scoped by a tenant header: ``program_scope_header``) serves a few honest agent programs
(explicit ids, contexts that grow, short tool gaps, output streamed; ``hostile_traffic.py``) for
the whole run. Each pattern (``hostile_attacks.py``) runs as a phase of its own: the honest
traffic alone (the baseline: before every pattern, or once at the start with ``--hostile-baselines
once``), then the honest traffic with the attack beside it. The honest agents send one tenant in
the header, the attacker another; ``ending_others_unscoped`` sends no header from either (the
default, where ids are shared: requests without the header share one namespace).

Then the same phases, pattern by pattern, against one stock ``--schedule-policy fcfs`` server
(the same flags otherwise; ``--hostile-fcfs`` selects the patterns): the runs are interleaved by
policy (all of continuum's, then all of fcfs's; one server up at a time). On a few shared cores an
attack's own requests are real load for any policy, so the figure that says what the plugin itself
loses or gains is continuum's attack/baseline ratio over fcfs's (``hostile_report.py``).

Per pattern the report gives the honest programs' throughput (output tokens/s of their turns)
and cached share of their later turns (``meta_info.cached_tokens``) as a ratio to the baseline,
for each policy, and the quotient; their inter-token latency and time to first token; what they
lost on the continuum server (later turns it saw as a new program's first turn, i.e. ended by
someone else; pins they were given and what became of them, from the event log's ``pin_end``;
attacker turns logged in an honest program); and whether each server stayed healthy (every honest
request served, ``/health``, no traceback in the log).

Rules: ``--hostile-rules fixed`` (the default here) pins every non-final turn for ``--hostile-ttl``
s, so that the honest programs hold pins an attack could take; ``default`` runs the product's
rules (its ``max_ttl_s`` ``--hostile-ttl``), whose TTL model pins little on this CPU server over a
run this short. Before each phase the probe waits (at most ``--hostile-settle-s``) until nothing is
queued, held or pinned. A server that dies is replaced by a fresh one for the next pattern (the
death is the finding). Problems (what fails the probe) are the continuum server's health.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Optional

import httpx

from continuum_lab.cli.reliability.common import Ctx, E, ProbeResult, alive, finish, log_text, quick_health
from continuum_lab.cli.reliability.hostile_attacks import ATTACKS, FINDING, PATTERNS, Attack
from continuum_lab.cli.reliability.hostile_report import TARGET, judge, losses, report_table
from continuum_lab.cli.reliability.hostile_traffic import Honest, phase
from continuum_lab.harness.server import SGLangServer, free_port

__all__ = ["FINDING", "PATTERNS", "TARGET", "probe_hostile"]

SCOPE_HEADER = "x-tenant"  # the continuum server's program_scope_header
HONEST_TENANT = {SCOPE_HEADER: "tenant-honest"}
ATTACKER_TENANT = {SCOPE_HEADER: "tenant-attacker"}
UNSCOPED = ("ending_others_unscoped",)  # no header from either client: the default's one namespace
FCFS_SKIP = {"ending_others_unscoped": "same traffic as ending_others for fcfs"}


def _env(ctx: Ctx, events: Path, peer: str) -> dict[str, str]:
    """The event log (what became of each honest turn), the fake peer, ``max_ttl_s``, the tenant
    header that scopes program ids, and with ``fixed`` rules every non-final turn pinned that long."""
    ttl = float(ctx.sizes.hostile_ttl)
    env = {
        E + "EVENT_LOG": str(events),
        E + "STATS_PEER_ENDPOINTS": peer,
        E + "MAX_TTL_S": repr(ttl),
        E + "PROGRAM_SCOPE_HEADER": SCOPE_HEADER,
    }
    if ctx.sizes.hostile_rules == "fixed":
        env[E + "RULES"] = f"continuum_lab.bench.variants:fixed_ttl(seconds={ttl!r})"
    return env


def _tracebacks(text: str) -> int:
    return text.count("Traceback (most recent call last)")


class _Policy:
    """One policy's servers over the run: one, replaced only when it dies."""

    def __init__(self, ctx: Ctx, policy: str, peer: str) -> None:
        self.ctx, self.policy, self.peer = ctx, policy, peer
        self.servers: list[tuple[SGLangServer, Optional[Path]]] = []

    def start(self) -> SGLangServer:
        name = f"hostile-{self.policy}-{len(self.servers)}"
        if self.policy == "fcfs":
            srv = self.ctx.new_server(name, "fcfs").start()
            self.servers.append((srv, None))
            return srv
        events = self.ctx.logs / f"{name}-events.jsonl"
        events.unlink(missing_ok=True)
        srv = self.ctx.new_server(name, env=_env(self.ctx, events, self.peer)).start()
        self.servers.append((srv, events))
        return srv

    def run(self, patterns: list[str], res: Optional[ProbeResult]) -> dict[str, tuple[dict, dict]]:
        """Each pattern's (attack phase, its baseline); ``res``: the continuum run's result, for
        the drain at its end."""
        s, tag = self.ctx.sizes, self.policy[0]
        out: dict[str, tuple[dict, dict]] = {}
        srv = self.start()
        try:
            baseline: Optional[dict] = None
            for i, pattern in enumerate(patterns):
                headers = (None, None) if pattern in UNSCOPED else (HONEST_TENANT, ATTACKER_TENANT)
                if not alive(srv):
                    srv.stop()
                    srv = self.start()
                    baseline = None
                if baseline is None or s.hostile_baselines == "each" or baseline["headers"] != headers:
                    print(f"[hostile] {self.policy}: baseline before {pattern} ...", flush=True)
                    baseline = asyncio.run(phase(self.ctx, srv, f"{tag}b{i}", None, honest_headers=headers[0]))
                    baseline.update(server=len(self.servers) - 1, headers=headers)
                ph = self._attack(srv, f"{tag}a{i}", pattern, headers)
                out[pattern] = (ph, baseline)
                h, b = ph["honest"], baseline["honest"]
                print(
                    f"[hostile] {self.policy} {pattern}: sent {ph['attack'].get('sent')} in "
                    f"{ph['attack'].get('attack_s')}s; honest {h['tok_s']} tok/s (base {b['tok_s']}), cached "
                    f"{h['cached_share']} (base {b['cached_share']}), alive {ph['alive']}",
                    flush=True,
                )
            if res is not None:
                finish(res, srv, drain_s=20 + s.hostile_ttl)
        finally:
            for server, _ in self.servers:
                server.stop()
        return out

    def _attack(self, srv: SGLangServer, tag: str, pattern: str, headers: tuple) -> dict:
        print(f"[hostile] {self.policy}: {pattern} ...", flush=True)
        log0 = len(log_text(srv))

        def run_attack(honest: Honest, client: httpx.AsyncClient):
            return ATTACKS[pattern](Attack(self.ctx, srv, client, honest, self.peer))

        ph = asyncio.run(phase(self.ctx, srv, tag, run_attack, honest_headers=headers[0], attack_headers=headers[1]))
        time.sleep(0.5)
        ph.update(server=len(self.servers) - 1, alive=alive(srv), health=quick_health(srv))
        ph["tracebacks"] = _tracebacks(log_text(srv)[log0:])
        return ph

    def events(self) -> dict[int, dict[str, dict]]:
        from continuum_lab.bench.events import read_admission_log

        return {
            k: {r["rid"]: r for r in read_admission_log(path) if isinstance(r.get("rid"), str)}
            for k, (_, path) in enumerate(self.servers)
            if path is not None
        }


def _fcfs_patterns(spec: str, patterns: list[str]) -> list[str]:
    if spec == "none":
        return []
    chosen = patterns if spec == "all" else [p.strip() for p in spec.split(",") if p.strip()]
    return [p for p in patterns if p in chosen and p not in FCFS_SKIP]


def probe_hostile(ctx: Ctx) -> ProbeResult:
    res = ProbeResult("hostile")
    s = ctx.sizes
    patterns = [p.strip() for p in s.hostile_patterns.split(",") if p.strip()]
    unknown = [p for p in patterns if p not in PATTERNS]
    if unknown:
        res.problem(f"unknown pattern(s) {unknown}; choose from {list(PATTERNS)}")
        return res
    peer = f"tcp://127.0.0.1:{free_port()}"
    cont, fcfs = _Policy(ctx, "continuum", peer), _Policy(ctx, "fcfs", peer)
    got = cont.run(patterns, res)
    fcfs_patterns = _fcfs_patterns(s.hostile_fcfs, patterns)
    ref = fcfs.run(fcfs_patterns, None) if fcfs_patterns else {}
    events = cont.events()
    rows = []
    for pattern in patterns:
        ph, base = got[pattern]
        row = {"pattern": pattern, "phase": ph, "baseline": base, "scoped": pattern not in UNSCOPED}
        row["losses"] = losses(
            events[ph["server"]], ph["honest"].pop("rids_later"), ph["attack"].pop("attack_turns", [])
        )
        row["baseline_losses"] = losses(events[base["server"]], base["honest"].get("rids_later", []), [])
        if pattern in ref:
            row["fcfs"], row["fcfs_baseline"] = ref[pattern]
        else:
            row["fcfs_skipped"] = FCFS_SKIP.get(pattern, "not run (--hostile-fcfs)")
        rows.append(row)
    phases = [p for pair in [*got.values(), *ref.values()] for p in pair]
    for ph in phases:
        ph["honest"].pop("rids_later", None)
        ph["attack"].pop("attack_turns", None)
    judge(res, rows)
    res.details["phases"] = [
        {k: v for k, v in ph.items() if k != "headers"} for ph in {id(p): p for p in phases}.values()
    ]
    res.details["servers_started"] = {"continuum": len(cont.servers), "fcfs": len(fcfs.servers)}
    res.details["interleaving"] = "by policy: every continuum phase, then every fcfs phase"
    res.details["peer_endpoint"] = peer
    res.details["report_md"] = report_table(res.details["rows"])
    return res
