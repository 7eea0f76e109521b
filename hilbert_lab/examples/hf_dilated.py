"""Dilated attention in a Hugging Face Llama: switch, fine-tune on long-range retrieval, generate.

    python -m hilbert_lab.examples.hf_dilated                      # CPU, a few minutes: 512 tokens
    python -m hilbert_lab.examples.hf_dilated --seq-len 65536 --device cuda --batch-size 4

1. A tiny random LlamaForCausalLM (grouped key/value heads), built from a config: nothing is downloaded.
2. `use_dilated_attention(model, segment_lengths, dilation_rates)` switches every layer to LongNet's dilated
   pattern (the weights are unchanged); the printout compares the attention work of one sequence with the
   model's dense attention (query-key pairs of the plan against N (N + 1) / 2, and the time of one
   training step of both at this length unless --no-dense).
3. Fine-tuning on the synthetic retrieval task (hilbert_lab.models.tasks: a key-value pair in the first three
   quarters of the sequence, the key asked again at the end), loss on the answer only, with the curriculum of
   the CPU retrieval presets: 64 tokens for the first half of the steps (where the task is learned), 128 for
   the next quarter, then the full length; AdamW with warm-up and cosine decay.
4. Greedy generation with transformers' cache answers held-out samples; the accuracy is printed beside chance.
The widest branch spans the whole sequence with dilation 8 (each query sees 1/8 of the keys through the head
of its residue); the needle reaches the question's residue through a local branch of an earlier layer, so the
model needs depth >= 2 and a head per residue (8 heads).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

from hilbert_lab.arguments import available_device, int_list, integer, number
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.plan import build_plan
from hilbert_lab.integrations.transformers import use_dilated_attention
from hilbert_lab.models.tasks import IGNORE_INDEX, RetrievalTask, make_batch


def tiny_llama(vocab_size: int, seq_len: int, *, hidden: int = 64, layers: int = 2, heads: int = 8, kv_heads: int = 2,
               device: str = "cpu"):
    """A random LlamaForCausalLM from a config (rotary base large enough for seq_len)."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=seq_len + 8,
        rope_theta=max(10000.0, 20.0 * seq_len), pad_token_id=0, bos_token_id=None, eos_token_id=None,
        attn_implementation="sdpa")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(device)


def attention_pairs(segment_lengths, dilation_rates, seq_len: int, heads: int) -> tuple[int, int]:
    """(query-key pairs of the causal dilated plan, of dense causal attention) per sequence, all heads."""
    pattern = DilatedPattern.create(segment_lengths, dilation_rates, causal=True)
    return build_plan(pattern, seq_len, heads).pairs(True), heads * seq_len * (seq_len + 1) // 2


