"""``continuum-reliability``: the reliability suite (issue 14): probe a live ``--schedule-policy continuum`` server as a skeptical
operator would, with bounded traffic on 127.0.0.1 only, one server at a time.

Probes (``--probes`` selects, in this order by default):

* ``bad_metadata``: malformed ``custom_params`` / ``session_id`` (wrong types, huge strings,
  control characters, nesting, non-object params) through ``/generate``, ``/v1/completions`` and
  ``/v1/chat/completions``: every answer must be a 200 or a clear 4xx, never a dead server; a
  program id carrying ``\\nFAKE LOG LINE`` must not forge a log line; malformed metadata is logged
  once per program and problem.
* ``oov_tokens``: out-of-vocabulary token ids (``[999999]``, ``[-1, 5]``, ...) must get a 4xx and
  leave the server alive (continuum, and fcfs unless ``--quick``).
* ``flush_cache``: live pins (fixed 60 s TTL) then ``/flush_cache``: pins and pool empty, every pin
  accounted for (created == hits + expiries + sheds + releases + flushed + live), the programs'
  next turns served.
* ``abort_storm``: many concurrent programs that time out client-side, close streams early, are
  aborted explicitly, or never send a last step: pins, pool and tracked programs back to empty.
* ``sigkill_restart``: SIGKILL the process group under load with a stats file saved every second;
  the file is valid every time and is loaded on restart.
* ``bad_stats``: a stats path that is a directory or unwritable, files of the wrong shape,
  truncated JSON, a save failing at run time; statistics saved at SIGTERM.
* ``many_programs``: many distinct program ids; scheduler RSS growth against an fcfs server; tracked
  programs back to 0 after the idle timeout.
* ``pressure``: 30 programs x 9 turns overflowing a 4,096-token pool, fcfs then continuum: failed
  requests, median and slowest request (target: 0 failed, slowest <= 1.5x fcfs's, median no worse).
  One run proves little (the same code's slowest ratio spans 1.4-2.3 on a quiet machine):
  ``--pressure-seeds 0,1,2,3,4`` runs fcfs then continuum per seed on fresh servers and judges the
  targets on the median over seeds, every seed shown and the worst named.

* ``hostile`` (only when named, its own page ``docs/results/hostile-traffic/``): each hostile
  traffic pattern (identical id-less prompts, distinct ids, held first turns, a client ending
  others' programs with ids scoped by a tenant header and without, tiny programs, a hostile stats
  peer, malformed metadata at rate) beside honest agent programs, on a continuum server and on a
  stock fcfs server (the reference); their throughput and cached share against a baseline
  without the attack, continuum's ratio over fcfs's, what they lost, the server's health
  (``continuum_lab.cli.reliability.hostile``).

"Pool empty" is read live from the scheduler (``/v1/loads``: tokens neither free nor evictable),
never after a ``/flush_cache`` (a flush frees every slot whatever holds it, so it would hide a
leak) and not from ``sglang:num_used_tokens`` (refreshed per batch, or every 30 s when idle).

Each probe reports sent / failed / healthy after / pins empty / pool empty / max wait / server died
into ``OUT/report.json`` and ``OUT/report.md``; server logs and stats files go to ``--logs`` (default:
a new folder under the temp dir, named in the report).

    continuum-reliability --out docs/results/reliability              # the full suite (~15 min, 2 cores)
    continuum-reliability --quick --probes bad_metadata,oov_tokens --out /tmp/rel
    continuum-reliability --probes hostile --out /tmp/hostile-run  # ~30 min; docs/results/hostile-traffic/
"""

from continuum_lab.cli.reliability.common import SHORT_ENV, Ctx, E, ProbeResult
from continuum_lab.cli.reliability.driver import PROBES, main, make_ctx, run_probe, write_report

__all__ = ["E", "PROBES", "SHORT_ENV", "Ctx", "ProbeResult", "main", "make_ctx", "run_probe", "write_report"]
