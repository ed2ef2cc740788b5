"""Tools that sit beside the policy: benchmark, replay, profiler, tiny model builder."""
