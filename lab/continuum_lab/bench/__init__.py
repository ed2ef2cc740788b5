"""``continuum-bench``: replay agent workloads against live servers and compare policies."""
