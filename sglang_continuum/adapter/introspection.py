"""The live view over SGLang's own ``GET /server_info``: no route of the plugin's.

``/server_info`` (and its deprecated alias ``/get_server_info``) asks every scheduler for its
``get_internal_state`` (a ``GetInternalStateReq`` fanned out to each data-parallel rank; the
tokenizer manager gathers one ``GetInternalStateReqOutput.internal_state`` dict per rank into
``internal_states``). Under ``--schedule-policy continuum`` the hook below adds the controller's
live view (``core/snapshot.py``) to that dict under ``"continuum"``, built on the scheduler's own
thread while it answers control requests: the controller is read between two steps, never while
one runs. Nothing is built unless asked; any other policy's dict is SGLang's, untouched.

A failure to build the view never reaches SGLang's loop: it is logged once (then at debug) and
the dict goes back without the key.
"""

from __future__ import annotations

import logging

from sglang_continuum import POLICY_NAME

logger = logging.getLogger(__name__)

STATE_KEY = "continuum"  # the key of the live view in each rank's internal state
_failures = 0  # views that could not be built in this process (the first is logged in full)


def around_get_internal_state(original, scheduler, *args, **kwargs):
    """AROUND ``Scheduler.get_internal_state``: SGLang's reply, with the live view under ``STATE_KEY``."""
    result = original(scheduler, *args, **kwargs)
    if getattr(scheduler, "schedule_policy", None) != POLICY_NAME:
        return result
    try:
        view = scheduler_view(scheduler)
        result.internal_state[STATE_KEY] = view
    except Exception:  # the operator's view must never cost the server its answer
        global _failures
        _failures += 1
        log = logger.exception if _failures == 1 else logger.debug
        log("continuum: building the live view for /server_info failed (%d so far); answered without it", _failures)
    return result


def scheduler_view(scheduler) -> dict:
    """The live view of ``scheduler``'s controller, with the turns its waiting queue holds and its ranks."""
    from sglang.srt.runtime_context import get_parallel

    from sglang_continuum.adapter.request import get_tag
    from sglang_continuum.core.snapshot import live_view

    cache = scheduler.tree_cache
    waiting = [tag for tag in map(get_tag, scheduler.waiting_queue) if tag is not None]
    view = live_view(
        cache.controller,
        waiting=waiting,
        now=cache.step_clock.read_source(),  # now, not the last step's time: the server may be idle
        pool_tokens=int(cache.token_to_kv_pool_allocator.size),
        capacity_tokens=cache.admission_capacity_tokens(),
    )
    view["server"]["dp_rank"] = get_parallel().dp_rank or 0  # as the scheduler reads its own
    view["server"]["tp_rank"] = cache.ranks.tp_rank
    return view
