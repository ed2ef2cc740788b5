"""``continuum-bench --sessions``: the fixed-concurrency grid's runs in, ``report.{json,md}`` and
plots out (``bench/sessions.py`` is the protocol, ``bench/sessions_report.py`` the tables)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Iterable, Iterator, Optional

from continuum_lab.bench import sessions_report
from continuum_lab.bench.events import read_admission_log
from continuum_lab.bench.policies import parse_policy
from continuum_lab.bench.replay import Replayer, ReplayResult, client_patience
from continuum_lab.bench.report import emulated_loops
from continuum_lab.bench.sessions import SessionsProtocol, held_back_turns, pin_ends, session_programs, window_figures
from continuum_lab.cli.emulated_runs import emulator_figures
from continuum_lab.harness.server import SGLangServer, on_cores

LOADED = "sglang:load_back_tokens_total"  # SGLang's own count of tokens HiCache loaded back


def protocol_of(args, n: int) -> SessionsProtocol:
    return SessionsProtocol(n, args.window_s, args.warmup_s, args.max_gap_s, client_timeout_s=args.client_timeout_s,
                            client_retries=args.client_retries)  # fmt: skip


def _series(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith((name + "{", name + " ")))


def server_runs(grid, args, programs, server_args: list[str], env: dict, server_cpus, client_cpus) -> Iterator[dict]:
    """Each grid cell against a fresh real server (``--model``), in grid order: the same records
    as an emulated run's ``sessions`` part, measured."""
    for repeat, seed, n, policy in grid:
        protocol = protocol_of(args, int(n))
        flags, policy_env = parse_policy(policy, cpu=not args.gpu)
        log = args.out / f"server-{policy}-n{n:g}-s{seed}-r{repeat}.log"
        events = (args.out / f"events-{policy}-n{n:g}-s{seed}-r{repeat}.jsonl").resolve()
        events.unlink(missing_ok=True)
        replayer = Replayer("", api=args.api, vocab=args.vocab, seed=seed, identity=args.identity,
                            scrape_at=(protocol.warmup_s,), client_timeout_s=protocol.client_timeout_s,
                            client_retries=protocol.client_retries)  # fmt: skip
        replayer.tool_times = args.hints
        server_env = {**policy_env, **env, "SGLANG_CONTINUUM_EVENT_LOG": str(events)}
        with SGLangServer(args.model, [*flags, *server_args], env=server_env, log_path=log,
                          cpu=not args.gpu, cpus=server_cpus) as server:  # fmt: skip
            replayer.url = server.url
            with on_cores(client_cpus):
                source = session_programs(programs, seed, protocol.max_gap_s)
                result = asyncio.run(
                    replayer.run_sessions(source, protocol.concurrency, protocol.start_times(), protocol.end_s)
                )
            time.sleep(0.5)  # the event log is flushed when the engine idles, once the window's turns are gone
            server.stop(graceful=False)
        warm = result.metrics_at.get(f"{protocol.warmup_s:g}", "")
        counters = {"start": {"host_loaded_tokens": _series(warm, LOADED)},
                    "end": {"host_loaded_tokens": _series(result.metrics_after, LOADED)}}  # fmt: skip
        records = read_admission_log(events)  # flushed when the server went idle after its last step
        held, ended = held_back_turns(records), pin_ends(records)
        figures = window_figures(result, protocol, counters, held, ended)
        window = {"protocol": protocol.to_dict(), "counters": counters, "figures": figures, "held_back": held,
                  "pin_ends": ended}  # fmt: skip
        run = {"policy": policy, "seed": seed, "sessions": window, "replay": result.to_dict()}
        # the records stay beside the server's log, as an emulated run's do: figures defined later
        # can be computed from them
        (args.out / "runs").mkdir(exist_ok=True)
        (args.out / "runs" / f"{policy}-n{n:g}-s{seed}-r{repeat}.json").write_text(json.dumps(run))
        yield run


