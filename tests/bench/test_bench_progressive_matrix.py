"""ProgressiveTester (doubling, bisecting, stop reasons) and benchmark matrices."""
from __future__ import annotations

import pytest

from hilbert_lab.bench import ProgressiveTester, expand_matrix, load_matrix_file, normalize_case
from hilbert_lab.bench.config import SafetyConfig


def test_probe_doubles_then_bisects_to_the_failure_threshold():
    tester = ProgressiveTester({"kind": "selftest", "fail_above": 5000, "bytes_per_token": 8},
                               start_len=1024, multiple_of=256, bisect_steps=3, progress=False)
    report = tester.run()
    lengths = [(s.seq_len, s.passed) for s in report.steps]
    assert lengths == [(1024, True), (2048, True), (4096, True), (8192, False),
                       (6144, False), (5120, False), (4608, True)]
    assert report.largest_passing_len == 4608
    assert report.stopped_by == "oom" and "8192" in report.stop_detail
    assert report.measured_peak_bytes == 8 * 4608  # the selftest reports bytes_per_token * seq_len


def test_probe_stops_on_the_estimate_before_running():
    # 1 GiB per token: 1024 tokens = 1 TiB, never fits; nothing may run
    report = ProgressiveTester({"kind": "selftest", "bytes_per_token": 1 << 30}, start_len=1024, progress=False).run()
    assert report.largest_passing_len is None and report.stopped_by == "estimate"
    assert [s.measured_peak_bytes for s in report.steps] == [None]


def test_probe_stops_when_a_run_is_too_slow_and_at_max_seq_len():
    slow = ProgressiveTester({"kind": "selftest", "behavior": "sleep", "seconds": 0.5},
                             config=SafetyConfig(max_case_seconds=0.2), start_len=64, progress=False).run()
    assert slow.largest_passing_len is None and slow.stopped_by == "time_limit"
    capped = ProgressiveTester({"kind": "selftest"}, config=SafetyConfig(max_seq_len=3000), start_len=1024,
                               progress=False).run()
    assert [s.seq_len for s in capped.steps] == [1024, 2048, 3000]
    assert capped.largest_passing_len == 3000 and capped.stopped_by == "max_seq_len"


def test_probe_reports_a_crash_as_what_stopped_it():
    report = ProgressiveTester({"kind": "selftest", "behavior": "signal"}, start_len=16, progress=False).run()
    assert report.stopped_by == "signal" and report.largest_passing_len is None


@pytest.mark.parametrize("kwargs, field", [({"start_len": 0}, "start_len"), ({"multiple_of": 0}, "multiple_of"),
                                            ({"start_len": 1 << 30}, "start_len")])
def test_probe_rejects_bad_settings(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ProgressiveTester({"kind": "selftest"}, **kwargs)


def test_expand_matrix_is_a_validated_cartesian_product():
    cases = expand_matrix({"kind": "attention", "segment_lengths": [64, 128], "dilation_rates": [1, 2]},
                          {"backend": ["manual", "sdpa"], "seq_len": [256, 512, 256], "mode": ["longnet"]})
    assert len(cases) == 4  # the duplicate 256 collapses
    assert {(c["backend"], c["seq_len"]) for c in cases} == {("manual", 256), ("manual", 512), ("sdpa", 256), ("sdpa", 512)}
    assert all(c["dtype"] == "float32" and c["device"] == "cpu" for c in cases)


@pytest.mark.parametrize("case, field", [
    ({"kind": "attention", "seq_len": 64, "backend": "magic"}, "backend"),
    ({"kind": "attention", "seq_len": 64, "mode": "sparse"}, "mode"),
    ({"kind": "attention", "seq_len": 64, "dtype": "int8"}, "dtype"),
    ({"kind": "attention", "seq_len": 0}, "seq_len"),
    ({"kind": "attention", "seq_len": 64, "segment_lengths": [64], "dilation_rates": [1, 2]}, "same length"),
    ({"kind": "attention", "seq_len": 64, "device": "gpu"}, "device"),
    ({"kind": "attention", "seq_len": 64, "ordering": "peano"}, "ordering"),
    ({"kind": "attention", "seq_len": 64, "segment_lengths": [4], "dilation_rates": [8]}, "dilation_rates"),
    ({"kind": "attention", "seq_len": 64, "colour": "red"}, "unknown"),
    ({"kind": "quantum"}, "kind"),
    ({"kind": "selftest", "behavior": "explode"}, "behavior"),
])
def test_normalize_case_names_the_bad_field(case, field):
    with pytest.raises(ValueError, match=field):
        normalize_case(case)


def test_matrix_files_yaml_and_toml_agree(tmp_path):
    yaml_file = tmp_path / "m.yaml"
    yaml_file.write_text("base: {kind: attention, segment_lengths: [64], dilation_rates: [1]}\n"
                         "matrix: {seq_len: [128, 256], backend: [manual]}\ncases: [{seq_len: 512, backend: sdpa}]\n")
    toml_file = tmp_path / "m.toml"
    toml_file.write_text('[base]\nkind = "attention"\nsegment_lengths = [64]\ndilation_rates = [1]\n'
                         '[matrix]\nseq_len = [128, 256]\nbackend = ["manual"]\n'
                         '[[cases]]\nseq_len = 512\nbackend = "sdpa"\n')
    from_yaml, from_toml = load_matrix_file(str(yaml_file)), load_matrix_file(str(toml_file))
    assert from_yaml == from_toml
    assert [(c["seq_len"], c["backend"]) for c in from_yaml] == [(128, "manual"), (256, "manual"), (512, "sdpa")]


@pytest.mark.parametrize("name, text, message", [
    ("bad.yaml", "base: {kind: attention\n", "malformed"),
    ("bad.toml", "[base\n", "malformed"),
    ("list.yaml", "- 1\n- 2\n", "mapping"),
    ("keys.yaml", "bases: {}\n", "unknown key"),
    ("values.yaml", "matrix: {seq_len: 128}\n", "non-empty list"),
    ("field.yaml", "base: {kind: attention, seq_len: 64, backend: nope}\n", "backend"),
    ("matrix.json", "{}", ".yaml, .yml or .toml"),
])
def test_malformed_matrix_files_raise_value_error_naming_the_file(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as error:
        load_matrix_file(str(path))
    assert name in str(error.value)


@pytest.mark.slow  # about 10 s of CPU
def test_probe_of_the_engine_reports_a_measured_peak_close_to_the_estimate():
    from hilbert_lab.attention.memory import MemoryConfig, estimate_memory

    base = {"kind": "attention", "backend": "manual", "num_heads": 4, "head_dim": 32, "segment_lengths": [512, 1024],
            "dilation_rates": [1, 2], "warmup": 1, "repeats": 1, "threads": 1}
    report = ProgressiveTester(base, config=SafetyConfig(max_seq_len=4096), start_len=2048, progress=False).run()
    assert [s.seq_len for s in report.steps] == [2048, 4096] and all(s.passed for s in report.steps)
    assert report.largest_passing_len == 4096 and report.stopped_by == "max_seq_len"
    estimate = estimate_memory(MemoryConfig(seq_len=4096, backend="manual", num_heads=4, head_dim=32,
                                            segment_lengths=(512, 1024), dilation_rates=(1, 2)))
    assert report.estimated_bytes == estimate.total_forward_bytes
    assert 0.8 <= estimate.forward_bytes / report.measured_peak_bytes <= 1.2
