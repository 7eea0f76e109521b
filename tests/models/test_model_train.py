"""Training: learning vs provable blindness, float64-oracle parity, exact resume, atomic checkpoints,
JSON logs, the CLI and bad input."""
from __future__ import annotations

import argparse
import json

import pytest
import torch

from hilbert_lab.models.tasks import RetrievalTask
from hilbert_lab.models.train import (
    CHECKPOINT_NAME, LOG_NAME, SUMMARY_NAME, TrainConfig, atomic_save, build_model, evaluate, load_checkpoint,
    read_log, register_cli, train,
)

# Needle retrieval over 64 tokens: the pair lies in [0, 48), the question at 62 (last 16-block).
NEEDLE = dict(seq_len=64, context_length=48, num_keys=8, num_values=8, num_filler=4, dim=64, depth=2,
              num_heads=4, batch_size=16, lr=3e-3, warmup_steps=10, eval_batches=8, progress=False)
SPANNING = dict(segment_lengths=[8, 16, 64], dilation_rates=[1, 2, 1])  # last segment spans the sequence
SHORT = dict(segment_lengths=[8, 16], dilation_rates=[1, 2])  # nested segments, all < key-query distance
TINY = dict(seq_len=32, segment_lengths=[8, 32], dilation_rates=[1, 2], dim=16, depth=1, num_heads=2,
            batch_size=4, log_every=1, eval_every=4, eval_batches=1, checkpoint_every=2, progress=False)


def _train_records(history):
    return [record for record in history if record["kind"] == "train"]


@pytest.mark.slow  # two trainings
def test_spanning_segment_learns_retrieval_that_short_segments_cannot():
    task = RetrievalTask(seq_len=64, context_length=48, num_keys=8, num_values=8)
    # every key-value pair lies in an earlier 16-block than the question: outside the short model's reach
    assert (task.resolved_context_length - 1) // 16 < task.first_query_position // 16
    steps = 200
    spanning = train(TrainConfig(steps=steps, eval_every=steps, log_every=50, **NEEDLE, **SPANNING))
    short = train(TrainConfig(steps=steps, eval_every=steps, log_every=50, **NEEDLE, **SHORT))
    chance = task.chance_loss  # log 8 = 2.08
    # the LongNet model with a spanning segment: far below chance, near-perfect retrieval
    assert spanning.final_eval["loss"] < 0.25 * chance, spanning.final_eval
    assert spanning.final_eval["accuracy"] >= 0.9, spanning.final_eval
    # the short model cannot see the pair (nested segments 8 | 16 confine every layer to the
    # 16-block of the question): chance level on 128 fresh questions
    assert short.final_eval["loss"] > 0.9 * chance, short.final_eval
    assert short.final_eval["accuracy"] < 0.3, short.final_eval
    train_losses = [record["loss"] for record in _train_records(spanning.history)]
    assert train_losses[-1] < 0.25 * chance < train_losses[0]


def test_float64_reference_and_float32_default_give_the_same_parameters():
    base = dict(seq_len=64, segment_lengths=[8, 16, 64], dilation_rates=[1, 2, 4], steps=4, optimizer="sgd", lr=0.2,
                warmup_steps=0, grad_clip=None, log_every=1, eval_every=100, batch_size=8, progress=False)
    exact = train(TrainConfig(dtype="float64", backend="reference", **base))
    default = train(TrainConfig(dtype="float32", backend="auto", **base))
    start = build_model(TrainConfig(dtype="float64", backend="reference", **base))  # the initial parameters
    exact_params, default_params = dict(exact.model.named_parameters()), dict(default.model.named_parameters())
    with torch.no_grad():
        moved = max(float((p - q).abs().max()) for p, q in zip(exact_params.values(), start.parameters()))
    assert moved > 0.05  # the steps really changed the parameters
    for name, value in exact_params.items():
        assert default_params[name].dtype == torch.float32 and value.dtype == torch.float64
        torch.testing.assert_close(default_params[name].detach().double(), value.detach(), atol=2e-6, rtol=1e-5,
                                   msg=name)
    exact_losses = [r["loss"] for r in _train_records(exact.history)]
    default_losses = [r["loss"] for r in _train_records(default.history)]
    assert default_losses == pytest.approx(exact_losses, rel=1e-5)