def _figures(run: dict) -> dict:
    """A run's window figures, computed again from its records when it kept them (``--reuse-runs``
    then reports with today's definitions)."""
    window = run["sessions"]
    if "replay" not in run:
        return window["figures"]
    protocol = SessionsProtocol(**window["protocol"])
    replay = ReplayResult.from_dict(run["replay"])
    return window_figures(replay, protocol, window["counters"], window.get("held_back"), window.get("pin_ends"))


def run_grid(runs: Iterable[dict], args, programs, pool: int, profile: Optional[str], command: str) -> int:
    started = time.time()
    records = []
    for run in runs:
        window = run["sessions"]
        n = window["protocol"]["concurrency"]
        record = {
            "policy": run["policy"],
            "sessions": n,
            "seed": run["seed"],
            "figures": _figures(run),
            "protocol": window["protocol"],
        }
        if "emulator" in run:
            record["emulator"] = emulator_figures(run)
        records.append(record)
        f = record["figures"]
        print(
            f"{run['policy']} N={n} seed {run['seed']}: {f['output_tokens_per_s']:.0f} tok/s, "
            f"TTFT p90 {f['ttft_p90_s'] or 0:.2f} s, cached {f['cache_hit'] or 0:.1%}, "
            f"{f.get('timeouts', 0)} timeouts, {f.get('failed_programs', 0)} programs failed"
        )
    rows = sessions_report.aggregate(records)
    protocol = records[0]["protocol"] if records else {}
    gaps = "raw gaps" if protocol.get("max_gap_s") is None else f"gaps capped at {protocol['max_gap_s']:g} s"
    patience = client_patience(protocol.get("client_timeout_s", 0.0), protocol.get("client_retries", 0))
    report = {
        "command": command,
        "backend": "emulator" if profile else "server",
        "profile": profile,
        "workload": str(args.workload),
        "programs": len(programs),
        "kv_pool_tokens": pool,
        "server_args": args.server_args,
        "protocol": protocol,
        "rows": rows,
        "runs": records,
        "elapsed_s": time.time() - started,
    }
    (args.out / "report.json").write_text(json.dumps(report, indent=1))
    pngs = sessions_report.plots(rows, args.out)
    backend = (
        f"**Emulated, predictions** (SGLang's scheduler on {emulated_loops(records)}; profile {profile!r}"
        if profile
        else f"**Measured** on real SGLang servers (`--model {args.model}`"
    )
    md = [
        f"# continuum-bench --sessions: {args.workload.name}",
        "",
        f"Command: `{command}`",
        "",
        f"{backend}, KV pool {pool} tokens, server args "
        f"`{args.server_args or '-'}`): N sessions of the trace in flight, each replaced by the next when it "
        f"ends; {gaps}; {patience}; {protocol.get('warmup_s', 0):g} s of warm-up, then a "
        f"{protocol.get('window_s', 0):g} s window. Medians over seeds; a turn still waiting at the window's end "
        "counts with the time it had waited. Timeouts (tries with no first token in time), retries and failed "
        "programs (a turn timed out on every try) are of the turns sent in the window, summed over seeds; only "
        "answered tries count towards throughput. 'vs best stock': output throughput against the stock policy "
        "with the highest median on the same cache tiers, same seed (worst seed in brackets).",
        "",
        sessions_report.markdown(rows),
        "",
        *(f"![{p.stem}]({p.name})" for p in pngs),
        "",
    ]
    split = sessions_report.pin_end_markdown(records)
    if split:
        md += [
            "Where the re-prefill came from (the plugin's records): for each way a returning turn's pin "
            "ended, the returns that found most of their context gone / all returns, and the Mtok re-prefilled "
            "(the window's). 'pinned': the pin held until its program came back.",
            "",
            split,
            "",
        ]
    (args.out / "report.md").write_text("\n".join(md))
    print(f"wrote {args.out / 'report.md'}")
    return 0
