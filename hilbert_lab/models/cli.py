"""The `hilbert-lab train` and `generate` commands (registered by hilbert_lab.cli): argument parsing (preset,
JSON config, flags) and dispatch to the training loop; a trained checkpoint continuing token-id prompts, or
answering samples of its retrieval task, on the dilated KV cache (one line of output per sample)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import torch

from hilbert_lab import arguments

from .checkpoint import CHECKPOINT_NAME, load_checkpoint
from .config import AUTOCAST_DTYPES, DTYPES, PRESETS, TrainConfig, parse_curriculum
from .loop import build_model, train
from .tasks import make_batch

_MAX_LEN = 1 << 24
_OVERRIDES = (
    ("seq_len", arguments.integer(2, _MAX_LEN)), ("curriculum", parse_curriculum),
    ("rotary_base", arguments.number(1.0, 1e12)), ("context_length", arguments.integer(2, _MAX_LEN)),
    ("num_pairs", arguments.integer(1, _MAX_LEN)), ("num_queries", arguments.integer(1, _MAX_LEN)),
    ("num_keys", arguments.integer(1, 1 << 20)), ("num_values", arguments.integer(1, 1 << 20)),
    ("dim", arguments.integer(1, 1 << 16)), ("depth", arguments.integer(1, 1024)),
    ("num_heads", arguments.integer(1, 4096)), ("segment_lengths", arguments.int_list(1, _MAX_LEN)),
    ("dilation_rates", arguments.int_list(1, _MAX_LEN)), ("mode", arguments.choice(("longnet", "head_groups"))),
    ("ordering", str), ("backend", str),
    ("steps", arguments.integer(1, 10 ** 9)), ("batch_size", arguments.integer(1, 1 << 16)),
    ("lr", arguments.number(0.0, 1e3)), ("seed", arguments.integer(0, 2 ** 63 - 1)),
    ("dtype", arguments.choice(tuple(DTYPES))), ("autocast", arguments.choice(AUTOCAST_DTYPES)),
    ("device", arguments.available_device), ("eval_every", arguments.integer(1, 10 ** 9)),
    ("checkpoint_every", arguments.integer(1, 10 ** 9)), ("log_every", arguments.integer(1, 10 ** 9)),
)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """Preset, then a JSON config file, then explicit flags (later wins)."""
    values: dict[str, Any] = dict(PRESETS[args.preset])
    if args.config is not None:
        try:
            loaded = json.loads(Path(args.config).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"--config must be a readable JSON object file: {error}") from None
        known = {f.name for f in dataclasses.fields(TrainConfig)}
        if not isinstance(loaded, dict) or set(loaded) - known:
            raise ValueError(f"--config {args.config!r} must hold a JSON object of TrainConfig fields; unknown: "
                             f"{sorted(set(loaded) - known) if isinstance(loaded, dict) else type(loaded).__name__}; "
                             f"allowed: {sorted(known)}")
        values.update(loaded)
    for name, _ in _OVERRIDES:
        value = getattr(args, name, None)
        if value is not None:
            values[name] = value
    if args.seq_len is not None and args.context_length is None:  # pairs in the first three quarters
        values["context_length"] = args.seq_len - args.seq_len // 4
    if args.gradient_checkpointing:
        values["gradient_checkpointing"] = True
    if args.compile:
        values["compile"] = True
    if args.quiet:
        values["progress"] = False
    try:
        arguments.available_device(str(values.get("device", "cpu")))
    except argparse.ArgumentTypeError as error:
        raise ValueError(f"device: {error}") from None
    return TrainConfig.from_dict(values)


def _run_cli(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
        out = arguments.prepare_output(args.out, "--out", folder=True)
        result = train(config, out, resume=args.resume)
    except ValueError as error:
        print("hilbert-lab train: error: " + " ".join(str(error).split()), file=sys.stderr)
        return 2
    print(json.dumps({"out": str(result.out_dir), "final_eval": result.final_eval}))
    return 0


def register_cli(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    """Add the `train` command to a parent parser's subparsers; sets `func` to the handler."""
    parser = subparsers.add_parser(
        "train",
        help="train a LongNet LM on the synthetic retrieval task",
        description="Train a causal LongNetLM on synthetic key-value retrieval (nothing is downloaded).",
        epilog=(
            "examples:\n"
            "  hilbert-lab train --out runs/tiny            # cpu-tiny preset, under a minute\n"
            "  hilbert-lab train --out runs/tiny --resume   # continue an interrupted run (same flags)\n"
            "  hilbert-lab train --preset gpu-32k --out runs/32k --gradient-checkpointing\n"
            "  hilbert-lab train --out runs/short --segment-lengths 16,32 --dilation-rates 1,2"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu-tiny", help="default: cpu-tiny")
    parser.add_argument("--config", help="JSON file with TrainConfig fields (applied after the preset)")
    parser.add_argument("--out", required=True, help="run folder: log.jsonl, checkpoint.pt, summary.json (created if "
                        "missing; a folder holding a checkpoint is continued only with --resume)")
    parser.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    notes = {"seq_len": "tokens per sample (the pairs then lie in its first three quarters unless "
                        "--context-length is given)",
             "context_length": "the key-value pairs lie in positions [0, CONTEXT_LENGTH)",
             "segment_lengths": "comma-separated, e.g. 8,16,64", "dilation_rates": "comma-separated, e.g. 1,2,1",
             "curriculum": "shorter lengths first: SEQ_LEN:UNTIL_STEP pairs, e.g. 1024:800,4096:1000",
             "dtype": "float32 | float64 | bfloat16", "autocast": "none | bfloat16 | float16"}
    for name, kind in _OVERRIDES:
        parser.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, default=None,
                            help=notes.get(name, f"TrainConfig.{name} (default: the preset's)"))
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=_run_cli)
    return parser


