"""Per-step scheduler overhead of Continuum (a benchmark, not a test).

Measures, on this machine:
1. ``calc_priority`` on 1,000 waiting real SGLang ``Req`` objects with 10,000 live pins
   (ContinuumSchedulePolicy vs SGLang's stock FCFS policy on the same queue and the same real
   cache): in a step where nothing changed the order (the common case), after an arrival, after
   a pin change of a program with turns waiting, after both, and a full sort for reference --
   the added cost per step is ours minus stock (the change itself runs untimed before the step;
   the enqueue hook per arrival and a pin release are timed apart, as per-event costs); the
   incremental order is then checked against a fresh sort;
2. the controller's per-step work with 100 ... 100,000 live pins (nothing due, and 1% due);
3. one TTL decision of the cost model with 100, 10,000 and 100,000 samples, and what the engine's
   timings add (a decode step, a prefill step, the prefill fit solved again);
4. the out-of-vocabulary check on a request's token ids (1k ... 128k tokens).

With ``--stats-exchange``, instead: what shared tool statistics add to a scheduler step (real zmq
sockets on localhost, three live peers and a dead one).

    continuum-overhead --stats-exchange --out docs/results/overhead-stats-exchange-cpu.json

    continuum-overhead --model .models/tiny-llama --out docs/results/overhead-cpu.json

With ``--decode``, instead: what the whole plugin costs a decode-bound server, end to end. Live
fcfs and continuum servers in turn (interleaved, a fresh server each round), each serving rounds
of concurrent long decodes that carry program ids (so continuum pins between them); the wall time
per batch of requests is compared.

    continuum-overhead --decode --model .models/tiny-llama --out docs/results/decode-ab-cpu.json

With ``--inference``, instead: the per-arrival costs of programs inferred from the prefix (also
where many records share one prompt) and of the enqueue hook's prefix match, and a step's prefill
selection with ``--held`` first turns of new programs waiting that cannot start (held at the door;
under fcfs, refused for memory), on the real ``Scheduler``.

    continuum-overhead --inference --model .models/tiny-llama --out docs/results/overhead-inference-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from array import array
from pathlib import Path

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")


def timeit(fn, repeat: int, setup=None) -> dict:
    """Median and P90 of ``fn``; ``setup`` runs untimed before each call (the change under test)."""
    xs = []
    for _ in range(repeat):
        if setup is not None:
            setup()
        t0 = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t0)
    xs.sort()
    return {"median_us": statistics.median(xs) * 1e6, "p90_us": xs[int(0.9 * (len(xs) - 1))] * 1e6, "n": repeat}


def bench_calc_priority(model_path: str, waiting: int, pins: int) -> dict:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.schedule_policy import SchedulePolicy
    from sglang.srt.plugins import load_plugins
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs

    from continuum_lab.harness.cpu_cache import TurnDriver, make_cache
    from sglang_continuum.adapter.schedule_policy import ContinuumSchedulePolicy
    from sglang_continuum.core.metadata import ProgramMeta
    from sglang_continuum.core.settings import ContinuumSettings

    load_plugins()
    args = ServerArgs(model_path=model_path, device="cpu", schedule_policy="continuum", max_total_tokens=65536)
    args.resolve_once()
    publish(args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))

    rng = random.Random(0)
    rules = "continuum_lab.bench.variants:fixed_ttl(seconds=1e6)"  # capped at max_ttl_s
    cache = make_cache(131072, settings=ContinuumSettings(rules=rules, pin_budget_fraction=1.0))
    driver = TurnDriver(cache)
    programs = [f"p{i}" for i in range(waiting // 5)]
    contexts = {p: [rng.randrange(5, 500) for _ in range(40)] for p in programs}
    for p in programs[: len(programs) // 4]:  # a quarter of the queue's programs hold pins
        driver.run_turn(ProgramMeta(p), contexts[p])
    for i in range(pins - len(cache.controller.pins)):  # programs out on tools, holding pins
        driver.run_turn(ProgramMeta(f"idle{i}"), [10_000 + i, 7, 8, 9])

    def make_queue():
        q = []
        for turn in range(5):
            for p in programs:
                sp = SamplingParams(max_new_tokens=16, custom_params={"program_id": p})
                ids = array("q", contexts[p] + [rng.randrange(5, 500) for _ in range(8 * (turn + 1))])
                q.append(Req(f"{p}-{turn}", "", ids, sp))
        rng.shuffle(q)
        return q

    ours = ContinuumSchedulePolicy(cache, False, False, False)
    stock = SchedulePolicy("fcfs", cache, False, False, False)
    queue = make_queue()
    for req in queue:  # what the enqueue hook does for each arrival
        cache.request_queued(req)
        ours.requeued(req)
    ours.calc_priority(queue)  # the first step places everything (one sort)
    out = {"stock_fcfs": timeit(lambda: stock.calc_priority(queue), 50)}
    out["continuum_unchanged"] = timeit(lambda: ours.calc_priority(queue), 200)
    arrivals = iter(range(10**9))

    def arrive():
        p = rng.choice(programs)
        sp = SamplingParams(max_new_tokens=16, custom_params={"program_id": p})
        req = Req(f"{p}-new{next(arrivals)}", "", array("q", contexts[p] + [5, 6, 7]), sp)
        queue.append(req)  # what SGLang's _add_request_to_queue does, then our hook
        cache.request_queued(req)
        ours.requeued(req)

    # Each change runs untimed, then one step is timed: the step's ordering cost is what the policy
    # adds per step. The changes themselves are per event (the enqueue hook per arrival, the
    # release per pin) and are timed on their own below.
    step = lambda: ours.calc_priority(queue)  # noqa: E731
    out["continuum_after_arrival"] = timeit(step, 50, setup=arrive)
    # pins of programs that have turns waiting: each change moves that program's requests
    victims = iter([pin.program_id for pin in cache.controller.pins if pin.program_id in set(programs)])
    release = lambda: cache.end_program(next(victims))  # noqa: E731
    out["continuum_after_pin_change"] = timeit(step, 25, setup=release)

    def arrival_and_release():  # an arrival and a pin change in the same step
        arrive()
        release()

    out["continuum_arrival_and_pin_change"] = timeit(step, 20, setup=arrival_and_release)
    out["event_arrival_hook"] = timeit(arrive, 50)  # Req construction + request_queued + requeued
    idle = iter([pin.program_id for pin in cache.controller.pins if pin.program_id.startswith("idle")])
    # a release on its own (end_program: unlock, counters, statistics), of programs out on tools
    out["event_pin_release"] = timeit(lambda: cache.end_program(next(idle)), 25)

    def full_sort():
        ours.mark_stale()
        ours.calc_priority(queue)

    out["continuum_full_sort"] = timeit(full_sort, 20)
    ours.verify = True
    ours.calc_priority(queue)  # the incremental order equals a fresh sort (raises otherwise)
    stock_us = out["stock_fcfs"]["median_us"]
    return {
        "waiting_requests": len(queue),
        "pinned_programs": len(cache.controller.pins),
        "added_us_unchanged": out["continuum_unchanged"]["median_us"] - stock_us,
        "added_us_after_arrival": out["continuum_after_arrival"]["median_us"] - stock_us,
        "added_us_after_pin_change": out["continuum_after_pin_change"]["median_us"] - stock_us,
        "added_us_arrival_and_pin_change": out["continuum_arrival_and_pin_change"]["median_us"] - stock_us,
        "full_sorts": ours.sorts,
        **out,
    }


def bench_vocab_check(sizes=(1_000, 32_000, 128_000)) -> list[dict]:
    from types import SimpleNamespace

    from sglang_continuum.adapter.plugin import check_token_ids

    manager = SimpleNamespace(
        server_args=SimpleNamespace(schedule_policy="continuum"), model_config=SimpleNamespace(vocab_size=128_256)
    )
    rows = []
    for n in sizes:
        ids = [random.randrange(0, 128_256) for _ in range(n)]
        by_text = SimpleNamespace(input_ids=None)  # the tokenizer made the ids: nothing to check
        rows.append(
            {
                "tokens": n,
                "input_ids_request": timeit(lambda: check_token_ids(manager, SimpleNamespace(input_ids=ids), ids), 200),
                "text_request": timeit(lambda: check_token_ids(manager, by_text, ids), 200),
            }
        )
    return rows


def bench_expiry(sizes=(100, 1000, 10_000, 100_000)) -> list[dict]:
    from continuum_lab.bench.variants import fixed_ttl
    from sglang_continuum.core.clock import ManualClock
    from sglang_continuum.core.controller import ContinuumController
    from sglang_continuum.core.metadata import ProgramMeta
    from sglang_continuum.core.settings import ContinuumSettings

    rows = []
    for n in sizes:
        clock = ManualClock()
        c = ContinuumController(ContinuumSettings(), clock=clock, budget_tokens=10**12, rules=fixed_ttl(1000.0))
        for i in range(n):
            meta = ProgramMeta(f"p{i}")
            c.turn_arrived(meta)
            clock.advance(1000.0 / n)
            c.turn_finished(meta, context_tokens=100, handle=i)
        nothing_due = timeit(lambda: c.step(lambda pid: False), 2000)
        clock.now = 1000.0  # first pins are due now; then advance by 1% of pins per step
        step = 10.0  # 1% of the 1000 s spread

        def one_percent():
            clock.advance(step)
            c.step(lambda pid: False)

        due = timeit(one_percent, 50)
        rows.append({"pins": n, "nothing_due": nothing_due, "one_percent_due": due, "pins_per_step": n // 100})
    return rows


def bench_stats_exchange(peers: int = 3, samples_per_interval=(0, 10, 100)) -> dict:
    """Shared tool statistics (``core/stats_exchange.py``) on a scheduler step: real zmq sockets
    on localhost, ``peers`` publishers plus one dead endpoint. A step between exchange intervals
    (the common case) and a step that exchanges: publishes 10 local samples and merges what the
    peers sent since the last interval (``samples_per_interval`` each) into the tool windows."""
    from continuum_lab.harness.server import free_port
    from sglang_continuum.core.clock import ManualClock
    from sglang_continuum.core.controller import ContinuumController
    from sglang_continuum.core.settings import ContinuumSettings
    from sglang_continuum.core.stats_exchange import DURATION, StatsExchange

    endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(peers + 2)]  # the last: nobody binds it
    late_endpoint = f"tcp://127.0.0.1:{free_port()}"  # a worker that starts at the end
    others = [StatsExchange(e, [late_endpoint], interval_s=0.0) for e in endpoints[1 : peers + 1]]
    controller = ContinuumController(ContinuumSettings(), clock=ManualClock(), budget_tokens=1)
    for i in range(10_000):  # full windows: merging pays the sorted insert of a warm server
        controller.stats.record("bash", 0.1 + (i % 97) / 10)
    exchange = StatsExchange(endpoints[0], endpoints[1:], interval_s=0.1)
    controller.share_sample = exchange.record
    rng = random.Random(0)
    now = [0.0]

    def step():
        samples = exchange.poll(now[0])
        if samples:
            controller.merge_peer_samples(samples)

    try:
        time.sleep(0.5)  # zmq connects in the background
        out = {"peers": peers, "dead_peers": 1, "window_samples": 10_000}
        out["between_intervals"] = timeit(step, 5000)
        rows = []
        for k in samples_per_interval:

            def interval():
                for x in others:
                    for _ in range(k):
                        x.record(DURATION, "bash", rng.uniform(0.1, 10.0))
                    x.poll(time.monotonic())
                for _ in range(10):
                    exchange.record(DURATION, "bash", rng.uniform(0.1, 10.0))
                time.sleep(0.005)  # delivery
                now[0] += 0.1

            before = exchange.counters.received
            r = timeit(step, 100, setup=interval)
            rows.append({"samples_per_peer": k, "exchanging_step": r, "merged": exchange.counters.received - before})
        out["exchanging"] = rows
        # a worker that starts now: how long until it holds a peer's whole recent history
        history = min(min(o.counters.sent for o in others), 1024)  # a history holds the last 1024
        t0 = time.monotonic()
        late = StatsExchange(late_endpoint, endpoints[1 : peers + 1], interval_s=0.1)
        got = 0
        while got < history * peers and time.monotonic() - t0 < 10:
            for x in others:
                x.poll(time.monotonic())
            got += len(late.poll(time.monotonic()))
            time.sleep(0.002)
        out["late_join"] = {"samples": got, "expected": history * peers, "warm_s": time.monotonic() - t0}
        others.append(late)  # closed with the rest
        return out
    finally:
        for x in (exchange, *others):
            x.close()


def bench_ttl_decision(sizes=(100, 10_000, 100_000)) -> list[dict]:
    import numpy as np

    from sglang_continuum.core.cost_model import CostModelTTL, PrefillProfile
    from sglang_continuum.core.settings import ContinuumSettings
    from sglang_continuum.core.tool_stats import ToolStats
    from sglang_continuum.core.ttl import TTLQuery

    rows = []
    rng = np.random.default_rng(0)
    for n in sizes:
        s = ContinuumSettings()
        k = min(100, n - 1)
        stats = ToolStats(window=n, global_window=n)
        for x in rng.lognormal(0.0, 1.5, size=n):
            stats.record("bash", float(x))
        model = CostModelTTL(s, stats, PrefillProfile((0.05, 2e-4, 1e-9)), cold_start_k=k)
        q = TTLQuery("bash", 20_000)
        model.ttl(q)
        r = timeit(lambda: model.ttl(q), 2000)
        # the host-copy TTL an offload decides (HiCache): conditioned CDF, Llama-8B-sized KV (128 KiB/token) at 25 GB/s
        from sglang_continuum.core.offload import ReloadCost

        hosted = CostModelTTL(s, stats, PrefillProfile((0.05, 2e-4, 1e-9)), cold_start_k=k)
        hosted.use_host_tier(ReloadCost(131072, 2.5e10), hold_cost=0.25, max_host_ttl_s=300.0)
        host = timeit(lambda: hosted.host_ttl(q, 1.0), 2000)
        t0 = time.perf_counter()
        for x in rng.lognormal(0.0, 1.5, size=200):
            stats.record("bash", float(x))
        record_us = (time.perf_counter() - t0) / 200 * 1e6
        rows.append(
            {
                "samples": n,
                "decision": r,
                "host_ttl_decision": host,
                "record_sample_us": record_us,
                "ttl_s": model.last.ttl,
            }
        )
    return rows


def bench_engine_time() -> dict:
    """What the engine's timings (``core/engine_time.py``) add: a decode step, a prefill step, and
    the prefill fit solved again (once per ``REFIT_STEPS`` prefill steps, when a decision reads it)."""
    from sglang_continuum.core.engine_time import EngineTime

    engine, clock = EngineTime(), [0.0]

    def step(ran, prefilled=(0, 0)):
        clock[0] += 0.02
        engine.step(clock[0], ran, prefilled)

    for i in range(64):  # a fitted engine: varied prefill shapes
        e, p = 256 * (1 + i % 7), 4096 * (i % 5)
        step(False, (e, e * (e + 2 * p)))
    shape = (2048, 2048 * (2048 + 2 * 8192))
    return {
        "decode_step": timeit(lambda: step(True), 5000),
        "prefill_step": timeit(lambda: step(False, shape), 2000),
        "refit": timeit(engine.prefill._solve, 500, setup=lambda: step(False, shape)),
    }


DECODE_PROMPT = list(range(10, 210))  # the same 200-token prompt for every request and policy


def bench_decode(model_path: str, servers: int, batches: int, requests: int, new_tokens: int) -> dict:
    import concurrent.futures

    import httpx

    from continuum_lab.harness.server import SGLangServer

    def one_batch(url: str, tokens: int) -> float:
        def one(i: int) -> None:
            body = {
                "input_ids": DECODE_PROMPT,
                "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True, "temperature": 0},
                "custom_params": {"program_id": f"p{i}", "last_step": False},
            }
            httpx.post(url + "/generate", json=body, timeout=600).raise_for_status()

        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(requests) as pool:
            list(pool.map(one, range(requests)))
        return time.perf_counter() - t0

    order = [("fcfs", "continuum"), ("continuum", "fcfs")]
    walls: dict[str, list[float]] = {"fcfs": [], "continuum": []}
    for r in range(servers):
        for policy in order[r % 2]:  # interleaved, alternating who goes first
            with SGLangServer(model_path, ["--schedule-policy", policy, "--enable-metrics"]) as srv:
                one_batch(srv.url, 50)  # warm-up
                walls[policy] += [one_batch(srv.url, new_tokens) for _ in range(batches)]
    summary = {
        p: {"mean_s": statistics.mean(xs), "median_s": statistics.median(xs), "min_s": min(xs), "max_s": max(xs)}
        for p, xs in walls.items()
    }
    return {
        "requests_per_batch": requests,
        "new_tokens": new_tokens,
        "prompt_tokens": len(DECODE_PROMPT),
        "walls_s": walls,
        "summary": summary,
        "continuum_over_fcfs_median": summary["continuum"]["median_s"] / summary["fcfs"]["median_s"],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model", default=".models/tiny-llama", help="the embedded tiny model (scripts/setup.sh builds it)"
    )
    ap.add_argument("--waiting", type=int, default=1000)
    ap.add_argument("--pins", type=int, default=10_000)
    ap.add_argument("--out", type=Path, default=Path("docs/results/overhead-cpu.json"))
    ap.add_argument("--decode", action="store_true", help="only the end-to-end decode A/B on live servers")
    ap.add_argument("--servers", type=int, default=6, help="--decode: server pairs (fcfs + continuum)")
    ap.add_argument("--stats-exchange", action="store_true", help="only shared tool statistics' cost per step")
    ap.add_argument(
        "--inference",
        action="store_true",
        help="only the per-arrival costs (program inference, the prefix match) and a step with first turns held",
    )
    ap.add_argument("--held", type=int, default=1000, metavar="N", help="--inference: first turns held at the door")
    args = ap.parse_args(argv)
    machine = {"cpu_count": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}
    if args.stats_exchange:
        report = {"machine": machine, "stats_exchange": bench_stats_exchange()}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
        x = report["stats_exchange"]
        print(
            f"shared tool statistics, {x['peers']} live peers + {x['dead_peers']} dead: a step between intervals "
            f"{x['between_intervals']['median_us']:.2f} us median ({x['between_intervals']['p90_us']:.2f} p90)"
        )
        for r in x["exchanging"]:
            print(
                f"  exchanging step, {r['samples_per_peer']:>3} samples per peer: "
                f"{r['exchanging_step']['median_us']:8.1f} us median, {r['exchanging_step']['p90_us']:8.1f} us p90 "
                f"({r['merged']} merged in {r['exchanging_step']['n']} steps)"
            )
        lj = x["late_join"]
        print(f"  a worker starting late held {lj['samples']}/{lj['expected']} peer samples after {lj['warm_s']:.2f} s")
        print(f"report: {args.out}")
        return 0
    if args.inference:
        from continuum_lab.cli.overhead_arrivals import arrivals_report, print_arrivals

        report = {"machine": machine, **arrivals_report(args.model, args.held)}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
        print_arrivals(report)
        print(f"report: {args.out}")
        return 0
    if args.decode:
        report = {"machine": machine, "decode": bench_decode(args.model, args.servers, 4, 4, 400)}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
        d = report["decode"]
        for policy, row in d["summary"].items():
            print(
                f"{policy:>9}: {d['requests_per_batch']} x {d['new_tokens']} tokens per batch, "
                f"median {row['median_s']:.2f} s, mean {row['mean_s']:.2f} s, range {row['min_s']:.2f}-{row['max_s']:.2f} s"
            )
        print(f"continuum / fcfs (median): {d['continuum_over_fcfs_median']:.3f}; report: {args.out}")
        return 0
    report = {
        "machine": machine,
        "ttl_decision": bench_ttl_decision(),
        "engine_time": bench_engine_time(),
        "expiry": bench_expiry(),
        "vocab_check": bench_vocab_check(),
        "calc_priority": bench_calc_priority(args.model, args.waiting, args.pins),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print("TTL decision (cost model):")
    for r in report["ttl_decision"]:
        print(
            f"  {r['samples']:>7} samples: {r['decision']['median_us']:8.1f} us median, "
            f"{r['decision']['p90_us']:8.1f} us p90; host TTL {r['host_ttl_decision']['median_us']:8.1f} us; "
            f"record a sample {r['record_sample_us']:.1f} us"
        )
    et = report["engine_time"]
    print(
        f"Engine timings: a decode step {et['decode_step']['median_us']:.1f} us, a prefill step "
        f"{et['prefill_step']['median_us']:.1f} us, the prefill fit solved again {et['refit']['median_us']:.1f} us"
    )
    print("Out-of-vocabulary check per request:")
    for r in report["vocab_check"]:
        print(
            f"  {r['tokens']:>7} tokens: {r['input_ids_request']['median_us']:8.1f} us for an input_ids request, "
            f"{r['text_request']['median_us']:6.2f} us for a text request"
        )
    print("Controller step (expiry) per scheduler step:")
    for r in report["expiry"]:
        print(
            f"  {r['pins']:>7} pins: {r['nothing_due']['median_us']:7.2f} us (none due), "
            f"{r['one_percent_due']['median_us']:9.1f} us ({r['pins_per_step']} due)"
        )
    cp = report["calc_priority"]
    print(
        f"calc_priority, {cp['waiting_requests']} waiting, {cp['pinned_programs']} pins: stock fcfs "
        f"{cp['stock_fcfs']['median_us'] / 1000:.3f} ms; continuum adds "
        f"{cp['added_us_unchanged'] / 1000:.3f} ms when nothing changed, "
        f"{cp['added_us_after_arrival'] / 1000:.3f} ms after an arrival, "
        f"{cp['added_us_after_pin_change'] / 1000:.3f} ms after a pin change, "
        f"{cp['added_us_arrival_and_pin_change'] / 1000:.3f} ms after both "
        f"(a full sort: {cp['continuum_full_sort']['median_us'] / 1000:.3f} ms); per event, not per step: "
        f"an arrival's enqueue hook {cp['event_arrival_hook']['median_us'] / 1000:.3f} ms (with SGLang's Req), "
        f"a pin release {cp['event_pin_release']['median_us'] / 1000:.3f} ms"
    )
    print(f"report: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
