"""What ``continuum-overhead`` measures per arrival and per held turn (``--inference``, ``--held``):
programs inferred from the prefix, the enqueue hook's prefix match, and a step's prefill selection
with many first turns held at the door."""

from __future__ import annotations

import itertools
import random
from array import array

from continuum_lab.cli.overhead import timeit


def bench_inference(records: int = 30_000, prompts: tuple[int, ...] = (32_768, 131_072)) -> list[dict]:
    """Program inference per arrival (``infer_programs``), the plugin's only per-arrival cost that
    grows with state: ``records`` finished turns recorded (provisional or inferred programs) at
    context lengths spread up to each prompt length, then a prompt of that length (SGLang's
    ``array('q')``) that extends one of them, or none; and a finished turn's record."""
    from array import array

    import numpy as np

    from sglang_continuum.core.program_inference import ProgramIndex

    rows = []
    for prompt_tokens in prompts:
        rng = np.random.default_rng(0)
        index = ProgramIndex()

        def ids(n: int) -> array:
            out = array("q")
            out.frombytes(rng.integers(5, 128_000, n, dtype=np.int64).tobytes())
            return out

        pool = ids(prompt_tokens)  # the records: prefixes of one draw (cheap to make), none of the prompts'
        lengths = np.linspace(1_000, prompt_tokens - 2_000, records).astype(int)
        for i, n in enumerate(lengths[:-1]):
            index.record(f"p{i}", pool, int(n) - 200, int(n))
        target = ids(int(lengths[-1]))
        prompt = target + ids(prompt_tokens - len(target))
        stranger = ids(prompt_tokens)

        def record() -> None:
            index.record("target", target, len(target) - 200, len(target))

        record()
        matched = timeit(lambda: index.match(prompt), 50, setup=record)
        assert index.match(prompt) is None  # consumed by the last timed match
        record()
        unmatched = timeit(lambda: index.match(stranger), 50)
        recorded = timeit(record, 50)
        rows.append(
            {
                "records": len(index),
                "prompt_tokens": prompt_tokens,
                "arrival_matched": matched,
                "arrival_unmatched": unmatched,
                "record_finished_turn": recorded,
            }
        )
    return rows


def bench_shared_prompt(records: tuple[int, ...] = (1_000, 20_000, 100_000)) -> list[dict]:
    """Program inference when many records share one block: one 128-token prompt sent by many
    single requests (a load test, an n-sample eval), each recorded with its own 40-token output,
    then an arrival that extends the prompt (it reaches every one of those records' keys) and an
    arrival that continues one of them. The index weighs at most ``PROGRAMS_PER_KEY`` programs per
    key whatever the number of records; it used to weigh every record filed at the block."""
    from array import array

    import numpy as np

    from sglang_continuum.core.program_inference import ProgramIndex

    rows = []
    for n in records:
        rng = np.random.default_rng(0)
        index = ProgramIndex()
        prompt = array("q", rng.integers(5, 30_000, 128).tolist())
        outputs = [array("q", rng.integers(5, 30_000, 40).tolist()) for _ in range(n)]
        for i, out in enumerate(outputs):
            ctx = prompt + out
            index.record(f"p{i}", ctx, len(prompt), len(ctx))
        extends = prompt + array("q", rng.integers(5, 30_000, 10).tolist())
        newest = prompt + outputs[-1] + array("q", rng.integers(5, 30_000, 10).tolist())

        def record_newest() -> None:
            ctx = prompt + outputs[-1]
            index.record(f"p{n - 1}", ctx, len(prompt), len(ctx))

        rows.append(
            {
                "records": n,
                "arrival_extending_the_shared_prompt": timeit(lambda: index.match(extends), 200),
                "arrival_continuing_one": timeit(lambda: index.match(newest), 200, setup=record_newest),
                "crowded_out_keys": index.crowded,
            }
        )
    return rows


