"""Continuum for SGLang: TTL-pinned agent prefixes and program-level FCFS scheduling.

Layout, one direction of dependency (a package imports only those above it in this list):

* ``core``      -- pure policy logic (no SGLang, no torch); clock injected.
* ``adapter``   -- binds ``core`` to SGLang: the plugin's only touch of ``sglang.srt``; pinned to 0.5.23.
* ``client``    -- helpers for agent clients (OpenAI extra_body, frontend programs, mini-swe-agent).
* ``workloads`` -- agent workloads: schema, generator, trace importers.
* ``harness``   -- starts and drives real SGLang: server launcher, router fleet, in-process scheduler.
* ``bench``     -- workload replay, reports, seeds, policy names.
* ``emulator``  -- SGLang's scheduler in virtual time, forwards timed by a profile.
* ``cli``       -- the command-line tools (``continuum-bench``, ``-profile``, ``-reliability``, ...).
"""

__version__ = "0.1.0"

POLICY_NAME = "continuum"
