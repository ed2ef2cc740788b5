"""The event log: what the controller records per admitted request, written and read back; a
log that cannot be written never reaches the scheduler."""

import errno

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


def test_an_unwritable_path_turns_the_log_off_and_serving_goes_on(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    log = EventLog(str(blocker / "sub" / "a.jsonl"))  # a parent that is a file
    log.admitted("r", 0.0, None)  # ignored, no exception
    log.flush()
    log.close()
    nested = EventLog(str(tmp_path / "new" / "dir" / "a.jsonl"))  # missing parents are made
    nested.close()
    assert (tmp_path / "new" / "dir" / "a.jsonl").is_file()


class FullDisk:
    """A file whose writes and flushes fail as on a full disk."""

    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self):
        raise OSError(errno.ENOSPC, "No space left on device")

    def close(self):
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_turns_the_log_off_instead_of_raising(tmp_path):
    c, _ = controller()
    c.turn_admitted(c.turn_arrived(ProgramMeta("p")), 10)
    log = EventLog(str(tmp_path / "a.jsonl"))
    log._file.close()
    log._file = FullDisk()
    log.admitted("r", 0.0, c.last_admission)  # would raise into the scheduler loop before
    assert log._file is None and log.written == 0
    log.attributed("r2", "p", "inferred")  # off: nothing more is tried
    log.flush()
    log.close()
    log._file = FullDisk()
    log.flush()
    assert log._file is None