def bench_arrival_match(model_path: str, prompts: tuple[int, ...] = (32_768, 131_072)) -> list[dict]:
    """The enqueue hook of a return whose program holds no pin (``ContinuumRadixCache.request_queued``,
    with SGLang's ``Req``) at long prompts: it runs SGLang's prefix match once, which tells the
    queue order whether the return's context is still there. A return whose whole context is resident, and one
    whose context is gone (a prompt the cache has never seen)."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.plugins import load_plugins
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs

    from continuum_lab.harness.cpu_cache import TurnDriver, make_cache
    from sglang_continuum.core.metadata import ProgramMeta
    from sglang_continuum.core.settings import ContinuumSettings

    load_plugins()
    args = ServerArgs(model_path=model_path, device="cpu", schedule_policy="continuum", max_total_tokens=65536)
    args.resolve_once()
    publish(args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
    rng = random.Random(0)
    cache = make_cache(sum(prompts) + 4096, settings=ContinuumSettings(pin_budget_fraction=0.0))  # nothing pinned
    driver = TurnDriver(cache)
    rows, made = [], itertools.count()
    for n in prompts:
        pid = f"long{n}"
        context = [rng.randrange(5, 500) for _ in range(n)]
        driver.run_turn(ProgramMeta(pid), context)
        stranger = [rng.randrange(500, 1000) for _ in range(n)]
        pending: list = []

        def arrival(tokens: list[int]) -> None:
            sp = SamplingParams(max_new_tokens=16, custom_params={"program_id": pid})
            pending.append(Req(f"{pid}-{next(made)}", "", array("q", tokens), sp))

        resident = timeit(lambda: cache.request_queued(pending[-1]), 20, setup=lambda: arrival(context + [5, 6, 7]))
        gone = timeit(lambda: cache.request_queued(pending[-1]), 20, setup=lambda: arrival(stranger))
        assert cache.lifecycle.get(pending[-1].rid).tag.context_gone, "the bench's return must find its context gone"
        rows.append({"prompt_tokens": n, "arrival_resident": resident, "arrival_gone": gone})
    return rows


def bench_held_turns(model_path: str, held: int = 1000, repeat: int = 50) -> dict:
    """A step's prefill selection (``Scheduler.get_new_batch_prefill``: the queue order, then SGLang's
    walk of the waiting queue) with ``held`` first turns of new programs waiting that cannot
    start: a running program's decode fills the 2,048-token pool, each first turn wants 1,400
    tokens. Under ``fcfs`` the first of them does not fit (``NO_TOKEN``) and the batch counts as full
    until a running request leaves; under ``continuum`` the door holds them, and the walk ends at
    the first one held. The real ``Scheduler`` with the tiny model, one per policy."""
    from continuum_lab.harness.inprocess import SchedulerDriver, build_scheduler, release_parallel_runtime

    out = {"held": held}
    for policy in ("fcfs", "continuum"):
        rng = random.Random(0)
        scheduler = build_scheduler(
            model_path, schedule_policy=policy, max_total_tokens=2048, max_running_requests=held + 64
        )
        driver = SchedulerDriver(scheduler)
        runner = {"program_id": "runner", "tool_name": "bash"}
        driver.submit([rng.randrange(5, 500) for _ in range(1500)], max_new_tokens=100_000, custom_params=runner)
        while not scheduler.running_batch.reqs:
            driver.step()  # prefilled, then in the running batch: its decode runs through the timing below
        for i in range(held):
            first_turn = [rng.randrange(5, 500) for _ in range(1400)]
            driver.submit(first_turn, max_new_tokens=4, custom_params={"program_id": f"new-{i}"})
        assert len(scheduler.waiting_queue) == held

        def select() -> None:
            plan = scheduler.get_new_batch_prefill(scheduler.running_batch)
            assert plan.batch_to_run is None, "a held first turn was admitted"

        first = timeit(select, 1)
        steady = timeit(select, repeat)
        out[policy] = {"first_step": first, "step": steady}
        release_parallel_runtime()
    out["added_per_step_us"] = out["continuum"]["step"]["median_us"] - out["fcfs"]["step"]["median_us"]
    return out


def arrivals_report(model_path: str, held: int) -> dict:
    return {
        "inference": bench_inference(),
        "shared_prompt": bench_shared_prompt(),
        "arrival_match": bench_arrival_match(model_path),
        "held_turns": bench_held_turns(model_path, held),
    }


def print_arrivals(report: dict) -> None:
    for x in report["inference"]:
        print(
            f"program inference, {x['records']} records, {x['prompt_tokens']}-token prompt: arrival (matched) "
            f"{x['arrival_matched']['median_us'] / 1000:.3f} ms median ({x['arrival_matched']['p90_us'] / 1000:.3f} "
            f"p90), arrival (no match) {x['arrival_unmatched']['median_us'] / 1000:.3f} ms median "
            f"({x['arrival_unmatched']['p90_us'] / 1000:.3f} p90), a finished turn's record "
            f"{x['record_finished_turn']['median_us'] / 1000:.3f} ms; a request with an id looks up nothing"
        )
    for x in report["shared_prompt"]:
        print(
            f"program inference, {x['records']} records sharing one 128-token prompt: an arrival extending it "
            f"{x['arrival_extending_the_shared_prompt']['median_us'] / 1000:.3f} ms median "
            f"({x['arrival_extending_the_shared_prompt']['p90_us'] / 1000:.3f} p90), one continuing a record "
            f"{x['arrival_continuing_one']['median_us'] / 1000:.3f} ms median"
        )
    for x in report["arrival_match"]:
        print(
            f"enqueue hook of a return, {x['prompt_tokens']}-token prompt (SGLang's prefix match): "
            f"context resident {x['arrival_resident']['median_us'] / 1000:.3f} ms median "
            f"({x['arrival_resident']['p90_us'] / 1000:.3f} p90), context gone "
            f"{x['arrival_gone']['median_us'] / 1000:.3f} ms median ({x['arrival_gone']['p90_us'] / 1000:.3f} p90)"
        )
    x = report["held_turns"]
    for policy in ("fcfs", "continuum"):
        print(
            f"{policy:>9}: prefill selection with {x['held']} first turns waiting: first step "
            f"{x[policy]['first_step']['median_us'] / 1000:.3f} ms, then {x[policy]['step']['median_us'] / 1000:.3f} ms "
            f"median ({x[policy]['step']['p90_us'] / 1000:.3f} p90); continuum adds "
            f"{x['added_per_step_us'] / 1000:.3f} ms per step"
        )
