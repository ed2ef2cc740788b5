"""Entry point (group ``sglang.srt.plugins``): makes ``--schedule-policy continuum`` exist.

SGLang calls ``register()`` in the launcher and first thing in every spawned scheduler,
detokenizer and DP-controller process. It registers three hooks that each check the selected
policy when they run, so any other policy leaves SGLang exactly as it was:

* ``create_unified_radix_cache`` (AROUND): builds ``ContinuumRadixCache`` instead of the default.
* ``Scheduler.init_schedule_policy`` (AROUND): installs ``ContinuumSchedulePolicy`` and the
  per-scheduler binding.
* ``ServerArgs.resolve_once`` (AFTER): refuses to start if ``continuum`` was requested but the
  hooks above are not active. SGLang only logs plugin exceptions, so a half-loaded plugin would
  otherwise surface as an obscure error later, or not at all.

The ``continuum`` choice is added last, only once everything else registered.
"""

from __future__ import annotations

import logging
import pkgutil
import typing

from sglang_continuum import POLICY_NAME

logger = logging.getLogger(__name__)

CACHE_FACTORY = "sglang.srt.mem_cache.registry.create_unified_radix_cache"
INIT_POLICY = "sglang.srt.managers.scheduler.Scheduler.init_schedule_policy"
RESOLVE_ARGS = "sglang.srt.server_args.ServerArgs.resolve_once"

_originals: dict[str, object] = {}


class ContinuumPluginError(RuntimeError):
    pass


def _policy_of(args) -> str | None:
    return getattr(args, "schedule_policy", None)


def _around_create_cache(original, ctx, *, cache_class=None):
    if cache_class is None and _policy_of(ctx.server_args) == POLICY_NAME:
        from sglang_continuum.adapter.radix_cache import ContinuumRadixCache

        cache_class = ContinuumRadixCache
    return original(ctx, cache_class=cache_class)


def _around_init_schedule_policy(original, scheduler, *args, **kwargs):
    if scheduler.schedule_policy != POLICY_NAME:
        return original(scheduler, *args, **kwargs)
    from sglang_continuum.adapter import binding

    # SGLang's own initialisation builds SchedulePolicy from the name (which rejects unknown
    # names) next to the prefill delayer and batch-size tracker; run it as fcfs, then swap in ours.
    scheduler.schedule_policy = "fcfs"
    try:
        result = original(scheduler, *args, **kwargs)
    finally:
        scheduler.schedule_policy = POLICY_NAME
    scheduler.policy = binding.install(scheduler)
    return result


def _after_resolve(result, server_args, *args, **kwargs):
    if _policy_of(server_args) == POLICY_NAME:
        check_active()
    return result


def _resolve(target: str):
    return pkgutil.resolve_name(target)


def check_active() -> None:
    """Raise ``ContinuumPluginError`` unless every Continuum hook is applied in this process."""
    missing = [t for t, orig in _originals.items() if _resolve(t) is orig]
    if not _originals or missing:
        raise ContinuumPluginError(
            "--schedule-policy continuum was requested but the sglang-continuum plugin is not "
            f"active (hooks not applied: {missing or 'plugin not registered'}). Check the log for "
            "'Failed to load plugin' / 'Failed to apply hooks', that SGLANG_PLUGINS (if set) "
            "includes 'continuum', and that sglang==0.5.23 is installed."
        )
    # A bad environment or config file fails here, in the launcher, not later in a scheduler.
    from sglang_continuum.core.settings import ContinuumSettings

    ContinuumSettings.load()


def schedule_policy_choices() -> list:
    from sglang.srt.server_args import ServerArgs

    hints = typing.get_type_hints(ServerArgs, include_extras=True)
    return hints["schedule_policy"].__metadata__[0].choices


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, hook, kind in (
        (CACHE_FACTORY, _around_create_cache, HookType.AROUND),
        (INIT_POLICY, _around_init_schedule_policy, HookType.AROUND),
        (RESOLVE_ARGS, _after_resolve, HookType.AFTER),
    ):
        _originals.setdefault(target, _resolve(target))
        HookRegistry.register(target, hook, kind)

    choices = schedule_policy_choices()
    if POLICY_NAME not in choices:
        choices.append(POLICY_NAME)
    logger.debug("sglang-continuum plugin registered")
