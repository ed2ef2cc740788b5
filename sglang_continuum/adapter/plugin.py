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
* ``TokenizerManager.generate_request`` (BEFORE, in the HTTP process): every generation request
  (native ``/generate``, the OpenAI endpoints, the gRPC bridge, the Python engine) carries the
  sender's program scope in ``custom_params[metadata.SCOPE_KEY]`` -- with ``program_scope_header``,
  a hash of that header's value; otherwise none -- overwriting or removing whatever the client put
  under that key, so no client can send a scope it was not given.
* ``TokenizerManager.close_session`` (BEFORE, in the HTTP process) and ``Scheduler.close_session``
  (AROUND): ``/close_session`` with a program's id (its ``session_id``) ends the program after the
  fact -- pins and host pins released at once -- for agents that cannot know in advance which turn
  is their last; only the sender's own program (its scope travels in the session id,
  ``metadata.close_session_id``), never an inferred one.
* ``Scheduler._abort_on_queued_limit`` (AROUND): with ``--max-queued-requests``, first turns the
  door holds are counted apart: a later turn of an admitted program is refused only when the
  queue is full without them (so the queue holds at most twice the limit).
* ``OpenAIServingBase.handle_request`` (AROUND, in the HTTP process): program metadata sent as
  top-level fields of an OpenAI chat/completions body (``job_id``, ``is_last_step``, ...: the keys
  ``custom_params`` takes), which SGLang's request models drop, is copied into the request's
  ``custom_params`` before SGLang converts it; keys already in ``custom_params`` win.
