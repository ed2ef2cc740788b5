"""The policies the bench and the emulator compare, by name: SGLang flags and plugin settings.

Policies: SGLang's own ``fcfs``, ``lpm``, and the stock alternatives an SGLang 0.5.23 user has
for agent workloads (all with fcfs scheduling):

- ``tlru``: ``--radix-eviction-policy tlru`` (tail-optimised LRU, arXiv:2510.15152). It refuses to
  start without ``--radix-eviction-policy-config`` holding ``threshold`` > ``next_prompt_estimate``
  (tokens); ``tlru_config`` derives both from the workload.
- ``priority-evict``: ``--radix-eviction-policy priority`` ranks nodes by (priority, last access).
  A finished request's path is inserted with its priority (0 when the client sends none, as the
  replay does) and its prompt part again with priority + 1, so without request priorities it
  evicts the output tails (tokens no prompt has carried yet) before any prompt, then LRU. In an
  agent program that tail is the last turn's output, which the next turn re-sends.
- ``session``: ``--enable-session-radix-cache`` (forces SGLang's Python tree core). A ``/generate``
  carrying a top-level ``session_id`` opens the session implicitly (no ``/open_session``); each
  finished turn's path is referenced by its session, and referenced KV is evicted only after
  unreferenced KV (a preference, not a lock). The replay sends the program id as ``session_id``
  and calls ``/close_session`` after the program's last turn, which drops the reference. Without
  the flag SGLang only tags KV events with ``session_id``: fcfs and lpm serve it unchanged.

Continuum: ``continuum-ref`` (the public reference's fixed 2 s rule), ``continuum-fixed`` (fixed
TTL), ``continuum`` (the cost model), its two ablations ``continuum-order-only`` (program-level
FCFS, no pins: a zero pin budget) and ``continuum-pins-only`` (pins, requests in arrival order),
and ``continuum-no-wait-bound`` (the paper's program-level FCFS: no starvation bound). Issue 22's
decomposition of bounded waiting: ``continuum-3s`` (the 3 s bound shipped before, with its three
consequences), ``-3s-rank-shed``, ``-3s-pinned-first``, ``-3s-no-bypass`` (each consequence off),
``continuum-no-bound-no-ac``, ``continuum-order-only-no-bound``, ``continuum-3s-only``,
``continuum-open-door`` (no limit on overdue first turns passing admission control),
``continuum-return-loss`` (admission control that also reads the thrash signal, ``core/return_loss.py``),
``continuum-load-control`` (that, and returning turns of the latest programs wait too while it is high),
``continuum-ws-pins`` (the working set counts a program out on a tool only while it is pinned: the default since
2026-11-24, so the same as ``continuum``), ``continuum-ws-window`` (every program seen in the last
``working_set_window_s``: the default before),
``continuum-growth`` (admission reserves the mean final context of ended programs per program: the default
since 2026-11-24, so the same as ``continuum``; ``-ws-pins`` with that too), ``continuum-no-growth`` (admission
by today's contexts: the default before), ``continuum-growth-idle`` / ``-strict`` (and holds first turns even when the engine would
idle, past 1.5 / 1 pools), ``continuum-k8`` / ``-k16`` / ``-k32`` (a fixed overtaking budget of 8 / 16 / 32
instead of one that falls from 32 to 2 as the pool thrashes; ``-k32`` is the default before the budget
followed the return loss), ``continuum-floor-8`` (the budget falls to 8, not 2: the default before 2026-11-25).
Any policy with ``+hicache`` adds SGLang's host tier (``--enable-hierarchical-cache``) and is
compared with ``fcfs+hicache``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

NO_BOUND = {"SGLANG_CONTINUUM_MAX_OVERTAKES": "0", "SGLANG_CONTINUUM_MAX_QUEUE_WAIT_S": "0"}
# the bounded waiting shipped until issue 22: overdue after 3 s, and then ahead of pinned turns,
# free to shed any pin (waiting turns' included) and to pass admission control
OLD_3S = {
    "SGLANG_CONTINUUM_MAX_OVERTAKES": "0",
    "SGLANG_CONTINUUM_MAX_QUEUE_WAIT_S": "3",
    "SGLANG_CONTINUUM_OVERDUE_BEFORE_PINNED": "true",
    "SGLANG_CONTINUUM_OVERDUE_SHEDS_ANY_PIN": "true",
    "SGLANG_CONTINUUM_SHED_WAITING_PINS": "true",
    "SGLANG_CONTINUUM_OVERDUE_ADMISSION_OVERCOMMIT": "0",
}
POLICIES: dict[str, tuple[list[str], dict[str, str]]] = {
    "fcfs": (["--schedule-policy", "fcfs"], {}),
    "lpm": (["--schedule-policy", "lpm"], {}),
    "tlru": (["--schedule-policy", "fcfs", "--radix-eviction-policy", "tlru"], {}),
    "priority-evict": (["--schedule-policy", "fcfs", "--radix-eviction-policy", "priority"], {}),
    "session": (["--schedule-policy", "fcfs", "--enable-session-radix-cache"], {}),
    "continuum-ref": (["--schedule-policy", "continuum"], {"SGLANG_CONTINUUM_TTL_MODEL": "reference"}),
    "continuum-fixed": (["--schedule-policy", "continuum"], {"SGLANG_CONTINUUM_TTL_MODEL": "fixed"}),
    "continuum": (["--schedule-policy", "continuum"], {"SGLANG_CONTINUUM_TTL_MODEL": "cost"}),
    # ablations of the cost-model policy: program-level FCFS without pins, pins in request order
    "continuum-order-only": (["--schedule-policy", "continuum"], {"SGLANG_CONTINUUM_PIN_BUDGET_FRACTION": "0"}),
    "continuum-pins-only": (["--schedule-policy", "continuum"], {"SGLANG_CONTINUUM_PROGRAM_ORDER": "false"}),
    # the paper's program-level FCFS without any starvation bound
    "continuum-no-wait-bound": (["--schedule-policy", "continuum"], NO_BOUND),
    "continuum-no-bound-no-ac": (
        ["--schedule-policy", "continuum"],
        {**NO_BOUND, "SGLANG_CONTINUUM_ADMISSION_CONTROL": "false"},
    ),
    "continuum-order-only-no-bound": (
        ["--schedule-policy", "continuum"],
        {**NO_BOUND, "SGLANG_CONTINUUM_PIN_BUDGET_FRACTION": "0"},
    ),
    # issue 22's decomposition: the bound shipped before (3 s, with its three consequences), then
    # each consequence switched off in turn
    "continuum-3s": (["--schedule-policy", "continuum"], OLD_3S),
    "continuum-3s-rank-shed": (
        ["--schedule-policy", "continuum"],
        {**OLD_3S, "SGLANG_CONTINUUM_OVERDUE_SHEDS_ANY_PIN": "false", "SGLANG_CONTINUUM_SHED_WAITING_PINS": "false"},
    ),
    "continuum-3s-pinned-first": (
        ["--schedule-policy", "continuum"],
        {**OLD_3S, "SGLANG_CONTINUUM_OVERDUE_BEFORE_PINNED": "false"},
    ),
    "continuum-3s-no-bypass": (
        ["--schedule-policy", "continuum"],
        {**OLD_3S, "SGLANG_CONTINUUM_OVERDUE_ADMISSION_OVERCOMMIT": "1"},
    ),
    # the shipped bound with no limit on overdue first turns passing admission control
    "continuum-open-door": (["--schedule-policy", "continuum"], {"SGLANG_CONTINUUM_OVERDUE_ADMISSION_OVERCOMMIT": "0"}),
    # overdue first turns past admission control up to 1.5 pools: the default before 2026-11-25 (since
    # then an overdue first turn never passes the pool, ``overdue_admission_overcommit = 1``)
    "continuum-door-1.5": (
        ["--schedule-policy", "continuum"],
        {"SGLANG_CONTINUUM_OVERDUE_ADMISSION_OVERCOMMIT": "1.5"},
    ),
    # admission control that also holds new programs while returning ones lose over half their contexts
    "continuum-return-loss": (["--schedule-policy", "continuum"], {"SGLANG_CONTINUUM_RETURN_LOSS_THRESHOLD": "0.5"}),
    # experimental load control: returning turns of the latest programs also wait while the pool thrashes
    "continuum-load-control": (
        ["--schedule-policy", "continuum"],
        {"SGLANG_CONTINUUM_RETURN_LOSS_THRESHOLD": "0.5", "SGLANG_CONTINUUM_LOAD_CONTROL": "1"},
    ),
    # admission control keeps room only for programs the cost model keeps (pinned or in flight): the
    # default since 2026-11-24 (``continuum`` is the same); ``-ws-window`` is the default before it
    "continuum-ws-pins": (["--schedule-policy", "continuum"], {"SGLANG_CONTINUUM_WORKING_SET_FOLLOWS_PINS": "1"}),
    "continuum-ws-window": (["--schedule-policy", "continuum"], {"SGLANG_CONTINUUM_WORKING_SET_FOLLOWS_PINS": "0"}),
    # admission control expects every program to grow to the mean final context of those that ended:
    # the default since 2026-11-24 (``continuum-growth`` is the same); ``-no-growth`` sizes programs by
    # today's contexts, the default before
    "continuum-growth": (["--schedule-policy", "continuum"], {"SGLANG_CONTINUUM_ADMISSION_EXPECTS_GROWTH": "1"}),
    "continuum-no-growth": (["--schedule-policy", "continuum"], {"SGLANG_CONTINUUM_ADMISSION_EXPECTS_GROWTH": "0"}),
    "continuum-growth-ws-pins": (
        ["--schedule-policy", "continuum"],
        {"SGLANG_CONTINUUM_ADMISSION_EXPECTS_GROWTH": "1", "SGLANG_CONTINUUM_WORKING_SET_FOLLOWS_PINS": "1"},
    ),
    "continuum-growth-idle": (
        ["--schedule-policy", "continuum"],
        {"SGLANG_CONTINUUM_ADMISSION_EXPECTS_GROWTH": "1", "SGLANG_CONTINUUM_IDLE_ADMISSION_OVERCOMMIT": "1.5"},
    ),
    "continuum-growth-strict": (
        ["--schedule-policy", "continuum"],
        {"SGLANG_CONTINUUM_ADMISSION_EXPECTS_GROWTH": "1", "SGLANG_CONTINUUM_IDLE_ADMISSION_OVERCOMMIT": "1"},
    ),
    # every first turn of one prefill selection sees the room as it was before it (the behaviour before
    # 2026-11-25; since then admission control counts the turns the selection already took)
    "continuum-selection-blind": (
        ["--schedule-policy", "continuum"],
        {"SGLANG_CONTINUUM_ADMISSION_COUNTS_SELECTION": "0"},
    ),
    # a fixed overtaking budget (the default's falls from 32 to 2 as the return loss passes 0.5)
    "continuum-k8": (["--schedule-policy", "continuum"], {"SGLANG_CONTINUUM_MAX_OVERTAKES": "8"}),
    "continuum-k16": (["--schedule-policy", "continuum"], {"SGLANG_CONTINUUM_MAX_OVERTAKES": "16"}),
    "continuum-k32": (["--schedule-policy", "continuum"], {"SGLANG_CONTINUUM_MIN_OVERTAKES": "32"}),
    # the budget's floor before 2026-11-25 (the starvation probe's tail over seeds, docs/results/bounded-waiting)
    "continuum-floor-8": (["--schedule-policy", "continuum"], {"SGLANG_CONTINUUM_MIN_OVERTAKES": "8"}),
    # the new bound's trigger in seconds instead of overtakes (everything else as shipped)
    "continuum-3s-only": (
        ["--schedule-policy", "continuum"],
        {"SGLANG_CONTINUUM_MAX_OVERTAKES": "0", "SGLANG_CONTINUUM_MAX_QUEUE_WAIT_S": "3"},
    ),
}
HICACHE_FLAGS = ["--enable-hierarchical-cache"]
# CPU servers: the direct io backend with the layer-first host layout (the one the CPU shim's
# stand-in for sgl_kernel's transfer_kv_direct serves; see docs/cpu-shim.md), and SGLang's default
# host/device ratio given explicitly: left to auto-sizing, SGLang refuses to start when less than
# its 10 GiB reserve of host memory is free, however small the pool
HICACHE_CPU_FLAGS = ["--hicache-io-backend", "direct", "--hicache-mem-layout", "layer_first", "--hicache-ratio", "2"]
CPU_PROFILE = Path(__file__).resolve().parents[3] / "configs" / "profiles" / "cpu-tiny-llama.json"


def pressure_pool_tokens(programs, hold_programs: float) -> int:
    """A KV pool that holds about ``hold_programs`` average program contexts, and always the
    largest single request: the regime where keeping or dropping a program's KV matters."""
    ctx = [p.context_tokens for p in programs]
    biggest = max(ctx) + max(t.output_tokens for p in programs for t in p.turns)
    return int(max(biggest + 256, hold_programs * sum(ctx) / len(ctx)))