def test_resume_continues_the_same_loss_curve(tmp_path):
    config = TrainConfig(steps=8, dropout=0.1, **TINY)  # dropout: the RNG state must be restored too
    whole = train(config, tmp_path / "whole")
    train(config, tmp_path / "split", stop_at=3)  # interrupted after step 3 (checkpoint at step 3)
    state = load_checkpoint(tmp_path / "split" / CHECKPOINT_NAME, config)
    assert state["step"] == 3
    resumed = train(config, tmp_path / "split", resume=True)
    timeless = lambda history: [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in history]  # noqa: E731
    assert timeless(resumed.history) == timeless(whole.history)  # losses, accuracies, grad norms, evals
    assert [r["loss"] for r in _train_records(resumed.history)] == [r["loss"] for r in _train_records(whole.history)]
    for (name, p), q in zip(whole.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(p, q), name
    # the JSON log on disk is the same curve, one record per line, and the summary names the final eval
    logged = read_log(tmp_path / "split")
    assert logged == [json.loads(line) for line in (tmp_path / "split" / LOG_NAME).read_text().splitlines()]
    assert [(r["kind"], r["step"], r["loss"]) for r in logged] == [
        (r["kind"], r["step"], r["loss"]) for r in whole.history]
    summary = json.loads((tmp_path / "split" / SUMMARY_NAME).read_text())
    assert summary["final_eval"] == resumed.final_eval and summary["steps_done"] == 8


def test_resume_refuses_a_different_configuration(tmp_path):
    train(TrainConfig(steps=2, **TINY), tmp_path)
    with pytest.raises(ValueError, match=r"different configuration \(dim: checkpoint 16, requested 32; lr"):
        train(TrainConfig(steps=2, **{**TINY, "dim": 32, "lr": 1e-3}), tmp_path, resume=True)
    # run-control fields (eval/log cadence, progress) may change
    train(TrainConfig(steps=2, **{**TINY, "eval_every": 1}), tmp_path, resume=True)
    with pytest.raises(ValueError, match=r"already holds a finished run \(checkpoint.pt, log.jsonl, summary.json\)"):
        train(TrainConfig(steps=2, **TINY), tmp_path)
    with pytest.raises(ValueError, match="no checkpoint"):
        train(TrainConfig(steps=2, **TINY), tmp_path / "empty", resume=True)
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / CHECKPOINT_NAME).write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="cannot be read"):
        train(TrainConfig(steps=2, **TINY), tmp_path / "foreign", resume=True)
    torch.save({"weights": torch.zeros(2)}, tmp_path / "foreign" / CHECKPOINT_NAME)
    with pytest.raises(ValueError, match="not a hilbert_lab training checkpoint"):
        train(TrainConfig(steps=2, **TINY), tmp_path / "foreign", resume=True)


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "state.pt"
    atomic_save({"step": 1, "weights": torch.arange(1000)}, path)
    before = path.read_bytes()
    real_save = torch.save

    def crash_half_way(obj, handle, *args, **kwargs):
        handle.write(b"partial checkpoint bytes")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash_half_way)
    with pytest.raises(OSError, match="disk full"):
        atomic_save({"step": 2, "weights": torch.arange(2000)}, path)
    monkeypatch.setattr(torch, "save", real_save)
    assert path.read_bytes() == before  # the previous complete file is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.pt"]  # no temporary file left behind
    assert torch.load(path)["step"] == 1


def test_training_checkpoint_survives_a_crash_during_the_next_save(tmp_path, monkeypatch):
    config = TrainConfig(steps=6, **TINY)
    train(config, tmp_path, stop_at=2)

    def failing_save(*args, **kwargs):
        raise KeyboardInterrupt  # interrupted while writing the step-4 checkpoint

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(KeyboardInterrupt):
        train(config, tmp_path, resume=True)
    monkeypatch.undo()
    assert load_checkpoint(tmp_path / CHECKPOINT_NAME, config)["step"] == 2
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    finished = train(config, tmp_path, resume=True)  # the resumed run ends where an uninterrupted one does
    assert [r["step"] for r in _train_records(finished.history)] == [1, 2, 3, 4, 5, 6]


