"""The event log the plugin writes (``core/event_log.py``), read back by the lab
(``bench/events.py``, ``bench/attribution.py``)."""

from continuum_lab.bench.attribution import read_log
from continuum_lab.bench.events import read_admission_log, summarize_admissions
from sglang_continuum.core.clock import ManualClock
from sglang_continuum.core.event_log import EventLog
from sglang_continuum.core.metadata import ProgramMeta
from tests.support import controller


def test_records_say_which_requests_waited_and_why(tmp_path):
    clock = ManualClock()
    c, _ = controller(max_overtakes=2, budget=1000, clock=clock)
    log = EventLog(str(tmp_path / "a.jsonl"), max_records=5)
    old = c.turn_arrived(ProgramMeta("old"))
    others = [c.turn_arrived(ProgramMeta(f"n{i}"), waiting_ahead=1 + i) for i in range(3)]
    for i, tag in enumerate(others):
        clock.advance(1.0)
        c.turn_admitted(tag, 10)
        log.admitted(f"r{i}", clock(), c.last_admission)
    clock.advance(1.0)
    c.turn_admitted(old, 10)
    log.admitted("old", clock(), c.last_admission)
    log.attributed("x", "inferred-1", "none")
    c.turn_admitted(c.turn_arrived(ProgramMeta("over")), 10)
    log.admitted("over-the-bound", clock(), c.last_admission)  # a sixth record: past max_records
    log.close()
    (tmp_path / "a.jsonl").open("ab").write(b'{"rid": "trunc')  # a killed server's last line
    records = read_admission_log(tmp_path / "a.jsonl")
    assert [r["rid"] for r in records] == ["r0", "r1", "r2", "old"]
    assert read_log(tmp_path / "a.jsonl") == {"x": ("inferred-1", "none")}
    last = records[-1]
    assert last["overtaken"] == 3 and last["overdue"] and last["wait_s"] == 4.0 and last["turn"] == 1
    s = summarize_admissions(records, slowest=1)
    assert s["requests"] == 4 and s["overdue_share"] == 0.25 and s["max_overtaken"] == 3
    assert s["slowest"][0]["rid"] == "old" and s["max_wait_s"] == 4.0
    assert summarize_admissions([]) == {}