def pool_regime(programs, pool: int) -> str:
    """How the pool compares with the workload, in words for the report."""
    ctx = [p.context_tokens for p in programs]
    held = pool / (sum(ctx) / len(ctx))
    if pool >= sum(ctx):
        return f"~{held:.1f} average program contexts: holds every program at once, no memory pressure"
    return (
        f"~{held:.1f} average program contexts, all {len(ctx)} need {sum(ctx)}: memory pressure, the regime "
        "where keeping a program's KV between turns matters"
    )


def context_length(model: Optional[str], pool: int) -> int:
    """The pool size, capped at the model's own limit: SGLang refuses a longer ``--context-length``
    (a pool that holds every program is larger than the tiny model's 32k positions)."""
    config = Path(model or "") / "config.json"
    if model and config.is_file():
        limit = json.loads(config.read_text()).get("max_position_embeddings")
        if isinstance(limit, int) and limit > 0:
            return min(pool, limit)
    return pool


def parse_policy(name: str, *, cpu: bool = True) -> tuple[list[str], dict[str, str]]:
    base, _, extra = name.partition("+")
    if base not in POLICIES:
        raise SystemExit(f"unknown policy {name!r}; choose from {sorted(POLICIES)} (optionally +hicache)")
    args, env = POLICIES[base]
    if extra == "hicache":
        args = args + HICACHE_FLAGS + (HICACHE_CPU_FLAGS if cpu else [])
    elif extra:
        raise SystemExit(f"unknown policy suffix {extra!r}")
    return list(args), dict(env)


def tlru_config(programs) -> dict:
    """T-LRU needs the next prompt's size and a tail threshold (tokens): the workload's mean
    appended tokens per later turn, and 8x that (tokens deeper than this in a conversation cannot
    change its tail TTFT, so they are evicted first)."""
    later = [t.append_tokens for p in programs for t in p.turns[1:]] or [1]
    estimate = max(1, int(sum(later) / len(later)))
    return {"threshold": 8 * estimate, "next_prompt_estimate": estimate}
