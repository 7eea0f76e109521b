"""The Hugging Face example (hilbert_lab.examples.hf_dilated) runs end to end on a few steps: dense and dilated
step timings, the attention pairs of the plan, training records and the generation accuracy."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers", reason="the example needs the 'hf' extra (pip install 'hilbert-lab[hf]')")

from hilbert_lab.examples import hf_dilated  # noqa: E402


def test_the_example_runs_a_few_steps(capsys):
    assert hf_dilated.main(["--seq-len", "96", "--steps", "4", "--batch-size", "2", "--samples", "4",
                            "--log-every", "2", "--hidden", "32"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    first, last = records[0], records[-1]
    assert first["segment_lengths"] == [32, 96, 96] and first["pairs_fraction"] < 1
    assert first["dense_step_s"] > 0 and first["dilated_step_s"] > 0
    assert [r["length"] for r in records[1:-1]] == [64, 96]  # the curriculum: 64 tokens first
    assert 0 <= last["generation_accuracy"] <= 1 and last["chance"] == 1 / 8


def test_bad_arguments_exit_2():
    with pytest.raises(SystemExit) as exit_:
        hf_dilated.main(["--seq-len", "4"])
    assert exit_.value.code == 2
    assert hf_dilated.main(["--seq-len", "64", "--dilation-rates", "1,4,128", "--steps", "1", "--no-dense"]) == 2