def test_length_curriculum_trains_short_first_and_resumes_exactly(tmp_path):
    """Steps before each until_step run on that phase's shorter sequences (same task proportions);
    evaluation stays at the full length; an interrupted curriculum resumes on the same curve."""
    config = TrainConfig(steps=6, curriculum=[[16, 2], [24, 4]], context_length=24, **TINY)
    assert [config.seq_len_at(step) for step in range(6)] == [16, 16, 24, 24, 32, 32]
    short = config.task(step=0)
    assert (short.seq_len, short.resolved_context_length) == (16, 12)  # 24/32 of the sequence, as at full length
    assert config.task().seq_len == 32 and config.task(step=5).seq_len == 32
    whole = train(config, tmp_path / "whole")
    records = _train_records(whole.history)
    assert [(r["step"], r["seq_len"]) for r in records] == [(1, 16), (2, 16), (3, 24), (4, 24), (5, 32), (6, 32)]
    train(config, tmp_path / "split", stop_at=3)
    resumed = train(config, tmp_path / "split", resume=True)
    assert [(r["kind"], r["step"], r["loss"]) for r in resumed.history] == [
        (r["kind"], r["step"], r["loss"]) for r in whole.history]
    # the curriculum defines the loss curve: resuming with another one is refused
    with pytest.raises(ValueError, match="curriculum: checkpoint"):
        train(TrainConfig(steps=6, curriculum=[[16, 3]], context_length=24, **TINY), tmp_path / "split", resume=True)


