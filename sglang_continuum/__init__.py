"""Continuum for SGLang: TTL-pinned agent prefixes and program-level FCFS scheduling.

Layout (one direction of dependency):

* ``sglang_continuum.core``    -- pure policy logic (no SGLang, no torch); clock injected.
* ``sglang_continuum.adapter`` -- the only package that imports ``sglang.srt``; pinned to 0.5.23.
* ``sglang_continuum.client``  -- helpers for agent clients (OpenAI extra_body, frontend programs).
* ``sglang_continuum.tools``   -- benchmark, profiler, tiny model builder.
"""

__version__ = "0.1.0"

POLICY_NAME = "continuum"
