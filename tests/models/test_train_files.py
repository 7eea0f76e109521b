"""A training run's files: never overwritten, never written by two runs, checkpoints checked against their
checksum, usual permissions, a log torn by a crash repaired on resume (saying so), every config field
type-checked, and the `train` command's summary, refusals and help in its own words."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import typing

import pytest
import torch

from hilbert_lab.io import LockedError, exclusive_lock
from hilbert_lab.models.train import (
    CHECKPOINT_NAME, FIELD_RULES, LOCK_NAME, LOG_NAME, SUMMARY_NAME, TrainConfig, load_checkpoint, read_log,
    register_cli, train,
)

TINY = dict(seq_len=32, segment_lengths=[8, 32], dilation_rates=[1, 2], dim=16, depth=1, num_heads=2,
            batch_size=4, log_every=1, eval_every=2, eval_batches=1, checkpoint_every=2, progress=False)
FLAGS = ["--seq-len", "32", "--segment-lengths", "8,32", "--dilation-rates", "1,2", "--dim", "16", "--depth", "1",
         "--num-heads", "2", "--batch-size", "4", "--eval-every", "2", "--quiet"]


def _cli(argv, capsys):
    parser = argparse.ArgumentParser(prog="hilbert-lab")
    register_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code = args.func(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_folder_holding_a_run_without_checkpoint_is_never_overwritten(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / LOG_NAME).write_text('{"kind": "train", "step": 1, "loss": 2.0}\n')
    (run / SUMMARY_NAME).write_text('{"steps_done": 1}\n')
    with pytest.raises(ValueError, match=r"out_dir .*run' already holds a finished run \(log.jsonl, summary.json\).*"
                                         r"no checkpoint to continue from, or choose another out_dir"):
        train(TrainConfig(steps=2, **TINY), run)
    code, out, err = _cli(["train", "--out", str(run), "--steps", "2", *FLAGS], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "--out" in err and "already holds a finished run (log.jsonl, summary.json)" in err and "--resume" not in err
    assert (run / LOG_NAME).read_text().startswith('{"kind": "train", "step": 1')  # untouched
    (run / SUMMARY_NAME).unlink()
    with pytest.raises(ValueError, match="already holds an unfinished run"):
        train(TrainConfig(steps=2, **TINY), run)


def test_the_refusal_speaks_cli_words_on_the_command_line(tmp_path, capsys):
    run = tmp_path / "run"
    assert _cli(["train", "--out", str(run), "--steps", "2", *FLAGS], capsys)[0] == 0
    code, _, err = _cli(["train", "--out", str(run), "--steps", "2", *FLAGS], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "pass --resume to continue it, or choose another --out" in err and "resume=True" not in err
    code, _, err = _cli(["train", "--out", str(tmp_path / "empty"), "--resume", "--steps", "2", *FLAGS], capsys)
    assert code == 2 and "--resume but there is no checkpoint" in err and "resume=True" not in err
    assert not (tmp_path / "empty").exists()


def test_a_second_run_on_a_folder_being_written_refuses_at_once(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with exclusive_lock(run / LOCK_NAME, "another train"):  # what a running `train` holds
        with pytest.raises(LockedError, match="being written by another run"):
            train(TrainConfig(steps=2, **TINY), run)
        with pytest.raises(ValueError, match="being written by another run"):
            train(TrainConfig(steps=2, **TINY), run, resume=False)
    assert sorted(p.name for p in run.iterdir()) == [LOCK_NAME]  # nothing written by the refused run
    train(TrainConfig(steps=2, **TINY), run)  # free again


def test_files_get_the_usual_permissions(tmp_path):
    previous = os.umask(0o022)
    try:
        train(TrainConfig(steps=2, **TINY), tmp_path / "run")
    finally:
        os.umask(previous)
    for name in (CHECKPOINT_NAME, LOG_NAME, SUMMARY_NAME):
        assert os.stat(tmp_path / "run" / name).st_mode & 0o777 == 0o644, name


def _flip(path, mutate) -> None:
    """Change the bytes of the first stored weight with >= 4 elements inside the checkpoint file."""
    state = torch.load(path, weights_only=True)
    weight = next(t for t in state["model"].values() if t.numel() >= 4 and t.dtype == torch.float32)
    data = path.read_bytes()
    stored = weight.numpy().tobytes()
    start = data.index(stored)
    path.write_bytes(data[:start] + mutate(stored) + data[start + len(stored):])


@pytest.mark.parametrize("mutate", [
    lambda b: b[:4] + bytes(x ^ 0xFF for x in b[4:12]) + b[12:],  # 8 bytes flipped
    lambda b: b[:7] + bytes([b[7] ^ 0x01]) + b[8:],  # the lowest exponent bit of the second float32
], ids=["8-bytes", "one-exponent-bit"])
def test_a_corrupted_checkpoint_is_refused_naming_the_file(tmp_path, capsys, mutate):
    config = TrainConfig(steps=4, **TINY)
    train(config, tmp_path / "run", stop_at=2)
    checkpoint = tmp_path / "run" / CHECKPOINT_NAME
    assert load_checkpoint(checkpoint, config)["step"] == 2
    _flip(checkpoint, mutate)
    with pytest.raises(ValueError, match=f"checkpoint '{checkpoint}' is corrupted"):
        train(config, tmp_path / "run", resume=True)
    with pytest.raises(ValueError, match="corrupted"):
        train(TrainConfig(steps=1, init_from=str(checkpoint), **TINY))
    code, _, err = _cli(["train", "--out", str(tmp_path / "run"), "--resume", "--steps", "4", *FLAGS,
                         "--log-every", "1", "--checkpoint-every", "2"], capsys)
    assert code == 2 and err.count("\n") == 1 and str(checkpoint) in err and "corrupted" in err


def test_resume_repairs_a_log_torn_by_a_crash_and_says_so(tmp_path):
    config = TrainConfig(steps=4, **TINY)
    train(config, tmp_path / "run", stop_at=2)
    log = tmp_path / "run" / LOG_NAME
    kept = log.read_text()
    with open(log, "a") as handle:  # a run killed after its checkpoint, mid-write
        handle.write('{"kind": "train", "step": 3, "loss": 1.0}\n{"kind": "tra')
    with pytest.raises(ValueError, match=f"'{log}' line .* is torn"):
        read_log(tmp_path / "run")
    result = train(config, tmp_path / "run", resume=True)
    assert result.notes == [f"resumed at step 2 (the checkpoint); dropped from {LOG_NAME}: 1 record(s) written "
                            "after the checkpoint and 1 torn line(s)"]
    records = read_log(tmp_path / "run")
    assert log.read_text().startswith(kept) and [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3, 4]


def _wrong_values(hint) -> list:
    """Values of a type other than the annotation `hint` (an Optional field also takes None)."""
    optional = type(None) in typing.get_args(hint)
    if optional:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    by_type = {int: ["8", 1.5, True, [1]], float: ["0.1", True, [0.5], float("nan")], bool: ["false", 0, 1, None],
               str: [1, True, ["cpu"]]}
    values = by_type.get(hint) or ["8,16", 8, [1.5], ["8"], [True]]  # lists
    return values + ([] if optional or hint is bool else [None])


FIELD_TYPES = typing.get_type_hints(TrainConfig)
WRONG = [pytest.param(name, value, id=f"{name}={value!r}") for name in FIELD_TYPES
         for value in _wrong_values(FIELD_TYPES[name])]


def test_every_field_has_a_rule_and_the_presets_pass_it():
    assert set(FIELD_RULES) == {f.name for f in dataclasses.fields(TrainConfig)}
    assert len(WRONG) >= 4 * len(FIELD_TYPES)


@pytest.mark.parametrize("name, value", WRONG)
def test_a_value_of_the_wrong_type_is_refused_naming_the_field(name, value):
    with pytest.raises(ValueError, match=f"^{name} must be {re.escape(FIELD_RULES[name][1])}, got"):
        TrainConfig(**{name: value})


@pytest.mark.parametrize("values, needle", [
    ({"rotary": "false"}, "rotary must be true or false"), ({"seed": -1}, "seed must be an integer in"),
    ({"seed": 1.0}, "seed must be an integer"), ({"lr": "3e-4"}, "lr must be a finite number > 0"),
    ({"warmup_steps": "10"}, "warmup_steps must be an integer >= 0"), ({"dropout": 1.0}, "dropout must be"),
    ({"segment_lengths": [8.0, 32]}, "segment_lengths must be"), ({"device": "tpu"}, "device must be"),
    ({"ordering": "spiral"}, "ordering must be None or one of"), ({"backend": "magic"}, "backend must be one of"),
])
def test_the_values_that_ran_silently_or_ended_in_tracebacks(values, needle):
    with pytest.raises(ValueError, match=needle):
        TrainConfig(**{**TINY, **values})


def test_numbers_keep_their_type_and_lists_become_lists():
    config = TrainConfig(**{**TINY, "lr": 1, "segment_lengths": (8, 32), "grad_clip": None})
    assert isinstance(config.lr, float) and config.segment_lengths == [8, 32] and config.grad_clip is None


def test_train_ends_with_a_readable_summary(tmp_path, capsys):
    code, out, _ = _cli(["train", "--out", str(tmp_path / "run"), "--steps", "2", *FLAGS], capsys)
    lines = out.strip().splitlines()
    assert code == 0 and 2 <= len(lines) <= 5 and not out.lstrip().startswith("{")
    assert lines[0].startswith("trained 2 of 2 steps in ")
    assert lines[1].startswith("final eval on 32 answers: accuracy ") and "chance 0.125" in lines[1]
    assert all(len(number.split(".")[-1]) <= 3 for number in lines[1].replace(",", " ").replace("]", " ").split()
               if number.replace(".", "").isdigit())  # no 16-digit floats
    assert lines[-1] == f"files in {tmp_path / 'run'}{os.sep}: log.jsonl, checkpoint.pt, summary.json"
    code, out, _ = _cli(["train", "--out", str(tmp_path / "json"), "--steps", "2", "--json", *FLAGS], capsys)
    assert code == 0 and json.loads(out)["final_eval"]["count"] == 32


def test_help_shows_each_flags_default():
    parser = argparse.ArgumentParser(prog="hilbert-lab")
    train_parser = register_cli(parser.add_subparsers(dest="command", required=True))
    text = " ".join(train_parser.format_help().split())
    assert "TrainConfig." not in text and "the preset's)" not in text
    assert "the defaults shown are the cpu-tiny preset's" in text
    for flag, default in (("--seq-len N", "64"), ("--steps N", "300"), ("--lr X", "0.003"),
                          ("--segment-lengths A,B,...", "8,16,64"), ("--backend NAME", "auto")):
        options = text.split("options:", 1)[1]
        assert flag in options and f"(default: {default})" in options.split(flag, 1)[1][:200], flag


def test_a_checkpoint_of_format_1_or_without_what_a_run_needs_is_refused_naming_the_file(tmp_path):
    from hilbert_lab.models.checkpoint import atomic_save, save_checkpoint

    config = TrainConfig(steps=2, **TINY)
    train(config, tmp_path / "run")
    path = tmp_path / "run" / CHECKPOINT_NAME
    state = load_checkpoint(path, config)
    state.pop("sha256", None)
    assert state["step"] == 2 and set(state) == {"format", "config", "step", "model", "optimizer", "history", "rng"}
    atomic_save({**state, "format": 1}, path)  # the same content, written before checksums
    for call in (lambda: load_checkpoint(path), lambda: train(config, tmp_path / "run", resume=True),
                 lambda: train(TrainConfig(steps=1, init_from=str(path), **TINY))):
        with pytest.raises(ValueError, match=f"checkpoint '{path}': format 1 is no longer supported"):
            call()
    save_checkpoint({key: value for key, value in state.items() if key not in ("history", "rng")}, path)
    assert load_checkpoint(path)["step"] == 2  # enough to generate from, or to start another run
    with pytest.raises(ValueError, match=f"checkpoint '{path}' lacks history, rng "):
        load_checkpoint(path, config)
    wider = train(TrainConfig(steps=1, **{**TINY, "dim": 32}), stop_at=0).model.state_dict()
    save_checkpoint({**state, "model": wider}, path)
    with pytest.raises(ValueError, match=f"checkpoint '{path}': its model weights do not fit the configuration "
                                         "stored in it .*size mismatch"):
        train(config, tmp_path / "run", resume=True)
