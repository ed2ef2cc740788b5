"""Entry point (group ``sglang.srt.plugins``): makes ``--schedule-policy continuum`` exist.

SGLang calls ``register()`` in the launcher and first thing in every spawned scheduler,
detokenizer and DP-controller process. It registers hooks that each check the selected
policy when they run, so any other policy leaves SGLang exactly as it was:

* ``create_unified_radix_cache`` (AROUND): builds ``ContinuumRadixCache`` instead of the default.
* ``Scheduler.init_schedule_policy`` (AROUND): installs ``ContinuumSchedulePolicy`` and the
  per-scheduler binding.
* ``ServerArgs.resolve_once`` (AFTER): refuses to start if ``continuum`` was requested but the
  hooks above are not active, the settings are invalid (an unknown key, a ``stats_path`` that
  cannot be written), or a flag selects a mode the binding cannot serve (``modes.py``). SGLang only logs plugin exceptions, so a half-loaded plugin would otherwise surface
  as an obscure error later, or not at all. With a ``stats_path`` it also makes the launcher's
  shutdown stop the scheduler processes with SIGTERM (they save their statistics on it) before
  SGLang's ``kill_process_tree`` SIGKILLs them.

* ``TokenizerManager._validate_one_request`` (BEFORE): rejects out-of-vocabulary token ids with
  a 400 instead of letting them crash the scheduler.
* ``Scheduler.close_session`` (AROUND): ``/close_session`` with a program's id (its
  ``session_id``) ends the program after the fact -- pins and host pins released at once --
  for agents that cannot know in advance which turn is their last.
* ``OpenAIServingBase.handle_request`` (AROUND, in the HTTP process): program metadata sent as
  top-level fields of an OpenAI chat/completions body (``job_id``, ``is_last_step``, ...: the keys
  ``custom_params`` takes), which SGLang's request models drop, is copied into the request's
  ``custom_params`` before SGLang converts it; keys already in ``custom_params`` win.
* ``DataParallelController.maybe_external_dp_rank_routing`` (AROUND): with ``--dp-size N`` every
  turn of a program goes to one DP rank (a stable hash of its id over the active ranks), whatever
  ``--load-balance-method`` says, so its pin is on the rank its next turn reaches. A request
  that names ``routed_dp_rank`` itself, or carries no program id, is dispatched as before.

The ``continuum`` choice is added last, only once everything else registered.
"""

from __future__ import annotations

import logging
import multiprocessing
import pkgutil
import sys
import typing

from sglang_continuum import POLICY_NAME

logger = logging.getLogger(__name__)

CACHE_FACTORY = "sglang.srt.mem_cache.registry.create_unified_radix_cache"
INIT_POLICY = "sglang.srt.managers.scheduler.Scheduler.init_schedule_policy"
RESOLVE_ARGS = "sglang.srt.server_args.ServerArgs.resolve_once"
VALIDATE_REQUEST = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
CLOSE_SESSION = "sglang.srt.managers.scheduler.Scheduler.close_session"
DP_ROUTE = "sglang.srt.managers.data_parallel_controller.DataParallelController.maybe_external_dp_rank_routing"
OPENAI_REQUEST = "sglang.srt.entrypoints.openai.serving_base.OpenAIServingBase.handle_request"

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


def _around_close_session(original, scheduler, recv_req, *args, **kwargs):
    if scheduler.schedule_policy != POLICY_NAME:
        return original(scheduler, recv_req, *args, **kwargs)
    session_id = getattr(recv_req, "session_id", None)
    cache = scheduler.tree_cache
    if isinstance(session_id, str) and getattr(cache, "controller", None) is not None:
        try:
            cache.end_program(session_id)
        except Exception:  # a client's request must never take the scheduler down
            logger.exception("continuum: ending program %r on /close_session failed", session_id[:80])
    if scheduler.enable_session_radix_cache or session_id in scheduler.session_controller:
        return original(scheduler, recv_req, *args, **kwargs)
    return None  # a program id that was never an opened session: SGLang would only warn


def _around_dp_routing(original, controller, req, *args, **kwargs):
    if _policy_of(controller.server_args) == POLICY_NAME and getattr(req, "routed_dp_rank", None) is None:
        try:
            from sglang_continuum.adapter.request import read_program_meta
            from sglang_continuum.core.metadata import MalformedReporter
            from sglang_continuum.core.programs import affine_slot

            meta = read_program_meta(req, MalformedReporter(max_entries=1, log=logger.debug))
            active = [r for r in controller._active_workers if controller.workers[r] is not None]
            if meta.has_program and active:
                req.routed_dp_rank = active[affine_slot(meta.program_id, len(active))]
        except Exception:  # routing falls back to SGLang's own method; dispatch must go on
            logger.exception("continuum: program-affine DP routing failed")
    return original(controller, req, *args, **kwargs)


