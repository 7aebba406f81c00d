"""The order `make test` hands files to its workers (tests/ordering.py): files that mostly wait and files that keep
the CPU busy go out in step, each kind longest first, so the cores are not idle at the start and four workers do
not fight over two cores at the end."""

from __future__ import annotations

from tests import ordering

TIMES = {
    # (wall s, CPU s)
    "waits_60.py": (60.0, 3.0),
    "waits_50.py": (50.0, 2.0),
    "waits_40.py": (40.0, 1.0),
    "busy_30.py": (30.0, 25.0),
    "busy_20.py": (20.0, 15.0),
    "busy_10.py": (10.0, 8.0),
}


def test_waiting_and_busy_files_go_out_in_step_each_longest_first() -> None:
    # Longest first alone: the three waiting files, then the three busy ones.
    assert ordering.file_order(sorted(TIMES), TIMES) == [
        "waits_60.py", "busy_30.py", "waits_50.py", "busy_20.py", "waits_40.py", "busy_10.py"]


def test_a_new_file_is_taken_for_a_short_busy_one_and_nothing_is_lost() -> None:
    files = [*sorted(TIMES), "new.py"]
    order = ordering.file_order(files, TIMES)

    assert sorted(order) == sorted(files)
    assert order[-2:] == ["busy_10.py", "new.py"]


def test_one_kind_only_is_longest_first() -> None:
    busy = {name: times for name, times in TIMES.items() if name.startswith("busy")}

    assert ordering.file_order(sorted(busy), busy) == ["busy_30.py", "busy_20.py", "busy_10.py"]


def test_the_record_reads_back_what_was_written_and_a_bare_number_is_a_busy_files_wall_time(tmp_path) -> None:
    path = tmp_path / "durations.json"
    ordering.write({"a.py": (12.34, 5.67), "b.py": (1.0, 0.0)}, path)
    assert ordering.recorded(path) == {"a.py": (12.3, 5.7), "b.py": (1.0, 0.0)}

    path.write_text('{"old.py": 7.5}')
    assert ordering.recorded(path) == {"old.py": (7.5, 7.5)}
    assert ordering.recorded(tmp_path / "missing.json") == {}
    for odd in ("[]", "null", '{"a": null}', '{"a": [1]}', "{"):  # hand-edited: xdist's own order, not a crash
        path.write_text(odd)
        assert ordering.recorded(path) == {}
