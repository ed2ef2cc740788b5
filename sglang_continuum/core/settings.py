"""Plugin settings: defaults < config file (``SGLANG_CONTINUUM_CONFIG``) < environment variables.

SGLang copies only its own fields from the command line into ``ServerArgs``, so the plugin is
configured through the environment, which spawned scheduler processes inherit. Every field can be
set as ``SGLANG_CONTINUUM_<FIELD NAME IN CAPITALS>``; the config file is TOML (or JSON) with the
same field names at top level. See ``configs/continuum.toml`` for a commented example.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping, Optional

import tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sglang_continuum.core.ttl_names import TTL_MODEL_NAMES

ENV_PREFIX = "SGLANG_CONTINUUM_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"


class ContinuumSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # TTL model and its parameters
    ttl_model: str = Field("cost", description="a name in core/ttl_registry.py: cost, fixed, reference, bernstein")
    fixed_ttl_s: float = Field(2.0, ge=0)
    reference_pin_s: float = Field(2.0, ge=0)
    reference_threshold_s: float = Field(2.0, ge=0)
    max_ttl_s: float = Field(30.0, ge=0, description="cap on any TTL a model chooses")
    cold_start_k: int = Field(100, ge=0, description="samples needed before a CDF is trusted (K)")
    queue_delay_window: int = Field(256, ge=1, description="returning turns averaged for T")
    eta_window: int = Field(1000, ge=2, description="completed programs used for eta")
    prefill_profile: Optional[str] = Field(None, description="prefill profile JSON (PrefillReload)")
    bernstein_delta: float = Field(0.1, gt=0, lt=1)
    bernstein_alpha: float = Field(0.1, ge=0)
    bernstein_min_samples: int = Field(10, ge=1)
    bernstein_t_default_s: float = Field(2.0, ge=0)

    # pinning
    pin_budget_fraction: float = Field(0.5, ge=0, le=1, description="share of the KV pool pins may hold")
    max_wait_hold_s: float = Field(
        10.0, ge=0, description="how long an expired pin is kept while its program's next turn waits"
    )
    pin_without_tool: bool = Field(
        True, description="pin turns whose tool call could not be identified (False: no tool found, no pin)"
    )
    terminal_tools: tuple[str, ...] = Field(
        ("submit",),
        description="tools that end the program (a turn calling one is its last step): the submit "
        "sentinel of mini-swe-agent is classed as 'submit'; comma-separated in the environment",
    )
    return_window: int = Field(
        200, ge=1, description="per tool, the latest outcomes (came back or not) its return probability reads"
    )

    # queue order and admission
    max_overtakes: int = Field(
        32,
        ge=0,
        description="bounded waiting: a request is overdue once this many requests that arrived after it were "
        "admitted ahead of it (a bound in the engine's own pace), while returning programs find their contexts "
        "cached; 0 = off",
    )
    min_overtakes: int = Field(
        2,
        ge=1,  # a budget of 0 reads as "no bound": a floor of 0 would unbound the thrashing pool's turns
        description="the overtaking budget when returning programs find none of their contexts (return loss 1); "
        "from a return loss of 0.5 (the pool thrashes) it falls linearly from max_overtakes to this, since being "
        "overtaken buys a request nothing when the pool keeps no locality anyway; capped at max_overtakes "
        "(equal: a fixed budget)",
    )
    max_queue_wait_s: float = Field(
        0.0,
        ge=0,
        description="optional absolute ceiling: a request waiting this long is overdue too; 0 = off (the default: "
        "a bound in seconds turns every turn overdue under overload)",
    )
    overdue_admission_overcommit: float = Field(
        1.0,
        ge=0,
        description="an overdue first turn passes admission control only while the working sets plus its prompt "
        "fit in this many pools; 0 = no limit; 1 (the default): never past the pool, which admission control "
        "already sizes for growth, so an overdue first turn waits for room like any other (1.5 before 2026-11-25)",
    )
    # ablations of the bounded-waiting path (issue 22's decomposition); the defaults are the product
    overdue_before_pinned: bool = Field(
        False, description="ablation: overdue requests go before turns whose prefix is pinned (the 3 s bound's order)"
    )
    overdue_sheds_any_pin: bool = Field(
        False, description="ablation: a blocked overdue turn may shed pins of programs ranked before it"
    )
    shed_waiting_pins: bool = Field(
        False, description="ablation: admission may shed a pin whose program's next turn is already waiting"
    )
    program_order: bool = Field(
        True, description="program-level FCFS (False: request arrival order; the pins-only ablation)"
    )
    admission_control: bool = Field(
        True, description="a new program's first turn waits while the working sets of programs in flight fill the pool"
    )
    admission_working_set_fraction: float = Field(
        1.0, gt=0, description="share of the KV pool the working sets of programs in flight may fill"
    )
    working_set_window_s: float = Field(
        30.0, gt=0, description="a program unseen this long (out on a tool) leaves the working set"
    )
    idle_admission_overcommit: float = Field(
        0.0,
        ge=0,
        description="when holding a first turn back would idle the engine, it still waits if the working sets plus "
        "it exceed this many pools (the engine idles rather than thrash); 0 = never held while the engine idles",
    )
    admission_expects_growth: bool = Field(
        True,
        description="admission control reserves for each program in flight, and for the new one, at least the "
        "mean final context of the last final_context_window programs that ended (agent contexts grow every turn: "
        "first turns are small, so today's sizes let in more programs than the pool will hold); False: today's "
        "contexts only (the previous default)",
    )
    final_context_window: int = Field(64, ge=1, description="ended programs the expected final context is the mean of")
    admission_counts_selection: bool = Field(
        True,
        description="admission control counts the turns a prefill selection already took (the working set hears "
        "of them only once the batch is formed); False (ablation, the behaviour before 2026-11-25): every first "
        "turn of one selection sees the room as it was before it, so a wave of new programs can pass together",
    )
    working_set_follows_pins: bool = Field(
        True,
        description="a program out on a tool stays in the working set only while it holds a pin: when the cost "
        "model lets its KV go (no pin, or the pin expired) admission control stops keeping room for it "
        "(False: every program seen within working_set_window_s, the default before 2026-11-24)",
    )
    return_loss_threshold: float = Field(
        0.0,
        ge=0,
        le=1,
        description="thrash signal: while returning turns find more than this share of their previous context "
        "gone (over the last return_loss_window of them), new programs wait even if the current working sets fit "
        "the pool (contexts grow); 0 = off (the default: on the CPU thrash run it came too late to help, "
        "docs/results/thrash-cpu/)",
    )
    return_loss_window: int = Field(32, ge=8, description="returning turns the return loss is measured over")
    load_control: bool = Field(
        False,
        description="experimental: while the return loss is above return_loss_threshold, a returning turn also waits "
        "if the working sets of programs ranked before it fill the pool (suspend the latest programs instead of "
        "letting every program re-prefill); off by default, docs/results/thrash-cpu/",
    )

    # host tier (--enable-hierarchical-cache)
    offload_to_host: bool = Field(
        True, description="back up expired or shed pins to host memory and protect the host copy"
    )
    host_pin_budget_fraction: float = Field(0.5, ge=0, le=1, description="share of the host pool host pins may hold")
    host_ttl_s: float = Field(60.0, ge=0, description="host-copy TTL for the fixed/reference/bernstein models")
    max_host_ttl_s: float = Field(300.0, ge=0, description="cap on any host-copy TTL")
    host_bandwidth_bytes_per_s: Optional[float] = Field(
        None,
        gt=0,
        description="host-to-device bandwidth for the reload cost; unset: the prefill "
        "profile's measured value, else a conservative 6 GB/s",
    )
    predictive_reload: bool = Field(False, description="load a host-only prefix back before its tool returns")
    predictive_reload_quantile: float = Field(0.5, gt=0, le=1, description="predicted return = this quantile")
    predictive_reload_lead_s: float = Field(0.05, ge=0, description="start this long before transfer + return")

    # bounded state
    max_programs: int = Field(100_000, ge=1)
    program_idle_timeout_s: float = Field(900.0, gt=0)
    tool_window: int = Field(10_000, ge=1)
    global_window: int = Field(100_000, ge=1)
    max_tools: int = Field(1024, ge=1)

    # statistics persistence (warm start)
    stats_path: Optional[str] = Field(
        None,
        description="tool statistics loaded at start, saved periodically (off the scheduler's step) and at shutdown",
    )
    stats_save_interval_s: float = Field(30.0, gt=0)

    # tool statistics shared between workers (core/stats_exchange.py)
    stats_publish_endpoint: Optional[str] = Field(
        None, description="zmq endpoint this worker publishes its tool samples on (bound), e.g. tcp://0.0.0.0:5701"
    )
    stats_peer_endpoints: tuple[str, ...] = Field(
        (),
        description="peers' publish endpoints to subscribe to (comma-separated in the environment; may include "
        "this worker's own)",
    )
    stats_exchange_interval_s: float = Field(0.1, gt=0, description="publish and merge at most this often")
    stats_exchange_history: int = Field(1024, ge=1, description="latest local samples a newly heard peer is sent")

    # program identity for requests with no id (core/program_inference.py)
    infer_programs: bool = Field(
        True,
        description="a request with no program id continues the program whose finished turn's context its "
        "prompt extends (else starts a new inferred program); False: such requests are plain FCFS",
    )
    infer_divergence_tokens: int = Field(
        32,
        ge=0,
        description="the deep key stops this many tokens before a finished context's end (a chat template may "
        "re-render the end of the assistant message); the prompt key allows divergence anywhere in the output",
    )
    attribution_log: Optional[str] = Field(
        None, description="JSONL file: the program each request with no id was attributed to (benchmarks)"
    )

    # debugging
    check_integrity: bool = Field(False, description="check every invariant at idle (tests, debugging)")
    admission_log_path: Optional[str] = Field(
        None, description="append one JSON line per admitted request (wait, overtakes, overdue, held back)"
    )

    @field_validator("ttl_model")
    @classmethod
    def _known_model(cls, name: str) -> str:
        if name not in TTL_MODEL_NAMES:
            raise ValueError(f"unknown TTL model {name!r}; choose from {sorted(TTL_MODEL_NAMES)}")
        return name

    @field_validator("terminal_tools", "stats_peer_endpoints", mode="before")
    @classmethod
    def _comma_list(cls, value):
        if isinstance(value, str):  # from the environment: "submit,finish", "tcp://a:1,tcp://b:1"
            return tuple(t.strip() for t in value.split(",") if t.strip())
        return value

    @field_validator("stats_publish_endpoint", "stats_peer_endpoints")
    @classmethod
    def _zmq_endpoints(cls, value):
        from sglang_continuum.core.stats_exchange import ENDPOINT_SCHEMES

        for endpoint in (value,) if isinstance(value, str) else value or ():
            if not endpoint.startswith(ENDPOINT_SCHEMES):
                raise ValueError(f"stats endpoint {endpoint!r} must start with one of {ENDPOINT_SCHEMES}")
        return value

    @field_validator("stats_path")
    @classmethod
    def _writable_stats_path(cls, path: Optional[str]) -> Optional[str]:
        if path is None:
            return None
        target = Path(path)
        if target.is_dir():
            raise ValueError(f"stats_path {path!r} is a directory; it must name a file")
        parent = target.parent if str(target.parent) else Path(".")
        existing = next((p for p in (parent, *parent.parents) if p.exists()), None)
        if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            raise ValueError(f"stats_path {path!r}: {existing or parent} is not a writable directory")
        if target.exists() and not os.access(target, os.W_OK):
            raise ValueError(f"stats_path {path!r} is not writable")
        return path

    @model_validator(mode="after")
    def _programs_outlive_pins(self) -> "ContinuumSettings":
        if self.program_idle_timeout_s <= self.max_ttl_s + self.max_wait_hold_s + self.max_host_ttl_s:
            raise ValueError("program_idle_timeout_s must exceed max_ttl_s + max_wait_hold_s + max_host_ttl_s")
        return self

    @classmethod
    def load(cls, environ: Optional[Mapping[str, str]] = None) -> "ContinuumSettings":
        env = os.environ if environ is None else environ
        values: dict = {}
        path = env.get(CONFIG_ENV)
        if path:
            values.update(_read_config_file(Path(path)))
        for name in cls.model_fields:
            key = ENV_PREFIX + name.upper()
            if key in env:
                values[name] = env[key]
        try:
            return cls(**values)
        except ValidationError as exc:
            raise ValueError(f"invalid sglang-continuum settings: {exc}") from exc


def _read_config_file(path: Path) -> dict:
    if not path.is_file():
        raise ValueError(f"{CONFIG_ENV}={path}: no such file")
    text = path.read_text()
    data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: top level must be a table")
    return data.get("continuum", data)
