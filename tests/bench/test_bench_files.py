"""Benchmark files: matrices read safely (bounded size, bounded YAML aliases, typed fields), results written
whole (a full disk leaves no torn line), torn lines from killed runs reported, FIFOs refused at once."""
from __future__ import annotations

import os

import pytest

import hilbert_lab.io as hio
from hilbert_lab.bench import SafeBenchmarkRunner, expand_matrix, load_matrix_file, normalize_case, read_results

class _OsWith:
    """The os module with some functions replaced, for one module's view of it."""

    def __init__(self, **replaced):
        self.__dict__.update(replaced)

    def __getattr__(self, name):
        return getattr(os, name)



def _laughs(levels: int) -> str:
    """A YAML matrix whose base value nests `levels` levels of nine aliases each (9**levels strings)."""
    lines = ["base:", "  kind: selftest", "  value:", '    - &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, levels):
        lines.append(f"    - &a{level} [" + ",".join([f"*a{level - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.timeout(60)  # "at once": what it must not do runs for ever; a busy machine is slow to import
def test_nested_aliases_are_refused_quickly_and_plain_anchors_still_work(tmp_path):
    bomb = tmp_path / "laughs.yaml"
    bomb.write_text(_laughs(9))  # 9**9 values once expanded: the expansion used to hang `bench --dry-run`
    with pytest.raises(ValueError, match=f"matrix file '{bomb}': its YAML aliases expand to more than"):
        load_matrix_file(str(bomb))
    loop = tmp_path / "loop.yaml"
    loop.write_text("base: &a [*a]\n")
    with pytest.raises(ValueError, match="alias refers to the value that contains it"):
        load_matrix_file(str(loop))
    good = tmp_path / "anchors.yaml"
    good.write_text("base: &b {kind: selftest}\ncases:\n  - {<<: *b, value: 1}\n  - {<<: *b, value: 2}\n")
    assert [case["value"] for case in load_matrix_file(str(good))] == [1, 2]


@pytest.mark.timeout(60)  # "at once": what it must not do runs for ever; a busy machine is slow to import
def test_a_matrix_file_that_is_not_a_small_regular_file_is_refused_at_once(tmp_path):
    fifo = tmp_path / "matrix.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="FIFO"):
        load_matrix_file(str(fifo))
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * (2 << 20) + "\n")
    with pytest.raises(ValueError, match="bytes, more than the 1048576 allowed"):
        load_matrix_file(str(big))
    os.symlink("/dev/zero", tmp_path / "zero.yaml")
    with pytest.raises(ValueError, match="character device"):
        load_matrix_file(str(tmp_path / "zero.yaml"))


@pytest.mark.parametrize("fields, needle", [
    ({"kind": "selftest", "seconds": -1}, "seconds must be a number of seconds in"),
    ({"kind": "selftest", "seconds": "1"}, "seconds must be"),
    ({"kind": "selftest", "seconds": float("inf")}, "seconds must be"),
    ({"kind": "selftest", "bytes_per_token": 2 ** 70}, "bytes_per_token must be an integer in"),
    ({"kind": "selftest", "bytes_per_token": -1}, "bytes_per_token"),
    ({"kind": "selftest", "seq_len": 2 ** 70}, "seq_len"),
    ({"kind": "selftest", "fail_above": "x"}, "fail_above"),
    ({"kind": "selftest", "value": {"nested": 1}}, "value"),
    ({"seq_len": 256, "repeats": 10 ** 9}, "repeats must be an integer in"),
    ({"seq_len": 256, "warmup": 10 ** 9}, "warmup"),
    ({"seq_len": 256, "threads": "abc"}, "threads"),
    ({"seq_len": 256, "threads": 0}, "threads"),
], ids=lambda value: str(value)[:40])
def test_matrix_fields_of_the_wrong_type_or_range_are_refused(fields, needle):
    with pytest.raises(ValueError, match=needle):
        normalize_case(fields)


def test_a_matrix_that_expands_to_too_many_cases_is_refused_before_expanding():
    with pytest.raises(ValueError, match="expands to 200000 cases, more than the 100000 allowed"):
        expand_matrix({"kind": "selftest"}, {"value": list(range(500)), "seq_len": list(range(1, 401))})


def test_a_full_disk_leaves_no_torn_line_and_the_next_run_resumes(tmp_path, monkeypatch):
    path = tmp_path / "r.jsonl"
    cases = expand_matrix({"kind": "selftest"}, {"value": [1, 2]})
    SafeBenchmarkRunner(str(path), progress=False).run(cases[:1])
    before = path.read_bytes()
    real_write = os.write

    def fill_up(descriptor, data):  # the disk fills part way through the record
        real_write(descriptor, bytes(data[:10]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hio, "os", _OsWith(write=fill_up))  # only hilbert_lab.io sees the failing write
    with pytest.raises(OSError, match="No space left on device; the record of case .* was not written and the "
                                      "file is as before it"):
        SafeBenchmarkRunner(str(path), progress=False).run(cases)
    monkeypatch.undo()
    assert path.read_bytes() == before
    summary = SafeBenchmarkRunner(str(path), progress=False).run(cases)
    assert (summary.completed, summary.skipped, summary.torn) == (1, 1, 0)
    assert read_results(str(path))[1] == 0


def test_torn_lines_left_by_a_killed_run_are_reported(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"case_id": "0123abcd", "sta')
    summary = SafeBenchmarkRunner(str(path), progress=False).run(expand_matrix({"kind": "selftest"}, {"value": [1]}))
    assert summary.torn == 1 and "1 torn line(s) from an interrupted run skipped" in summary.line()


@pytest.mark.timeout(60)  # "at once": what it must not do runs for ever; a busy machine is slow to import
def test_a_results_path_that_is_a_fifo_is_refused_at_once(tmp_path):
    fifo = tmp_path / "r.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="FIFO"):
        SafeBenchmarkRunner(str(fifo), progress=False)


@pytest.mark.parametrize("line, message", [
    ('{"case_id": ["a", "b"], "status": "ok"}', 'line 3: case_id must be a string, got ["a", "b"]'),
    ('{"case_id": {"a": 1}, "status": "ok"}', 'line 3: case_id must be a string, got {"a": 1}'),
    ('{"case_id": "0123abcd", "status": null}', "line 3: status must be a string, got null"),
])
def test_a_record_whose_case_id_or_status_is_not_a_string_is_refused_naming_the_line(tmp_path, line, message):
    path = tmp_path / "r.jsonl"
    path.write_text('{"case_id": "0123abcd", "status": "ok"}\n\n' + line + "\n")
    before = path.read_bytes()
    for read in (lambda: read_results(str(path)), lambda: SafeBenchmarkRunner(str(path), progress=False)):
        with pytest.raises(ValueError) as error:
            read()
        assert str(error.value).startswith(f"results file {str(path)!r} {message}; the line was not written by the "
                                           "benchmark runner"), str(error.value)
    assert path.read_bytes() == before
