"""Every TTL model, registered in one place: ``ttl_model = NAME`` in the settings picks one."""

from __future__ import annotations

from typing import Callable, Optional

from sglang_continuum.core.cost_model import BernsteinTTL, CostModelTTL, PrefillProfile
from sglang_continuum.core.tool_stats import ToolStats
from sglang_continuum.core.ttl import FixedTTL, ReferenceTTL, TTLModel
from sglang_continuum.core.ttl_names import TTL_MODEL_NAMES


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
assert set(TTL_MODELS) == TTL_MODEL_NAMES, "core/ttl_names.py lists every registered TTL model"


def build_ttl_model(settings, stats: ToolStats) -> TTLModel:
    return TTL_MODELS[settings.ttl_model](settings, stats)
