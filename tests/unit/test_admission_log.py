"""Per-request admission records: what the controller records, written and read back."""

from sglang_continuum.core.admission_log import AdmissionLog, read_admission_log, summarize_admissions
from sglang_continuum.core.clock import ManualClock
from sglang_continuum.core.controller import ContinuumController
from sglang_continuum.core.metadata import ProgramMeta
from sglang_continuum.core.settings import ContinuumSettings


def test_records_say_which_requests_waited_and_why(tmp_path):
    clock = ManualClock()
    c = ContinuumController(ContinuumSettings(ttl_model="fixed", max_overtakes=2), clock=clock, budget_tokens=1000)
    log = AdmissionLog(str(tmp_path / "a.jsonl"), max_records=4)
    old = c.turn_arrived(ProgramMeta("old"))
    others = [c.turn_arrived(ProgramMeta(f"n{i}"), waiting_ahead=1 + i) for i in range(3)]
    for i, tag in enumerate(others):
        clock.advance(1.0)
        c.turn_admitted(tag, 10)
        log.write(f"r{i}", clock(), c.last_admission)
    clock.advance(1.0)
    c.turn_admitted(old, 10)
    log.write("old", clock(), c.last_admission)
    c.turn_admitted(c.turn_arrived(ProgramMeta("over")), 10)
    log.write("over-the-bound", clock(), c.last_admission)  # a fifth record: past max_records
    log.close()
    (tmp_path / "a.jsonl").open("ab").write(b'{"rid": "trunc')  # a killed server's last line
    records = read_admission_log(tmp_path / "a.jsonl")
    assert [r["rid"] for r in records] == ["r0", "r1", "r2", "old"]
    last = records[-1]
    assert last["overtaken"] == 3 and last["overdue"] and last["wait_s"] == 4.0 and last["turn"] == 1
    s = summarize_admissions(records, slowest=1)
    assert s["requests"] == 4 and s["overdue_share"] == 0.25 and s["max_overtaken"] == 3
    assert s["slowest"][0]["rid"] == "old" and s["max_wait_s"] == 4.0
    assert summarize_admissions([]) == {}


def test_an_unwritable_path_turns_the_log_off_and_serving_goes_on(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    log = AdmissionLog(str(blocker / "sub" / "a.jsonl"))  # a parent that is a file
    log.write("r", 0.0, None)  # ignored, no exception
    log.flush()
    log.close()
    nested = AdmissionLog(str(tmp_path / "new" / "dir" / "a.jsonl"))  # missing parents are made
    nested.close()
    assert (tmp_path / "new" / "dir" / "a.jsonl").is_file()