def load_model(path: str, device: str = "cpu"):
    """(model in eval mode on `device`, TrainConfig) from a checkpoint file or the run folder holding one."""
    file = Path(path) / CHECKPOINT_NAME if Path(path).is_dir() else Path(path)
    state = load_checkpoint(file)
    config = TrainConfig.from_dict({**state["config"], "device": device})
    model = build_model(config)
    model.load_state_dict(state["model"])
    return model.eval(), config


def _generation_prompts(args: argparse.Namespace, model, config: TrainConfig) -> list[tuple[torch.Tensor, dict]]:
    """(prompt (1, N0), what to report beside the generated tokens) per sample."""
    if args.prompt:
        return [(torch.tensor([ids]), {}) for ids in args.prompt]
    task = config.task()
    tokens, targets = make_batch(task, args.retrieval, seed=config.seed, split="eval", step=args.seed)
    first = task.first_query_position
    return [(tokens[i:i + 1, :first + 1], {"sample": i, "key": int(tokens[i, first]), "expected": int(targets[i, first])})
            for i in range(args.retrieval)]


def _run_generate(args: argparse.Namespace) -> int:
    if (args.prompt is None) == (args.retrieval is None):
        raise ValueError("give either --prompt (token ids, repeatable) or --retrieval N (samples of the task)")
    model, config = load_model(args.checkpoint, args.device)
    max_new = args.max_new_tokens if args.max_new_tokens is not None else (1 if args.retrieval else 16)
    generator = torch.Generator(device=args.device).manual_seed(args.seed)
    for prompt, info in _generation_prompts(args, model, config):
        prompt = prompt.to(args.device)
        out = model.generate(prompt, max_new, top_k=args.top_k, temperature=args.temperature, generator=generator,
                             use_cache=False if args.no_cache else None)
        new = out[0, prompt.shape[1]:].tolist()
        if info:
            print(json.dumps({**info, "generated": new, "correct": bool(new) and new[0] == info["expected"]}))
        else:
            print(",".join(str(token) for token in new))
    return 0


def register_generate_cli(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    """Add the `generate` command to a parent parser's subparsers; sets `func` to the handler."""
    parser = arguments.add_command(
        subparsers, "generate", "continue prompts with a trained LongNet checkpoint (dilated KV cache)",
        "  hilbert-lab generate --checkpoint runs/tiny --prompt 3,7,1,9 --max-new-tokens 8\n"
        "  hilbert-lab generate --checkpoint runs/tiny --prompt 3,7 --prompt 5,5,5 --top-k 4 --seed 1\n"
        "  hilbert-lab generate --checkpoint runs/tiny/checkpoint.pt --retrieval 8   # one JSON line per sample")
    parser.add_argument("--checkpoint", required=True, help="checkpoint.pt of `hilbert-lab train`, or its run folder")
    parser.add_argument("--prompt", action="append", type=arguments.int_list(0), default=None,
                        help="token ids, comma-separated (repeat for several samples); prints the new ids per line")
    parser.add_argument("--retrieval", type=arguments.integer(1, 1 << 16), default=None,
                        help="N samples of the checkpoint's retrieval task (eval stream): the prompt ends at the first "
                             "question; prints one JSON line per sample (key, expected, generated, correct)")
    parser.add_argument("--max-new-tokens", type=arguments.integer(0, 1 << 24), default=None,
                        help="tokens to generate (default 16, or 1 with --retrieval)")
    parser.add_argument("--top-k", type=arguments.integer(1), default=None, help="sample among the K best (default: "
                        "greedy)")
    parser.add_argument("--temperature", type=arguments.number(0.0), default=1.0, help="sampling temperature (> 0)")
    parser.add_argument("--seed", type=arguments.integer(0, 2 ** 63 - 1), default=0,
                        help="sampling seed; with --retrieval also which eval batch")
    parser.add_argument("--device", type=arguments.available_device, default="cpu")
    parser.add_argument("--no-cache", action="store_true", help="recompute the whole prefix per token (same tokens)")
    parser.set_defaults(func=_run_generate)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Standalone entry, the same as `hilbert-lab train ...`: main(["--out", "runs/tiny"])."""
    parser = argparse.ArgumentParser(prog="hilbert-lab")
    register_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["train", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)
