"""The operator's settings: defaults < config file (``SGLANG_CONTINUUM_CONFIG``) < environment.

SGLang copies only its own fields from the command line into ``ServerArgs``, so the plugin is
configured through the environment, which spawned scheduler processes inherit. Every field can be
set as ``SGLANG_CONTINUUM_<FIELD NAME IN CAPITALS>``; the config file is TOML (or JSON) with the
same field names at top level (``configs/continuum.toml``). An unknown key in either stops
start-up, naming the key. Everything else the policy uses is a constant of the module that owns it.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Iterator, Mapping, Optional

import tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

ENV_PREFIX = "SGLANG_CONTINUUM_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"
_HEADER_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789!#$%&'*+-.^_`|~")  # RFC 9110 token


class ContinuumSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # pins
    pin_budget_fraction: float = Field(
        0.5,
        ge=0,
        le=1,
        description="share of the KV pool TTL pins may hold; resident programs' pins, while admission control "
        "binds without a host tier, up to 0.7 (0: program order alone, no pins)",
    )
    max_ttl_s: float = Field(30.0, ge=0, description="longest TTL any pin gets")
    prefill_profile: Optional[str] = Field(
        None,
        description="measured prefill profile JSON (continuum-profile): what re-prefilling a context costs "
        "(unset: the engine's own, fitted to its prefill steps)",
    )
    terminal_tools: tuple[str, ...] = Field(
        ("submit",), description="tools that end a program: nothing is pinned after a turn that calls one"
    )
    # queue order and admission
    max_overtakes: int = Field(
        32,
        ge=0,
        description="bounded waiting: a request is overdue once later arrivals worth this many average prompts "
        "prefilled were admitted ahead of it (fewer while the pool thrashes); 0 = no bound",
    )
    admission_control: bool = Field(
        True, description="a new program's first turn waits while the working sets of programs in flight fill the pool"
    )
    max_hold_s: float = Field(
        240.0,
        ge=0,
        description="longest admission control holds a turn (a first turn, a paused return), from its arrival: "
        "past it the turn is admitted next, resident programs out on a tool released to make room; 0 = no bound",
    )
    infer_programs: bool = Field(
        True, description="requests with no program id continue the program whose context their prompt extends"
    )
    # who may use a program id
    program_scope_header: Optional[str] = Field(
        None,
        description="HTTP header whose value scopes program ids: each value (a bearer token with "
        "'authorization', a tenant with a gateway's tenant header) is its own namespace, so a client "
        "can end or join only programs sent with the same value, and each value takes a fair share of "
        "the queue and of the pins; unset: one namespace for every client",
    )
    # host tier (--enable-hierarchical-cache)
    offload_to_host: bool = Field(
        True, description="an expired or shed pin's prefix goes to host memory, protected for a host TTL"
    )
    predictive_upload: bool = Field(
        False,
        description="Tokencake's time scheduler (off until measured over seeds): a host pin's prefix is loaded "
        "back ahead of its program's predicted return, and a pinned program out on a long tool call gives its "
        "device memory to a turn refused for it",
    )
    host_bandwidth_bytes_per_s: Optional[float] = Field(
        None,
        gt=0,
        description="host-to-device bandwidth for the reload cost (unset: the prefill profile's, else learned from the engine's loads)",
    )
    # tool statistics: warm start and sharing between workers
    stats_path: Optional[str] = Field(
        None, description="tool statistics loaded at start, saved periodically and at shutdown (warm start)"
    )
    stats_publish_endpoint: Optional[str] = Field(
        None, description="zmq endpoint this worker publishes its tool samples on, e.g. tcp://10.0.0.5:5701"
    )
    stats_peer_endpoints: tuple[str, ...] = Field(
        (), description="peers' publish endpoints to learn from (comma-separated in the environment)"
    )
    stats_key_file: Optional[str] = Field(
        None,
        description="the fleet's CURVE key pair (zmq.auth's .key_secret file): only its holders exchange "
        "statistics; unset, the endpoints must be local (loopback tcp, ipc)",
    )
    # experiments and debugging
    rules: str = Field(
        "default",
        description="the policy composition: 'default', or 'package.module:NAME' of a core.rules.Rules "
        "(the lab's named variants)",
    )
    event_log: Optional[str] = Field(
        None, description="JSONL file: one line per admitted request and per program inferred (benchmarks)"
    )
    check_integrity: bool = Field(False, description="check every invariant while the scheduler idles (tests)")

    @field_validator("terminal_tools", "stats_peer_endpoints", mode="before")
    @classmethod
    def _comma_list(cls, value):
        if isinstance(value, str):  # from the environment: "submit,finish", "tcp://a:1,tcp://b:1"
            return tuple(t.strip() for t in value.split(",") if t.strip())
        return value

    @field_validator("program_scope_header")
    @classmethod
    def _header_name(cls, name: Optional[str]) -> Optional[str]:
        if name is None or not name.strip():
            return None
        name = name.strip().lower()
        if not set(name) <= _HEADER_CHARS:
            raise ValueError(f"program_scope_header {name!r} is not an HTTP header name")
        return name

    @field_validator("stats_publish_endpoint", "stats_peer_endpoints")
    @classmethod
    def _zmq_endpoints(cls, value):
        from sglang_continuum.core.stats_endpoints import ENDPOINT_SCHEMES

        for endpoint in (value,) if isinstance(value, str) else value or ():
            if not endpoint.startswith(ENDPOINT_SCHEMES):
                raise ValueError(f"stats endpoint {endpoint!r} must start with one of {ENDPOINT_SCHEMES}")
        return value

    @field_validator("stats_key_file")
    @classmethod
    def _readable_keys(cls, path: Optional[str]) -> Optional[str]:
        from sglang_continuum.core.stats_endpoints import read_keys

        if path is not None:
            try:
                read_keys(path)
            except (OSError, ValueError) as exc:
                raise ValueError(f"stats_key_file {path!r}: {exc}") from exc
        return path

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
    def _local_unless_keyed(self) -> "ContinuumSettings":
        from sglang_continuum.core.stats_endpoints import check_local

        if self.stats_key_file is None:  # nothing authenticates a peer: stay on this host
            check_local("stats_publish_endpoint", [self.stats_publish_endpoint] if self.stats_publish_endpoint else [])
            check_local("stats_peer_endpoints", self.stats_peer_endpoints)
        return self

    @model_validator(mode="after")
    def _known_rules(self) -> "ContinuumSettings":
        from sglang_continuum.core.rules import resolve_rules

        resolve_rules(self.rules).timings.check(self.max_ttl_s)  # raises, naming it, if it does not resolve
        return self

    @classmethod
    def load(cls, environ: Optional[Mapping[str, str]] = None) -> "ContinuumSettings":
        """The settings in force: those ``use_settings`` set in this process, else the config file
        and the environment."""
        if _override is not None and environ is None:
            return _override
        env = os.environ if environ is None else environ
        values: dict = {}
        path = env.get(CONFIG_ENV)
        if path:
            values.update(_read_config_file(Path(path)))
        known = {ENV_PREFIX + name.upper(): name for name in cls.model_fields}
        unknown = sorted(k for k in env if k.startswith(ENV_PREFIX) and k != CONFIG_ENV and k not in known)
        if unknown:
            raise ValueError(f"unknown sglang-continuum setting(s) in the environment: {', '.join(unknown)}")
        values.update({known[k]: v for k, v in env.items() if k in known})
        try:
            return cls(**values)
        except ValidationError as exc:
            raise ValueError(f"invalid sglang-continuum settings: {exc}") from exc


_override: Optional[ContinuumSettings] = None


@contextlib.contextmanager
def use_settings(settings: ContinuumSettings) -> Iterator[ContinuumSettings]:
    """Within the block, every ``ContinuumSettings.load()`` in this process returns ``settings``:
    how the emulator and in-process tests hand a typed configuration to the scheduler they build
    (a spawned server reads its environment instead)."""
    global _override
    previous, _override = _override, settings
    try:
        yield settings
    finally:
        _override = previous


def _read_config_file(path: Path) -> dict:
    if not path.is_file():
        raise ValueError(f"{CONFIG_ENV}={path}: no such file")
    text = path.read_text()
    data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: top level must be a table")
    return data.get("continuum", data)
