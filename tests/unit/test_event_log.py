"""The event log: a log that cannot be written never reaches the scheduler (what it records per
admitted request, read back by the lab: ``tests/lab/test_events.py``)."""

import errno

from sglang_continuum.core.event_log import EventLog
from sglang_continuum.core.metadata import ProgramMeta
from tests.support import controller


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