async def _around_openai_request(original, serving, request, raw_request, *args, **kwargs):
    """Top-level program metadata into ``custom_params`` (chat and text completions only: the
    requests that carry ``custom_params``)."""
    read_json = getattr(raw_request, "json", None)  # None, or a stand-in, off the HTTP path
    if (
        callable(read_json)
        and hasattr(request, "custom_params")
        and _policy_of(serving.tokenizer_manager.server_args) == POLICY_NAME
    ):
        try:
            body = await read_json()  # FastAPI parsed this body already: Starlette keeps the JSON
        except Exception:
            body = None
        try:
            from sglang_continuum.core.metadata import merge_top_level

            merged = merge_top_level(body, request.custom_params, _report_top_level)
            if merged is not None:
                request.custom_params = merged
        except Exception:  # the request is served as SGLang would, without the top-level fields
            logger.exception("continuum: reading top-level request metadata failed")
    return await original(serving, request, raw_request, *args, **kwargs)


def _report_top_level(program_id, problem: str) -> None:
    logger.warning("continuum: ignoring malformed request metadata: %s", problem)


def check_token_ids(manager, obj, input_ids, *args, **kwargs):
    """Reject token ids outside the vocabulary with a 400 (SGLang 0.5.23 otherwise crashes the
    scheduler in the embedding lookup, losing every request in flight)."""
    # only ids the client sent: the server's own tokenizer never produces out-of-vocabulary ids
    if input_ids and getattr(obj, "input_ids", None) is not None and _policy_of(manager.server_args) == POLICY_NAME:
        vocab = manager.model_config.vocab_size
        low, high = min(input_ids), max(input_ids)
        if low < 0 or high >= vocab:
            bad = low if low < 0 else high
            raise ValueError(f"input_ids contains out-of-vocabulary token id {bad}; valid range is [0, {vocab}).")
    return None


def _after_resolve(result, server_args, *args, **kwargs):
    if _policy_of(server_args) == POLICY_NAME:
        from sglang_continuum.adapter.modes import check_supported

        check_supported(server_args)  # in the launcher: a clear refusal before any scheduler starts
        settings = check_active()
        if settings.stats_path and multiprocessing.parent_process() is None:
            _stop_schedulers_gracefully_at_shutdown()
    return result


GRACE_S = 5.0


def _stop_schedulers_gracefully_at_shutdown() -> None:
    """SGLang's launcher SIGKILLs its children at shutdown, so no scheduler could save its tool
    statistics. Wrap ``kill_process_tree`` (in the launcher process only) to SIGTERM the
    children first and give them ``GRACE_S`` to save and exit."""
    from sglang.srt.utils.common import kill_process_tree as original

    if getattr(original, "_continuum_graceful", False):
        return

    def kill_process_tree(parent_pid=None, *args, **kwargs):
        import os
        import signal

        import psutil

        try:
            children = psutil.Process(parent_pid or os.getpid()).children(recursive=True)
            for child in children:
                child.send_signal(signal.SIGTERM)
            psutil.wait_procs(children, timeout=GRACE_S)
        except Exception:  # shutdown must go on whatever happens here
            logger.exception("continuum: graceful scheduler stop failed")
        return original(parent_pid, *args, **kwargs)

    kill_process_tree._continuum_graceful = True
    # every loaded module holds its own reference (launch_server's __main__, sglang serve's CLI,
    # the HTTP server, the engine, ...): rebind each that still points at SGLang's function
    for name, module in list(sys.modules.items()):
        if (name == "__main__" or name.startswith("sglang")) and getattr(module, "kill_process_tree", None) is original:
            module.kill_process_tree = kill_process_tree


def _resolve(target: str):
    return pkgutil.resolve_name(target)


def check_active():
    """Raise ``ContinuumPluginError`` unless every Continuum hook is applied in this process;
    return the validated settings."""
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

    return ContinuumSettings.load()


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
        (VALIDATE_REQUEST, check_token_ids, HookType.BEFORE),
        (CLOSE_SESSION, _around_close_session, HookType.AROUND),
        (DP_ROUTE, _around_dp_routing, HookType.AROUND),
        (OPENAI_REQUEST, _around_openai_request, HookType.AROUND),
    ):
        _originals.setdefault(target, _resolve(target))
        HookRegistry.register(target, hook, kind)

    choices = schedule_policy_choices()
    if POLICY_NAME not in choices:
        choices.append(POLICY_NAME)
    logger.debug("sglang-continuum plugin registered")
