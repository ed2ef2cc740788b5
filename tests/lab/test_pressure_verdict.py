"""The starvation probe's verdict over seeds (``continuum-reliability --probes pressure
--pressure-seeds ...``): judged on the median over seeds, every seed's failures counted."""

from dataclasses import asdict

from continuum_lab.bench.events import summarize_admissions
from continuum_lab.cli.reliability.pressure import _admissions_note, judge_seeds
from sglang_continuum.core.turns import AdmissionRecord


def seed_run(seed: int, c_max: float, f_max: float, c_p50: float = 0.2, f_p50: float = 0.2, failed: int = 0) -> dict:
    def run(mx: float, p50: float, failed: int = 0) -> dict:
        return {"max_latency_incl_failed_s": mx, "p50_s": p50, "failed": failed, "not_sent": 0, "timeouts": 0}

    return {
        "seed": seed,
        "fcfs": run(f_max, f_p50),
        "continuum": run(c_max, c_p50, failed),
        "slowest_ratio": round(c_max / f_max, 2),
        "median_ratio": round(c_p50 / f_p50, 2),
    }


def test_one_bad_seed_does_not_decide_but_is_named_as_the_worst():
    runs = [seed_run(0, 2.26, 1.0), seed_run(1, 1.4, 1.0), seed_run(2, 1.2, 1.0)]
    verdict, problems = judge_seeds(runs, median_tolerance=1.05)
    assert problems == []
    assert verdict["slowest_ratio"] == 1.4 and verdict["slowest_ratio_worst"] == 2.26
    assert verdict["slowest_ratio_per_seed"] == [2.26, 1.4, 1.2]


def test_a_slow_median_over_seeds_is_a_problem():
    runs = [seed_run(0, 2.0, 1.0), seed_run(1, 1.6, 1.0), seed_run(2, 1.2, 1.0)]
    verdict, problems = judge_seeds(runs, median_tolerance=1.05)
    assert verdict["slowest_ratio"] == 1.6
    assert len(problems) == 1 and "median over seeds" in problems[0] and "1.6 > 1.5" in problems[0]


def test_a_failed_request_on_any_seed_is_a_problem_whatever_the_medians():
    runs = [seed_run(0, 1.0, 1.0), seed_run(1, 1.0, 1.0, failed=1), seed_run(2, 1.0, 1.0)]
    _, problems = judge_seeds(runs, median_tolerance=1.05)
    assert problems == ["seed 1: continuum: 1 failed (0 client timeouts), 0 never sent"]


def test_a_slower_median_counts_only_beyond_a_tenth_of_a_second():
    near = [seed_run(s, 1.0, 1.0, c_p50=0.25, f_p50=0.2) for s in range(3)]  # 1.25x but 50 ms
    assert judge_seeds(near, median_tolerance=1.05)[1] == []
    far = [seed_run(s, 1.0, 1.0, c_p50=0.5, f_p50=0.3) for s in range(3)]
    (problem,) = judge_seeds(far, median_tolerance=1.05)[1]
    assert "median / fcfs's = 1.67 > 1.05" in problem


def test_the_note_reads_the_admission_records_the_controller_writes():
    # the probe wrote its figures and then failed on a field the records no longer carry
    records = [
        {
            "rid": f"r{i}",
            "t": float(i),
            **asdict(AdmissionRecord(f"p{i}", i + 1, 0.5 * i, 1.25 * i, 2, i > 1, i == 0, False)),
        }
        for i in range(3)
    ]
    note = _admissions_note(summarize_admissions(records, slowest=2))
    assert "p2 turn 3: waited 1.00s, overtaken 2.5 (budget 2), overdue" in note