def answer_loss(model, tokens: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Cross-entropy on the answer positions (targets != IGNORE_INDEX) and the accuracy there."""
    logits = model(tokens).logits
    mask = targets != IGNORE_INDEX
    picked = logits[mask].float()
    loss = F.cross_entropy(picked, targets[mask])
    return loss, float((picked.argmax(-1) == targets[mask]).float().mean())


def training_step_seconds(model, task: RetrievalTask, batch_size: int, device: str) -> float:
    tokens, targets = (t.to(device) for t in make_batch(task, batch_size, split="train", step=10 ** 6))
    start = time.perf_counter()
    answer_loss(model, tokens, targets)[0].backward()
    model.zero_grad(set_to_none=True)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


@torch.no_grad()
def generation_accuracy(model, task: RetrievalTask, samples: int, device: str) -> float:
    """Greedy answers of held-out samples: the prompt ends at the question (the key), one token generated."""
    tokens, targets = make_batch(task, samples, split="eval", step=0)
    first = task.first_query_position
    prompts = tokens[:, :first + 1].to(device)
    out = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=1, min_new_tokens=1,
                         do_sample=False, pad_token_id=0)
    return float((out[:, -1].cpu() == targets[:, first]).float().mean())


def learning_rate(args: argparse.Namespace, step: int) -> float:
    """Linear warm-up over 20 steps, then cosine decay to 10% of --lr."""
    if step < 20:
        return args.lr * (step + 1) / 20
    progress = min(1.0, (step - 20) / max(1, args.steps - 20))
    return args.lr * (0.1 + 0.45 * (1.0 + math.cos(math.pi * progress)))


def phase_task(task: RetrievalTask, args: argparse.Namespace, step: int) -> RetrievalTask:
    """The curriculum: 64 tokens for the first half of the steps, 128 for the next quarter, then the task."""
    for length, until in ((64, args.steps // 2), (128, 3 * args.steps // 4)):
        if step < until and length < task.seq_len:
            return RetrievalTask(seq_len=length, num_keys=task.num_keys, num_values=task.num_values,
                                 context_length=length - length // 4)
    return task


def run(args: argparse.Namespace) -> dict:
    task = RetrievalTask(seq_len=args.seq_len, num_keys=args.num_keys, num_values=args.num_keys,
                         context_length=args.seq_len - args.seq_len // 4)
    model = tiny_llama(task.vocab_size, args.seq_len, hidden=args.hidden, layers=args.layers, device=args.device)
    heads = model.config.num_attention_heads
    report: dict = {"seq_len": args.seq_len, "segment_lengths": args.segment_lengths,
                    "dilation_rates": args.dilation_rates, "chance": task.chance_accuracy}
    if not args.no_dense:
        report["dense_step_s"] = training_step_seconds(model.train(), task, args.batch_size, args.device)
    use_dilated_attention(model, args.segment_lengths, args.dilation_rates)
    dilated, dense = attention_pairs(args.segment_lengths, args.dilation_rates, args.seq_len, heads)
    report.update(attention_pairs_dilated=dilated, attention_pairs_dense=dense, pairs_fraction=dilated / dense)
    if not args.no_dense:
        report["dilated_step_s"] = training_step_seconds(model.train(), task, args.batch_size, args.device)
    print(json.dumps(report), flush=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    model.train()
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(args, step)
        phase = phase_task(task, args, step)
        tokens, targets = (t.to(args.device) for t in make_batch(phase, args.batch_size, split="train", step=step))
        loss, accuracy = answer_loss(model, tokens, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            print(json.dumps({"step": step + 1, "length": phase.seq_len, "loss": round(float(loss.detach()), 4),
                              "train_accuracy": round(accuracy, 3)}), flush=True)
    model.eval()
    report["generation_accuracy"] = generation_accuracy(model, task, args.samples, args.device)
    print(json.dumps({"generation_accuracy": report["generation_accuracy"], "chance": task.chance_accuracy,
                      "samples": args.samples}), flush=True)
    return report


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hilbert_lab.examples.hf_dilated", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=integer(16), default=512, help="tokens per sample (default 512)")
    parser.add_argument("--segment-lengths", type=int_list(1), default=None,
                        help="default: 32, 128, seq_len")
    parser.add_argument("--dilation-rates", type=int_list(1), default=[1, 4, 8])
    parser.add_argument("--steps", type=integer(1), default=800)
    parser.add_argument("--batch-size", type=integer(1), default=16)
    parser.add_argument("--lr", type=number(0.0), default=3e-3)
    parser.add_argument("--hidden", type=integer(8), default=64)
    parser.add_argument("--layers", type=integer(1), default=3)
    parser.add_argument("--num-keys", type=integer(1), default=8, help="keys and values of the task (chance 1/K)")
    parser.add_argument("--samples", type=integer(1), default=128, help="held-out samples answered by generate")
    parser.add_argument("--log-every", type=integer(1), default=25)
    parser.add_argument("--device", type=available_device, default="cpu")
    parser.add_argument("--no-dense", action="store_true", help="skip timing a step of the dense model")
    args = parser.parse_args(argv)
    if args.segment_lengths is None:
        args.segment_lengths = [min(32, args.seq_len), min(128, args.seq_len), args.seq_len]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        run(args)
    except ValueError as error:
        print(f"hf_dilated: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