* ``AnthropicServing.handle_messages`` and ``._convert_to_chat_completion_request`` (AROUND, in the
  HTTP process): ``/v1/messages`` (Claude Code's API) gets its program metadata from Claude Code's
  session and the request's ``metadata``, and loses Claude Code's per-request attribution block
  (``anthropic.py``).
* ``Scheduler.get_internal_state`` (AROUND): the reply to ``GET /server_info`` carries each
  scheduler's live view of its programs under ``"continuum"`` (``introspection.py``), built only
  when asked.
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
QUEUED_LIMIT = "sglang.srt.managers.scheduler.Scheduler._abort_on_queued_limit"
SCOPE_GENERATE = "sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request"
SCOPE_CLOSE = "sglang.srt.managers.tokenizer_manager.TokenizerManager.close_session"
DP_ROUTE = "sglang.srt.managers.data_parallel_controller.DataParallelController.maybe_external_dp_rank_routing"
OPENAI_REQUEST = "sglang.srt.entrypoints.openai.serving_base.OpenAIServingBase.handle_request"
INTERNAL_STATE = "sglang.srt.managers.scheduler.Scheduler.get_internal_state"

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
    from sglang_continuum.core.metadata import read_close_session

    # the HTTP process may have wrapped the id to carry the sender's scope: SGLang gets its own back
    session_id, program_id = read_close_session(getattr(recv_req, "session_id", None))
    if session_id is not getattr(recv_req, "session_id", None):
        recv_req.session_id = session_id
    cache = scheduler.tree_cache
    if program_id is not None and getattr(cache, "controller", None) is not None:
        try:
            cache.end_program(program_id)
        except Exception:  # a client's request must never take the scheduler down
            logger.exception("continuum: ending program %r on /close_session failed", program_id[:80])
    if scheduler.enable_session_radix_cache or session_id in scheduler.session_controller:
        return original(scheduler, recv_req, *args, **kwargs)
    return None  # a program id that was never an opened session: SGLang would only warn


def _around_queued_limit(original, scheduler, recv_req, *args, **kwargs):
    """SGLang refuses an arrival when its waiting queue is at ``--max-queued-requests``. First
    turns the door holds are part of that queue, and would make it refuse the later turns of
    admitted programs, the turns the door holds them for: those are refused only when the queue
    is full without the held first turns (which still count for every other arrival)."""
    if scheduler.schedule_policy == POLICY_NAME and scheduler.max_queued_requests is not None:
        try:
            if _return_fits_beside_held_first_turns(scheduler, recv_req):
                return False
        except Exception:  # SGLang's own limit applies
            logger.exception("continuum: counting held first turns apart from the queue limit failed")
    return original(scheduler, recv_req, *args, **kwargs)


def _return_fits_beside_held_first_turns(scheduler, req) -> bool:
    queue = scheduler.waiting_queue
    if len(queue) + 1 <= scheduler.max_queued_requests:
        return False  # SGLang takes it anyway
    controller = getattr(scheduler.tree_cache, "controller", None)
    if controller is None:
        return False
    from sglang_continuum.adapter.request import get_tag, read_program_meta

    tag = get_tag(req)  # a retracted turn is re-queued with its tag
    if tag is not None:
        returning = tag.meta.has_program and not tag.new_program
    else:
        meta = read_program_meta(req, scheduler.tree_cache.report_malformed)
        state = controller.programs.get(meta.program_id) if meta.has_program else None
        returning = state is not None and (state.turns_admitted > 0 or state.turns_finished > 0)
    if not returning:
        return False
    held = 0
    for waiting in queue:  # only while the queue is full: at most the limit
        waiting_tag = get_tag(waiting)
        held += waiting_tag is not None and waiting_tag.held_back and waiting_tag.new_program
    return len(queue) - held + 1 <= scheduler.max_queued_requests


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


def _around_internal_state(original, scheduler, *args, **kwargs):
    from sglang_continuum.adapter.introspection import around_get_internal_state  # loaded when first asked

    return around_get_internal_state(original, scheduler, *args, **kwargs)


async def _around_openai_request(original, serving, request, raw_request, *args, **kwargs):
    """Top-level program metadata into ``custom_params`` (chat and text completions only: the
    requests that carry ``custom_params``). The sender's scope is added later, on every path, by
    ``scope_generate_request``."""
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


_top_level_reporter = None


def _report_top_level(program_id, problem: str) -> None:
    global _top_level_reporter
    if _top_level_reporter is None:  # rate-bounded, as the scheduler's reports are
        from sglang_continuum.core.metadata import MalformedReporter

        _top_level_reporter = MalformedReporter()
    _top_level_reporter(program_id, problem)


_UNREAD = object()
_scope_header = _UNREAD  # ``program_scope_header``, read once per process


def _scope_header_name():
    global _scope_header
    if _scope_header is _UNREAD:
        from sglang_continuum.core.settings import ContinuumSettings

        _scope_header = ContinuumSettings.load().program_scope_header
    return _scope_header


def request_scope(request):
    """The sender's scope: a hash of its ``program_scope_header`` value; None without the setting,
    the header, or an HTTP request (the Python engine)."""
    name = _scope_header_name()
    headers = getattr(request, "headers", None)
    if name is None or headers is None:
        return None
    value = headers.get(name)
    if not isinstance(value, str) or not value.strip():
        return None
    from sglang_continuum.core.metadata import scope_of

    return scope_of(value.strip())


def _scope_sampling_params(params, scope) -> None:
    """Write ``scope`` into one request's sampling params' ``custom_params`` (a new dict: the
    client's may be shared), or remove a scope the client sent when it has none."""
    from sglang_continuum.core.metadata import SCOPE_KEY

    custom = params.get("custom_params")
    if scope is None:
        if isinstance(custom, dict) and SCOPE_KEY in custom:
            params["custom_params"] = {k: v for k, v in custom.items() if k != SCOPE_KEY}
    elif custom is None or isinstance(custom, dict):
        params["custom_params"] = {**(custom or {}), SCOPE_KEY: scope}
    # any other custom_params is SGLang's to refuse and the metadata reader's to report


def scope_generate_request(manager, obj, request=None, *args, **kwargs):
    """BEFORE ``TokenizerManager.generate_request``: every generation path passes here, so a scope
    in ``custom_params`` is always the one this process derived, never the client's."""
    if _policy_of(manager.server_args) != POLICY_NAME:
        return None
    try:
        scope = request_scope(request)
    except Exception:  # served unscoped, but never under a scope the client sent
        logger.exception("continuum: reading the request's program scope failed")
        scope = None
    try:
        sampling = getattr(obj, "sampling_params", None)
        if sampling is None and scope is not None:
            obj.sampling_params = sampling = {}
        for params in sampling if isinstance(sampling, list) else (sampling,):
            if isinstance(params, dict):
                _scope_sampling_params(params, scope)
    except Exception:
        logger.exception("continuum: scoping the request's program id failed")
    return None


def scope_close_session(manager, obj, request=None, *args, **kwargs):
    """BEFORE ``TokenizerManager.close_session``: the sender's scope travels in the session id
    (``CloseSessionReqInput`` has no other field that reaches the scheduler)."""
    if _policy_of(manager.server_args) != POLICY_NAME:
        return None
    try:
        from sglang_continuum.core.metadata import close_session_id

        obj.session_id = close_session_id(obj.session_id, request_scope(request))
    except Exception:
        logger.exception("continuum: scoping /close_session failed")
    return None


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
        if settings.program_scope_header and (getattr(server_args, "tokenizer_worker_num", 1) or 1) > 1:
            raise ContinuumPluginError(
                "program_scope_header needs --tokenizer-worker-num 1: SGLang's extra tokenizer "
                "workers load no plugin, so their requests would carry no scope (and a client's own)"
            )
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


SGLANG_VERSION = "0.5.23"  # the one SGLang whose internals this adapter binds (adapter/README.md)


def installed_sglang_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("sglang")


def check_active():
    """Raise ``ContinuumPluginError`` unless SGLang is the version this adapter binds and every
    Continuum hook is applied in this process; return the validated settings."""
    version = installed_sglang_version()
    if version != SGLANG_VERSION:
        # hooks may still apply on another version and bind internals that changed meaning
        raise ContinuumPluginError(
            f"--schedule-policy continuum needs sglang=={SGLANG_VERSION}; sglang {version} is installed. "
            f'Install it (pip install "sglang=={SGLANG_VERSION}") or serve with another --schedule-policy.'
        )
    missing = [t for t, orig in _originals.items() if _resolve(t) is orig]
    if not _originals or missing:
        raise ContinuumPluginError(
            "--schedule-policy continuum was requested but the sglang-continuum plugin is not "
            f"active (hooks not applied: {missing or 'plugin not registered'}). Check the log for "
            "'Failed to load plugin' / 'Failed to apply hooks', that SGLANG_PLUGINS (if set) "
            "includes 'continuum'."
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

    from sglang_continuum.adapter import anthropic

    for target, hook, kind in (
        (CACHE_FACTORY, _around_create_cache, HookType.AROUND),
        (INIT_POLICY, _around_init_schedule_policy, HookType.AROUND),
        (RESOLVE_ARGS, _after_resolve, HookType.AFTER),
        (VALIDATE_REQUEST, check_token_ids, HookType.BEFORE),
        (CLOSE_SESSION, _around_close_session, HookType.AROUND),
        (QUEUED_LIMIT, _around_queued_limit, HookType.AROUND),
        (SCOPE_GENERATE, scope_generate_request, HookType.BEFORE),
        (SCOPE_CLOSE, scope_close_session, HookType.BEFORE),
        (DP_ROUTE, _around_dp_routing, HookType.AROUND),
        (OPENAI_REQUEST, _around_openai_request, HookType.AROUND),
        (INTERNAL_STATE, _around_internal_state, HookType.AROUND),
        (anthropic.HANDLE_MESSAGES, anthropic.around_handle_messages, HookType.AROUND),
        (anthropic.CONVERT_MESSAGES, anthropic.around_convert, HookType.AROUND),
    ):
        _originals.setdefault(target, _resolve(target))
        HookRegistry.register(target, hook, kind)

    choices = schedule_policy_choices()
    if POLICY_NAME not in choices:
        choices.append(POLICY_NAME)
    logger.debug("sglang-continuum plugin registered")
