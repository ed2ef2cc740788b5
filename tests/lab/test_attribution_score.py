from continuum_lab.bench.attribution import read_log, score


def test_precision_and_recall_of_attribution(tmp_path):
    log = {
        "a#0": ("inferred-1", "none"),
        "a#1": ("inferred-1", "inferred"),  # right
        "a#2": ("inferred-5", "none"),  # missed: a new program
        "b#0": ("inferred-2", "none"),
        "b#1": ("inferred-1", "inferred"),  # wrong: merged into a's program
        "c#0": ("inferred-3", "none"),
    }
    s = score([("a", 3), ("b", 2), ("c", 1)], log)
    assert (s["turns_after_first"], s["attributed_right"], s["attributed_to_earlier_program"]) == (3, 1, 2)
    assert s["recall"] == 1 / 3 and s["precision"] == 1 / 2 and s["unlogged_requests"] == 0
    path = tmp_path / "log.jsonl"
    path.write_bytes(
        b'{"event": "attributed", "rid": "a#0", "program_id": "inferred-1", "source": "none"}\n{"rid": "a#1", "progr'
    )
    assert read_log(path) == {"a#0": ("inferred-1", "none")}
