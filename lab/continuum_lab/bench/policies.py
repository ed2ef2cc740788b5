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

Continuum: ``continuum`` (the product's default) and the paper's ablations, each the default
with one rule or setting changed: ``continuum-order-only`` (program-level FCFS, no pins: a zero pin
budget), ``continuum-pins-only`` (pins, requests in arrival order), ``continuum-fixed`` (a fixed
2 s TTL instead of the cost model), ``continuum-ref`` (the public reference's 2 s rule),
``continuum-bernstein`` (the paper's first version's bound), ``continuum-no-wait-bound`` (no
starvation bound), ``continuum-no-admission-control``, ``continuum-no-residency`` (the door without
residency: no resident pins while it binds, no paused returns; ``-no-pausing`` and
``-no-resident-pins`` drop one of the two; ``-no-decode-share`` prices a batch place as if the
engine only decoded; ``-no-release-loss`` prices every context let go as lost),
``continuum-pause-binds`` (a held paused return binds the door too, once no first turn has been
held for a minute), ``continuum-marginal-rebuild`` (a rebuild priced without the prefill step's
fixed cost), ``continuum-priced-door`` (first turns weighed only while growth is reserved, with a
host tier or without) and ``continuum-priced-door-marginal`` (both), ``continuum-shared-step-cost``
(a step's fixed cost priced in the empty batch place it leaves, not in the rebuild),
``continuum-no-hold-bound`` (a held turn waits until the working set leaves it room: ``max_hold_s``
0) and ``continuum-hold-30s`` / ``-60s`` / ``-120s`` / ``-300s`` / ``-480s`` (bounds other than the
default 240 s), ``continuum-bound-sheds-oldest-{60,120,240}s`` (a turn past its bound sheds the
pin of the program resident longest, not the latest program's), and ``continuum-paper`` (the
paper's policy: neither bound nor admission control).
Any policy with ``+hicache`` adds SGLang's host tier (``--enable-hierarchical-cache``, SGLang's
default ``write_through``: the host mirrors the device) and is compared with ``fcfs+hicache``;
``+hicache-write-back`` the same with ``--hicache-write-policy write_back`` (device and host hold
distinct KV: more in all).

A policy is a typed ``Policy``: SGLang flags, plugin settings (checked against
``ContinuumSettings`` when this module is imported: a misspelt name fails there) and a rule
composition from ``variants.py`` by name. A spawned server gets it as its environment
(``Policy.environment``); the emulator, which builds the scheduler in-process, as a settings
object (``Policy.setting_values``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional

from sglang_continuum.core.settings import ENV_PREFIX, ContinuumSettings


@dataclass(frozen=True)
class Policy:
    name: str
    sglang_args: tuple[str, ...]
    settings: Mapping[str, object] = field(default_factory=dict)  # ContinuumSettings fields
    rules: Optional[str] = None  # a Rules in continuum_lab.bench.variants, by name

    def __post_init__(self) -> None:
        ContinuumSettings(**self.setting_values())  # unknown names and bad values fail at import

    def setting_values(self) -> dict[str, object]:
        """The plugin settings this policy sets (``ContinuumSettings`` fields)."""
        values = dict(self.settings)
        if self.rules:
            values["rules"] = f"continuum_lab.bench.variants:{self.rules}"
        return values

    def environment(self) -> dict[str, str]:
        """The same, as a spawned server reads them."""
        return {ENV_PREFIX + k.upper(): _env_value(v) for k, v in self.setting_values().items()}


def _env_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    return str(value)


CONTINUUM = ("--schedule-policy", "continuum")
_POLICIES = (
    Policy("fcfs", ("--schedule-policy", "fcfs")),
    Policy("lpm", ("--schedule-policy", "lpm")),
    Policy("tlru", ("--schedule-policy", "fcfs", "--radix-eviction-policy", "tlru")),
    Policy("priority-evict", ("--schedule-policy", "fcfs", "--radix-eviction-policy", "priority")),
    Policy("session", ("--schedule-policy", "fcfs", "--enable-session-radix-cache")),
    Policy("continuum", CONTINUUM),
    Policy("continuum-order-only", CONTINUUM, {"pin_budget_fraction": 0.0}),
    Policy("continuum-pins-only", CONTINUUM, rules="PINS_ONLY"),
    Policy("continuum-fixed", CONTINUUM, rules="FIXED_2S"),
    Policy("continuum-ref", CONTINUUM, rules="REFERENCE"),
    Policy("continuum-bernstein", CONTINUUM, rules="BERNSTEIN"),
    Policy("continuum-no-wait-bound", CONTINUUM, {"max_overtakes": 0}),
    Policy("continuum-no-admission-control", CONTINUUM, {"admission_control": False}),
    Policy("continuum-no-residency", CONTINUUM, rules="NO_RESIDENCY"),
    Policy("continuum-no-decode-share", CONTINUUM, rules="NO_DECODE_SHARE"),
    Policy("continuum-no-release-loss", CONTINUUM, rules="NO_RELEASE_LOSS"),
    Policy("continuum-no-pausing", CONTINUUM, rules="NO_PAUSING"),
    Policy("continuum-no-resident-pins", CONTINUUM, rules="NO_RESIDENT_PINS"),
    Policy("continuum-pause-binds", CONTINUUM, rules="PAUSE_BINDS"),
    Policy("continuum-priced-door", CONTINUUM, rules="PRICED_DOOR"),
    Policy("continuum-marginal-rebuild", CONTINUUM, rules="MARGINAL_REBUILD"),
    Policy("continuum-priced-door-marginal", CONTINUUM, rules="PRICED_DOOR_MARGINAL"),
    Policy("continuum-shared-step-cost", CONTINUUM, rules="SHARED_STEP_COST"),
    Policy("continuum-no-hold-bound", CONTINUUM, {"max_hold_s": 0}),
    Policy("continuum-upload", CONTINUUM, {"predictive_upload": True}),
    Policy("continuum-no-application-ranks", CONTINUUM, rules="NO_APPLICATION_RANKS"),
    *(Policy(f"continuum-hold-{s}s", CONTINUUM, {"max_hold_s": s}) for s in (30, 60, 120, 300, 480)),
    *(
        Policy(f"continuum-bound-sheds-oldest-{s}s", CONTINUUM, {"max_hold_s": s}, rules="BOUND_SHEDS_OLDEST")
        for s in (60, 120, 240)
    ),
    Policy("continuum-paper", CONTINUUM, {"max_overtakes": 0, "admission_control": False}),
)
POLICIES: dict[str, Policy] = {p.name: p for p in _POLICIES}
HICACHE_FLAGS = ["--enable-hierarchical-cache"]
HICACHE_SUFFIXES = {
    "hicache": HICACHE_FLAGS,
    "hicache-write-back": [*HICACHE_FLAGS, "--hicache-write-policy", "write_back"],
}
# CPU servers: the direct io backend with the layer-first host layout (the one the CPU shim's
# stand-in for sgl_kernel's transfer_kv_direct serves; see docs/cpu-shim.md), and SGLang's default
# host/device ratio given explicitly: left to auto-sizing, SGLang refuses to start when less than
# its 10 GiB reserve of host memory is free, however small the pool
HICACHE_CPU_FLAGS = ["--hicache-io-backend", "direct", "--hicache-mem-layout", "layer_first", "--hicache-ratio", "2"]
# the prefill profile of CPU servers (relative to the repository root, where the lab's tools run)
CPU_PROFILE = Path("configs") / "profiles" / "cpu-tiny-llama.json"


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


def policy_named(name: str) -> Policy:
    """The policy ``name`` (without a ``+hicache...`` suffix)."""
    base = name.partition("+")[0]
    if base not in POLICIES:
        raise SystemExit(
            f"unknown policy {name!r}; choose from {sorted(POLICIES)} (optionally +{'/+'.join(HICACHE_SUFFIXES)})"
        )
    return POLICIES[base]


def parse_policy(name: str, *, cpu: bool = True) -> tuple[list[str], dict[str, str]]:
    """SGLang flags and the plugin's environment for a server running ``name``."""
    policy = policy_named(name)
    args = list(policy.sglang_args)
    extra = name.partition("+")[2]
    if extra in HICACHE_SUFFIXES:
        args += HICACHE_SUFFIXES[extra] + (HICACHE_CPU_FLAGS if cpu else [])
    elif extra:
        raise SystemExit(f"unknown policy suffix {extra!r}")
    return args, policy.environment()


def tlru_config(programs) -> dict:
    """T-LRU needs the next prompt's size and a tail threshold (tokens): the workload's mean
    appended tokens per later turn, and 8x that (tokens deeper than this in a conversation cannot
    change its tail TTFT, so they are evicted first)."""
    later = [t.append_tokens for p in programs for t in p.turns[1:]] or [1]
    estimate = max(1, int(sum(later) / len(later)))
    return {"threshold": 8 * estimate, "next_prompt_estimate": estimate}
