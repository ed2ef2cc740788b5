"""The SGLang adapter: the only package that imports ``sglang.srt`` (pinned to SGLang 0.5.23).

* ``plugin``          -- entry point: adds ``--schedule-policy continuum`` and the hooks.
* ``binding``         -- per-scheduler glue: step clock, arrivals, expiry, stall shedding.
* ``radix_cache``     -- ``ContinuumRadixCache(UnifiedRadixCache)``: pins as tree locks.
* ``schedule_policy`` -- ``ContinuumSchedulePolicy(SchedulePolicy)``: program-FCFS order.
* ``metrics``         -- Prometheus series (``--enable-metrics``).
* ``frontend``        -- ``ContinuumRuntimeEndpoint`` for ``@sgl.function`` programs.

An SGLang upgrade should need changes here and nowhere else.
"""
