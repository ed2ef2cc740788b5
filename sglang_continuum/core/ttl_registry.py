"""Every TTL model, registered in one place: ``ttl_model = NAME`` in the settings picks one."""

from __future__ import annotations

from typing import Callable, Optional

from sglang_continuum.core.cost_model import BernsteinTTL, CostModelTTL, PrefillProfile
from sglang_continuum.core.tool_stats import ToolStats
from sglang_continuum.core.ttl import FixedTTL, ReferenceTTL, TTLModel


def _cost(settings, stats: ToolStats) -> TTLModel:
    profile: Optional[PrefillProfile] = (
        PrefillProfile.load(settings.prefill_profile) if settings.prefill_profile else None
    )
    return CostModelTTL(settings, stats, profile)


TTL_MODELS: dict[str, Callable[..., TTLModel]] = {
    "cost": _cost,
    "fixed": FixedTTL,
    "reference": ReferenceTTL,
    "bernstein": BernsteinTTL,
}


def build_ttl_model(settings, stats: ToolStats) -> TTLModel:
    return TTL_MODELS[settings.ttl_model](settings, stats)
