"""Packed batches and grouped-query heads in the models: the packing data path, a packed row equal to its
documents run alone, no leakage between documents (a needle in one document is at chance from another,
after training with --pack), the train command's --pack / --num-kv-heads and their bad input."""
from __future__ import annotations

import argparse
import json

import pytest
import torch

from hilbert_lab.models import LongNetLM
from hilbert_lab.models.packing import make_packed_batch, min_document_length
from hilbert_lab.models.tasks import IGNORE_INDEX, RetrievalTask
from hilbert_lab.models.train import TrainConfig, config_differences, register_cli, train

TINY = dict(seq_len=32, context_length=24, segment_lengths=[8, 32], dilation_rates=[1, 2], dim=16, depth=2,
            num_heads=4, batch_size=4, log_every=1, eval_every=10, eval_batches=1, checkpoint_every=10, progress=False)


def test_packed_batch_holds_whole_documents_with_targets_inside_them():
    task = RetrievalTask(seq_len=32, num_pairs=2, num_queries=2, context_length=24)
    batch = make_packed_batch(task, 4, seed=3, step=5)
    again = make_packed_batch(task, 4, seed=3, step=5)
    assert all(torch.equal(a, b) for a, b in zip(batch[:4], again[:4]))
    assert not torch.equal(batch.tokens, make_packed_batch(task, 4, seed=3, step=6).tokens)
    cu = batch.cu_seqlens.tolist()
    lengths = [b - a for a, b in zip(cu, cu[1:])]
    assert batch.tokens.shape == (1, 128) and cu[0] == 0 and cu[-1] == 128
    assert all(min_document_length(task) <= n <= 32 for n in lengths[:-1]) and 1 <= lengths[-1] <= 32
    for a, n in zip(cu, lengths):
        assert batch.positions[a:a + n].tolist() == list(range(n))
        assert batch.targets[0, a + n - 1] == IGNORE_INDEX  # no target crosses into the next document
    answers = (batch.targets != IGNORE_INDEX).sum().item()
    assert answers == 2 * batch.documents and batch.documents >= len(lengths) - 1


def _model(**kwargs):
    torch.manual_seed(0)
    return LongNetLM(vocab_size=20, dim=16, depth=2, num_heads=4, segment_lengths=[4, 16], dilation_rates=[1, 2],
                     max_seq_len=16, **kwargs).double().eval()


def test_packed_row_equals_each_document_alone_and_its_heads_are_grouped():
    model = _model(num_kv_heads=2)
    assert model.encoder.blocks[0].attention.k_proj.out_features == 8
    tokens = torch.randint(0, 20, (1, 30), generator=torch.Generator().manual_seed(1))
    cu = torch.tensor([0, 11, 12, 26, 30])
    packed = model(tokens, cu_seqlens=cu)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        assert torch.allclose(packed[:, a:b], model(tokens[:, a:b]), atol=1e-12)
    with pytest.raises(ValueError, match="positions must lie in"):
        model(torch.zeros(1, 20, dtype=torch.long), cu_seqlens=torch.tensor([0, 2, 20]))  # a document > max_seq_len


def test_a_needle_in_one_document_is_at_chance_from_another():
    """A model trained a few steps on packed rows; document A holds the pair (key, value), document B asks
    for the key. B's logits are the same whatever A's value (so over the num_values values exactly one
    can match: accuracy at most chance), while one unpacked row lets them change."""
    config = TrainConfig(steps=12, pack=True, num_kv_heads=2, **TINY)
    model = train(config).model.eval()
    task = config.task()
    key, filler = task.key_offset, 0
    doc_a = [filler] * 16
    doc_b = [filler] * 11 + [key]
    cu = torch.tensor([0, len(doc_a), len(doc_a) + len(doc_b)])
    packed, unpacked = [], []
    for value in range(task.num_values):
        row = list(doc_a)
        row[4:6] = [key, task.value_offset + value]
        tokens = torch.tensor([row + doc_b])
        with torch.no_grad():
            packed.append(model(tokens, cu_seqlens=cu)[0, -1])
            unpacked.append(model(tokens)[0, -1])
    assert all(torch.allclose(p, packed[0], atol=1e-6, rtol=0) for p in packed)
    hits = sum(int(p.argmax()) == task.value_offset + value for value, p in enumerate(packed))
    assert hits <= 1  # accuracy <= 1 / num_values = chance
    assert max((u - unpacked[0]).abs().max().item() for u in unpacked) > 1e-4


def _cli(argv):
    parser = argparse.ArgumentParser(prog="hilbert-lab")
    register_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_train_command_packs_and_groups_heads_and_names_bad_input(tmp_path, capsys):
    flags = ["--seq-len", "32", "--segment-lengths", "8,32", "--dilation-rates", "1,2", "--dim", "16",
             "--depth", "1", "--num-heads", "4", "--batch-size", "2", "--eval-every", "2", "--quiet"]
    assert _cli(["train", "--out", str(tmp_path / "run"), "--steps", "2", "--pack", "--num-kv-heads", "2", *flags]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["config"]["pack"] is True and summary["config"]["num_kv_heads"] == 2
    capsys.readouterr()
    assert _cli(["train", "--out", str(tmp_path / "bad"), "--num-kv-heads", "3", *flags]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "--num-kv-heads must" in error and "num_kv_heads" not in error
    with pytest.raises(ValueError, match="pack=True .* ring=True"):
        TrainConfig(pack=True, ring=True)


def test_checkpoints_without_the_new_fields_resume_as_their_defaults():
    saved = TrainConfig().to_dict()
    del saved["pack"], saved["num_kv_heads"]
    assert config_differences(saved, TrainConfig().to_dict()) == []
    assert config_differences(saved, TrainConfig(pack=True).to_dict()) == ["pack: checkpoint False, requested True"]
