"""Continuum for SGLang: TTL-pinned agent prefixes and program-level FCFS scheduling.

The plugin SGLang loads. Layout, one direction of dependency (a package imports only those above
it in this list):

* ``core``    -- pure policy logic (no SGLang, no torch); clock injected.
* ``adapter`` -- binds ``core`` to SGLang: the plugin's only touch of ``sglang.srt``; pinned to 0.5.23.
* ``client``  -- helpers for agent clients (OpenAI extra_body, frontend programs, mini-swe-agent).

The lab that measures it (workloads, harness, bench, emulator, command-line tools) is the separate
package ``continuum_lab`` under ``lab/``; nothing here imports it.
"""

__version__ = "0.2.0"

POLICY_NAME = "continuum"
