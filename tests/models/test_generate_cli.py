"""`hilbert-lab generate`: a checkpoint continues token-id prompts or answers retrieval samples, one line per
sample, the same tokens as LongNetLM.generate; bad input exits 2 with one line."""
from __future__ import annotations

import json
import sys
import types

import pytest
import torch

from hilbert_lab.models.checkpoint import CHECKPOINT_FORMAT, save_checkpoint
from hilbert_lab.models.config import TrainConfig
from hilbert_lab.models.loop import build_model


@pytest.fixture
def cli(monkeypatch):
    """hilbert_lab.cli.main; where the ring package does not import here, its command is left out."""
    try:
        import hilbert_lab.distributed.cli  # noqa: F401
    except ImportError:
        monkeypatch.setitem(sys.modules, "hilbert_lab.distributed.cli", types.SimpleNamespace(register_cli=lambda s: None))
    from hilbert_lab.cli import main

    return main


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    config = TrainConfig(seq_len=48, segment_lengths=[8, 16, 48], dilation_rates=[1, 2, 4], dim=32, steps=1)
    model = build_model(config)
    path = tmp_path_factory.mktemp("run") / "checkpoint.pt"
    save_checkpoint({"format": CHECKPOINT_FORMAT, "config": config.to_dict(), "model": model.state_dict()}, path)
    return path, model.eval()


def test_prompts_give_one_line_of_new_tokens_each(cli, checkpoint, capsys):
    path, model = checkpoint
    assert cli(["generate", "--checkpoint", str(path.parent), "--prompt", "1,2,3", "--prompt", "4,5",
                "--max-new-tokens", "6"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    for line, prompt in zip(lines, ([1, 2, 3], [4, 5])):
        expected = model.generate(torch.tensor([prompt]), 6)[0, len(prompt):].tolist()
        assert [int(t) for t in line.split(",")] == expected


def test_retrieval_samples_give_one_json_line_each(cli, checkpoint, capsys):
    assert cli(["generate", "--checkpoint", str(checkpoint[0]), "--retrieval", "3", "--top-k", "2"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["sample"] for r in records] == [0, 1, 2]
    assert all(len(r["generated"]) == 1 and r["correct"] == (r["generated"][0] == r["expected"]) for r in records)


@pytest.mark.parametrize("arguments,message", [
    (["--prompt", "1,99"], "vocab_size"),
    (["--prompt", "1,x"], "--prompt"),
    ([], "either --prompt"),
    (["--prompt", "1", "--max-new-tokens", "100"], "max_seq_len"),
])
def test_bad_input_exits_2_with_one_line(cli, checkpoint, capsys, arguments, message):
    assert cli(["generate", "--checkpoint", str(checkpoint[0]), *arguments]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert cli(["generate", "--checkpoint", str(checkpoint[0].parent / "missing.pt"), "--prompt", "1"]) == 2
