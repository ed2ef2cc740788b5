"""Agent workloads: the JSONL program format, generators with the paper's statistics, importers."""

from continuum_lab.workloads.schema import Program, Turn, WorkloadError, dump_workload, load_workload

__all__ = ["Program", "Turn", "WorkloadError", "load_workload", "dump_workload"]