@pytest.mark.parametrize("curriculum,match", [
    ([[16]], r"curriculum\[0\] must be \[seq_len, until_step\]"),
    ([[32, 2]], "seq_len increasing and < seq_len=32"),
    ([[24, 2], [16, 4]], "seq_len increasing"),
    ([[16, 3], [24, 2]], "until_step increasing"),
    ([[16, 9]], "<= steps=6"),
    ([[2, 2]], "context_length|seq_len"),  # too short to hold the pair and the question
])
def test_bad_curriculum_is_refused(curriculum, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(steps=6, curriculum=curriculum, **TINY)


def test_bad_configuration_is_refused():
    with pytest.raises(ValueError, match="optimizer"):
        TrainConfig(optimizer="lion")
    with pytest.raises(ValueError, match="dtype"):
        TrainConfig(dtype="float8")
    with pytest.raises(ValueError, match="context_length"):
        TrainConfig(seq_len=16, context_length=40)
    with pytest.raises(ValueError, match="steps"):
        TrainConfig(steps=0)
    with pytest.raises(ValueError, match="unknown TrainConfig fields"):
        TrainConfig.from_dict({"stepz": 3})
    with pytest.raises(ValueError, match="stop_at"):
        train(TrainConfig(steps=2, **TINY), stop_at=5)
    with pytest.raises(ValueError, match="ring=True needs an initialised"):
        train(TrainConfig(steps=2, ring=True, **TINY))


def _cli(argv):
    parser = argparse.ArgumentParser(prog="hilbert-lab")
    register_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_trains_resumes_and_reports_bad_input(tmp_path, capsys):
    flags = ["--seq-len", "32", "--segment-lengths", "8,32", "--dilation-rates", "1,2", "--dim", "16",
             "--depth", "1", "--num-heads", "2", "--batch-size", "4", "--eval-every", "2", "--quiet"]
    out = tmp_path / "run"
    assert _cli(["train", "--out", str(out), "--steps", "2", "--json", *flags]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"loss", "accuracy", "accuracy_low", "accuracy_high", "count", "by_distance"} <= set(printed["final_eval"])
    state = load_checkpoint(out / CHECKPOINT_NAME)
    assert state["step"] == 2
    # the printed final eval is the saved model's, evaluated again on the final eval batches
    config = TrainConfig.from_dict(state["config"])
    model = build_model(config)
    model.load_state_dict(state["model"])
    again = evaluate(model, config, batches=config.final_eval_batches or config.eval_batches)
    assert printed["final_eval"]["count"] == again["count"] and printed["final_eval"]["correct"] == again["correct"]
    assert printed["final_eval"]["loss"] == pytest.approx(again["loss"], rel=1e-6)
    # a different model on resume: exit code 2 and one line naming the differing field
    assert _cli(["train", "--out", str(out), "--steps", "2", "--resume", *flags[:-1], "--dim", "32"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "dim: checkpoint 16, requested 32" in error
    # mismatched branch lists: exit code 2, named by their flags
    bad = ["train", "--out", str(tmp_path / "bad"), "--steps", "1", "--segment-lengths", "8,16",
           "--dilation-rates", "1", "--quiet"]
    assert _cli(bad) == 2
    assert "--segment-lengths 8,16 has 2 value(s) but --dilation-rates 1 has 1" in capsys.readouterr().err
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps({"num_values": 0}))
    assert _cli(["train", "--out", str(tmp_path / "c"), "--config", str(config_file), "--quiet"]) == 2
    assert "num_values" in capsys.readouterr().err
    # a curriculum on the command line (SEQ_LEN:UNTIL_STEP pairs) and its bad forms
    assert _cli(["train", "--out", str(tmp_path / "cur"), "--steps", "3", "--curriculum", "16:2", "--log-every", "1",
                 *flags]) == 0
    assert [r["seq_len"] for r in read_log(tmp_path / "cur") if r["kind"] == "train"] == [16, 16, 32]
    with pytest.raises(SystemExit):
        _cli(["train", "--out", str(tmp_path / "x"), "--curriculum", "16-2", *flags])
    assert "seq_len:until_step" in capsys.readouterr().err
    assert _cli(["train", "--out", str(tmp_path / "y"), "--steps", "3", "--curriculum", "64:2", *flags]) == 2
    assert "curriculum" in capsys.readouterr().err


def test_train_module_re_exports_each_public_name_from_its_home():
    import importlib

    from hilbert_lab.models import batches, checkpoint, cli, config, loop

    train_module = importlib.import_module("hilbert_lab.models.train")

    homes = {name: module for module in (batches, checkpoint, cli, config, loop) for name in vars(module)
             if not name.startswith("_") and getattr(vars(module)[name], "__module__", module.__name__) == module.__name__}
    for name in train_module.__all__:
        assert getattr(train_module, name) is getattr(homes[name], name), name


def test_models_train_stays_the_function_after_the_module_is_imported():
    import importlib

    import hilbert_lab.models
    from hilbert_lab.models import loop

    importlib.import_module("hilbert_lab.models.train")
    assert hilbert_lab.models.train is loop.train


def test_init_from_starts_from_the_checkpoint_weights_with_another_pattern(tmp_path):
    first = train(TrainConfig(steps=3, **TINY), tmp_path / "short")
    longer = {**TINY, "seq_len": 64, "segment_lengths": [8, 32, 64], "dilation_rates": [1, 2, 4]}
    checkpoint = str(tmp_path / "short" / "checkpoint.pt")
    start = train(TrainConfig(steps=2, init_from=checkpoint, **longer), tmp_path / "long", stop_at=0)
    for name, value in first.model.state_dict().items():
        assert torch.equal(start.model.state_dict()[name], value), name
    fresh = train(TrainConfig(steps=2, **longer), stop_at=0)
    assert any(not torch.equal(fresh.model.state_dict()[n], v) for n, v in first.model.state_dict().items())
    tuned = train(TrainConfig(steps=2, init_from=checkpoint, **longer), tmp_path / "long2")
    assert tuned.history[-1]["step"] == 2
    resumed = train(TrainConfig(steps=3, init_from=checkpoint, **longer), tmp_path / "long3", stop_at=1)
    again = train(TrainConfig(steps=3, init_from=checkpoint, **longer), tmp_path / "long3", resume=True)
    straight = train(TrainConfig(steps=3, init_from=checkpoint, **longer), tmp_path / "long4")
    assert resumed.history[-1]["step"] <= 1
    for name, value in straight.model.state_dict().items():
        assert torch.equal(again.model.state_dict()[name], value), name


def test_init_from_refuses_a_missing_or_unfitting_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="init_from: checkpoint must be an existing file"):
        train(TrainConfig(steps=1, init_from=str(tmp_path / "none.pt"), **TINY))
    train(TrainConfig(steps=1, **TINY), tmp_path / "small")
    with pytest.raises(ValueError, match="init_from .*do not fit"):
        train(TrainConfig(steps=1, init_from=str(tmp_path / "small" / "checkpoint.pt"), **{**TINY, "dim": 32}))
    with pytest.raises(ValueError, match="init_from must be None or a checkpoint path"):
        TrainConfig(init_from="", **TINY)
