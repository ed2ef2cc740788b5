"""The SGLang adapter: the plugin's only package that imports ``sglang.srt`` (pinned to SGLang 0.5.23).

* ``plugin``          -- entry point: adds ``--schedule-policy continuum`` and the hooks.
* ``modes``           -- the SGLang modes the binding cannot serve, refused at start-up.
* ``binding``         -- ``SchedulerBinding``: per-scheduler glue, one method per wrapped hook; the
                         composition root (it starts the runtime).
* ``runtime``         -- ``ContinuumRuntime``: the services beside the cache (statistics saved and
                         shared, event log, prefix inference, metrics).
* ``lifecycle``       -- SGLang's live requests as the plugin sees them: the one record of turns in flight.
* ``radix_cache``     -- ``ContinuumRadixCache(UnifiedRadixCache)``: pins as tree locks; the request
                         lifecycle's hooks.
* ``host_tier``       -- HiCache as Continuum uses it: back up, host-lock, reload cost.
* ``schedule_policy`` -- ``ContinuumSchedulePolicy(SchedulePolicy)``: the waiting queue's order.
* ``inference``       -- program identity from the prefix for requests with no id.
* ``introspection``   -- the live view of programs in SGLang's ``/server_info`` (``continuum-top`` reads it).
* ``request``, ``tool_identifier``, ``metrics`` -- reading ``Req``, naming a turn's tool, Prometheus series.

An SGLang upgrade should need changes here and nowhere else (``README.md`` lists every symbol used).
"""
