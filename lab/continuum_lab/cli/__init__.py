"""The command-line tools, one module per console script (``pyproject.toml``): the top of the
house; nothing imports from here.

* ``bench``      -- ``continuum-bench``: replay a workload against servers (or ``--emulate``), compare policies.
* ``demo``       -- the main job's summary (``scripts/demo.sh``).
* ``profiler``   -- ``continuum-profile``: a server's step latencies into a profile.
* ``overhead``   -- ``continuum-overhead``: the scheduler's per-step cost.
* ``reliability``-- ``continuum-reliability``: the probes against real servers, one module each.
* ``agents``     -- ``continuum-agents``: real mini-swe-agent programs against a server.
* ``gpu_bundle`` -- ``continuum-gpu``: the bundle for a lent GPU machine.
* ``profile_gpu_torch``, ``profile_from_aiconfigurator`` -- GPU step profiles (on a GPU / offline).
* ``analyze_tool_classes``, ``ttl_example`` -- small studies of the TTL model's inputs.
"""
