"""The `hilbert-lab train` and `generate` commands (registered by hilbert_lab.cli): argument parsing (preset,
JSON config, flags), dispatch to the training loop and the end-of-run summary; a trained checkpoint
continuing token-id prompts, or answering samples of its retrieval task, on the dilated KV cache (one line
of output per sample)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import typing
from pathlib import Path
from typing import Any

import torch

from hilbert_lab import arguments
from hilbert_lab.io import read_json_object

from .checkpoint import (
    CHECKPOINT_NAME, LOG_NAME, SUMMARY_NAME, RunFolderError, check_run_folder, checkpoint_config, load_checkpoint,
    load_weights,
)
from .batches import is_main_rank
from .config import AUTOCAST_DTYPES, DTYPES, MAX_SEED, PRESETS, RING_LAYOUTS, TrainConfig, parse_curriculum
from .loop import TrainResult, build_model, train
from .tasks import make_batch

DEFAULT_PRESET = "cpu-tiny"
MAX_CONFIG_BYTES = 1 << 20  # a config file is a few hundred bytes; anything larger is not one
_MAX_LEN = 1 << 24
# (field, argparse type, help); every flag's default is the preset's value (shown for DEFAULT_PRESET)
_OVERRIDES = (
    ("seq_len", arguments.integer(2, _MAX_LEN), "tokens per sample (the pairs then lie in its first three "
                                                "quarters unless --context-length is given)"),
    ("curriculum", parse_curriculum, "shorter lengths first: SEQ_LEN:UNTIL_STEP pairs, e.g. 1024:800,4096:1000"),
    ("context_length", arguments.integer(2, _MAX_LEN), "the key-value pairs lie in positions [0, CONTEXT_LENGTH)"),
    ("num_pairs", arguments.integer(1, _MAX_LEN), "key-value pairs per sample"),
    ("num_queries", arguments.integer(1, _MAX_LEN), "questions per sample"),
    ("num_keys", arguments.integer(1, 1 << 20), "distinct key tokens"),
    ("num_values", arguments.integer(1, 1 << 20), "distinct value tokens (chance accuracy 1/NUM_VALUES)"),
    ("dim", arguments.integer(1, 1 << 16), "model width"),
    ("depth", arguments.integer(1, 1024), "transformer blocks"),
    ("num_heads", arguments.integer(1, 4096), "attention heads"),
    ("num_kv_heads", arguments.integer(1, 4096), "key/value heads (grouped-query attention; must divide --num-heads)"),
    ("segment_lengths", arguments.int_list(1, _MAX_LEN), "comma-separated segment lengths"),
    ("dilation_rates", arguments.int_list(1, _MAX_LEN), "comma-separated, one rate a segment length"),
    ("mode", arguments.choice(("longnet", "head_groups")), "longnet | head_groups"),
    ("ordering", str, "token layout inside segments: identity | hilbert | morton | snake"),
    ("backend", str, "attention backend (hilbert-lab info lists them)"),
    ("steps", arguments.integer(1, 10 ** 9), "optimizer steps"),
    ("batch_size", arguments.integer(1, 1 << 16), "samples per step"),
    ("lr", arguments.number(0.0, 1e3), "peak learning rate (warm-up, then cosine to 10%%)"),
    ("seed", arguments.integer(0, MAX_SEED), "seed of the weights and of the data streams"),
    ("dtype", arguments.choice(tuple(DTYPES)), " | ".join(DTYPES)),
    ("autocast", arguments.choice(AUTOCAST_DTYPES), " | ".join(AUTOCAST_DTYPES)),
    ("device", arguments.available_device, arguments.DEVICE_SYNTAX),
    ("eval_every", arguments.integer(1, 10 ** 9), "steps between evaluations"),
    ("checkpoint_every", arguments.integer(1, 10 ** 9), "steps between checkpoints"),
    ("log_every", arguments.integer(1, 10 ** 9), "steps between log records"),
    ("rotary_base", arguments.number(1.0, 1e12), "rotary embedding base"),
    ("data_parallel", arguments.integer(1, 1 << 16), "ranks that split each batch's rows (FSDP2 on a DeviceMesh; "
                                                      "run under torchrun with DATA_PARALLEL x CONTEXT_PARALLEL "
                                                      "processes)"),
    ("context_parallel", arguments.integer(1, 1 << 16), "ranks that shard each sequence (ring attention on the "
                                                         "mesh's cp dimension)"),
    ("ring_layout", arguments.choice(RING_LAYOUTS), "how a sequence is cut among the context-parallel ranks: "
                                                   "contiguous | zigzag (balances causal work)"),
)


def _load_config_file(path: str) -> dict[str, Any]:
    """The JSON object of TrainConfig fields in `path` (a regular file of at most MAX_CONFIG_BYTES)."""
    loaded = read_json_object(path, "--config", "a JSON object of TrainConfig fields", MAX_CONFIG_BYTES)
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    if set(loaded) - known:
        raise ValueError(f"--config {path!r} must hold a JSON object of TrainConfig fields; unknown: "
                         f"{sorted(set(loaded) - known)}; allowed: {sorted(known)}")
    return loaded


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """Preset, then a JSON config file, then explicit flags (later wins). A value that does not fit another
    is a ValueError in the words the user gave them: the flags, the --config file, the preset."""
    values: dict[str, Any] = dict(PRESETS[args.preset])
    sources = dict.fromkeys(values, f"preset {args.preset}")
    if args.config is not None:
        loaded = _load_config_file(args.config)
        values.update(loaded)
        sources.update(dict.fromkeys(loaded, f"--config {args.config!r}"))
    for name, _, _ in _OVERRIDES:
        value = getattr(args, name, None)
        if value is not None:
            values[name] = value
            sources[name] = "flag"
    if args.seq_len is not None and args.context_length is None:  # pairs in the first three quarters
        values["context_length"] = args.seq_len - args.seq_len // 4
        sources["context_length"] = "three quarters of --seq-len"
    if args.gradient_checkpointing:
        values["gradient_checkpointing"] = True
    if args.compile:
        values["compile"] = True
    if args.quiet:
        values["progress"] = False
    if args.pack:
        values["pack"] = True
    if isinstance(values.get("device"), str):  # the machine first: a GPU preset on a CPU build says so
        try:
            arguments.available_device(values["device"])
        except argparse.ArgumentTypeError as error:
            raise ValueError(f"device: {error}") from None
    problems = [problem for problem in (_pattern_problem(values, sources), _context_problem(values, sources))
                if problem]
    if problems:
        raise ValueError("; ".join(problems))
    try:
        return TrainConfig.from_dict(values)
    except ValueError as error:  # TrainConfig's words: a field as its flag, unless the --config file set it
        flags = {name: "--" + name.replace("_", "-") for name, _, _ in _OVERRIDES
                 if not sources.get(name, "").startswith("--config")}
        raise ValueError(arguments.flag_names(str(error), flags)) from None


def _named(name: str, value: Any, sources: dict[str, str]) -> str:
    """How the user gave field `name`: '--seq-len 4', 'seq_len 64 (preset cpu-tiny)', ... ."""
    shown = ",".join(map(str, value)) if isinstance(value, list) else str(value)
    source = sources.get(name, "default")
    return f"--{name.replace('_', '-')} {shown}" if source == "flag" else f"{name} {shown} ({source})"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _pattern_problem(values: dict[str, Any], sources: dict[str, str]) -> str | None:
    """Segment lengths and dilation rates of different counts, one of them given as a flag."""
    lengths, rates = values.get("segment_lengths"), values.get("dilation_rates")
    if not (isinstance(lengths, list) and isinstance(rates, list)) or len(lengths) == len(rates) or "flag" not in (
            sources.get("segment_lengths"), sources.get("dilation_rates")):
        return None
    return (f"{_named('segment_lengths', lengths, sources)} has {len(lengths)} value(s) but "
            f"{_named('dilation_rates', rates, sources)} has {len(rates)}: give one dilation rate per segment "
            f"length (--dilation-rates with {len(lengths)} value(s))")


def _shortest_seq_len(num_pairs: int, num_queries: int) -> int:
    """The shortest seq_len whose first three quarters (seq_len - seq_len // 4, the context length --seq-len
    sets) hold the pairs and leave room for the questions: 2*num_pairs <= context <= seq_len - 2*num_queries."""
    return max(2, 8 * num_queries, (8 * num_pairs - 4) // 3 + 1)


def _context_problem(values: dict[str, Any], sources: dict[str, str]) -> str | None:
    """A context length outside [2*num_pairs, seq_len - 2*num_queries], in the words the values were given."""
    full = {**TrainConfig().to_dict(), **values}
    seq_len, pairs, queries, context = (full[name] for name in ("seq_len", "num_pairs", "num_queries",
                                                                "context_length"))
    if not all(_is_int(value) for value in (seq_len, pairs, queries, context)):
        return None  # a value of the wrong type: TrainConfig names it
    low, high = 2 * pairs, seq_len - 2 * queries
    if low <= context <= high:
        return None
    task = ", ".join(_named(name, full[name], sources) for name in ("num_pairs", "num_queries")
                     if sources.get(name) == "flag")
    rule = f"[2*num_pairs, seq_len - 2*num_queries] = [{low}, {high}]" + (f" ({task})" if task else "")
    if sources.get("context_length") == "three quarters of --seq-len":
        fix = f"--seq-len >= {_shortest_seq_len(pairs, queries)}" + (
            f", or --context-length in [{low}, {high}]" if low <= high else "")
        return (f"--seq-len {seq_len} is too short: the key-value pairs go in its first three quarters (context "
                f"length {context}), which must lie in {rule}; give {fix}")
    return (f"{_named('context_length', context, sources)} must lie in {rule} for "
            f"{_named('seq_len', seq_len, sources)}")


def _rounded(value: float) -> str:
    return f"{value:.3g}" if abs(value) >= 1e-3 else f"{value:.2e}"


def summary_lines(result: TrainResult, config: TrainConfig, seconds: float) -> list[str]:
    """A few readable lines on a finished run: steps and time, the final evaluation with its 95% interval
    against chance, and where the files are."""
    task = config.task()
    evaluation = result.final_eval
    steps = max((record["step"] for record in result.history if record.get("kind") == "train"), default=0)
    lines = list(result.notes)
    lines.append(f"trained {steps} of {config.steps} steps in {seconds:.0f} s "
                 f"(N = {config.seq_len}, segments {config.segment_lengths}, rates {config.dilation_rates})")
    if evaluation:
        lines.append(f"final eval on {evaluation.get('count', 0)} answers: accuracy {evaluation['accuracy']:.3f} "
                     f"[{evaluation['accuracy_low']:.3f}, {evaluation['accuracy_high']:.3f}] (chance "
                     f"{task.chance_accuracy:.3f}), loss {_rounded(evaluation['loss'])} nats "
                     f"(chance {_rounded(task.chance_loss)})")
    if result.out_dir is not None:
        shards = sorted(path.name for path in Path(result.out_dir).glob("checkpoint-step*.dcp"))
        lines.append(f"files in {result.out_dir}{os.sep}: {LOG_NAME}, {CHECKPOINT_NAME}"
                     f"{''.join(f' ({name}/ its shards)' for name in shards)}, {SUMMARY_NAME}")
    return lines


def join_launch_group(config: TrainConfig, timeout_s: float) -> bool:
    """For a run on a mesh (config.on_mesh) outside any process group: initialise torch.distributed from the
    environment torchrun sets (nccl on CUDA, each rank on its LOCAL_RANK device; gloo on the CPU; collectives
    fail after timeout_s). True when this call initialised it. ValueError, the same on every rank, unless
    torchrun started data_parallel x context_parallel processes."""
    import datetime

    import torch.distributed as dist

    if not config.on_mesh or (dist.is_available() and dist.is_initialized()):
        return False
    wanted = config.data_parallel * config.context_parallel
    world = os.environ.get("WORLD_SIZE")
    if world != str(wanted) or "MASTER_ADDR" not in os.environ:
        raise ValueError(f"--data-parallel {config.data_parallel} x --context-parallel {config.context_parallel} needs "
                         f"{wanted} processes: run it as `torchrun --nproc-per-node {wanted} -m hilbert_lab.cli train "
                         f"...` (WORLD_SIZE is {world!r})")
    cuda = torch.device(config.device).type == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=timeout_s))
    return True


def _run_cli(args: argparse.Namespace) -> int:
    import torch.distributed as dist

    joined = finished = False
    try:
        config = config_from_args(args)
        joined = join_launch_group(config, args.timeout)
        if args.resume:  # before prepare_output creates the folder
            check_run_folder(os.path.expanduser(args.out), resume=True)
        out = arguments.prepare_output(args.out, "--out", folder=True)
        started = time.perf_counter()
        result = train(config, out, resume=args.resume)
        reporting = is_main_rank()  # rank 0 alone reports
        finished = True
    except (RunFolderError, ValueError) as error:
        message = error.cli if isinstance(error, RunFolderError) else str(error)
        if is_main_rank():  # one line, not one a rank
            print("hilbert-lab train: error: " + " ".join(message.split()), file=sys.stderr)
        return 2
    except RuntimeError as error:
        if not joined:
            raise
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
        print(f"hilbert-lab train: error: rank {dist.get_rank()} of {dist.get_world_size()} stopped: {first} (when "
              "another rank failed or left, its own log says why)", file=sys.stderr)
        return 1
    finally:
        if joined:
            if finished:  # no rank closes its connections while another still uses them
                dist.barrier()
            dist.destroy_process_group()
    if not reporting:
        return 0
    if args.json:
        print(json.dumps({"out": str(result.out_dir), "final_eval": result.final_eval, "notes": result.notes}))
    else:
        print("\n".join(summary_lines(result, config, time.perf_counter() - started)))
    return 0


# what an unset (None) field means, as its --help default
_UNSET = {"ordering": "identity", "num_kv_heads": "as --num-heads", "curriculum": "none, one length throughout"}


def _default_text(name: str) -> str:
    value = {**TrainConfig().to_dict(), **PRESETS[DEFAULT_PRESET]}[name]
    if isinstance(value, list):
        return ",".join(":".join(map(str, v)) if isinstance(v, list) else str(v) for v in value) or _UNSET[name]
    if value is None:
        return _UNSET.get(name, "none")
    return f"{value:g}" if isinstance(value, float) else str(value)


def register_cli(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    """Add the `train` command to a parent parser's subparsers; sets `func` to the handler."""
    parser = subparsers.add_parser(
        "train",
        help="train a LongNet LM on the synthetic retrieval task",
        description=("Train a causal LongNetLM on synthetic key-value retrieval (nothing is downloaded).\n"
                     f"Values come from --preset, then --config, then the flags; the defaults shown are the "
                     f"{DEFAULT_PRESET} preset's."),
        epilog=(
            "examples:\n"
            "  hilbert-lab train --out runs/tiny            # cpu-tiny preset, under a minute\n"
            "  hilbert-lab train --out runs/tiny --resume   # continue an interrupted run (same flags)\n"
            "  hilbert-lab train --preset gpu-32k --out runs/32k --gradient-checkpointing\n"
            "  hilbert-lab train --out runs/short --segment-lengths 16,32 --dilation-rates 1,2\n"
            "  hilbert-lab train --out runs/packed --pack --num-kv-heads 2   # packed documents, grouped-query heads\n"
            "  torchrun --nproc-per-node 4 -m hilbert_lab.cli train --out runs/mesh --data-parallel 2 "
            "--context-parallel 2   # FSDP2 on a 2 x 2 DeviceMesh"
        ),
        formatter_class=arguments.help_formatter,
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default=DEFAULT_PRESET, metavar="NAME",
                        help=f"one of {', '.join(sorted(PRESETS))} (default: {DEFAULT_PRESET})")
    parser.add_argument("--config", type=arguments.input_file, metavar="FILE",
                        help="JSON file of TrainConfig fields (applied after the preset)")
    parser.add_argument("--out", required=True, metavar="DIR", help="run folder: log.jsonl, checkpoint.pt, summary.json (created if "
                        "missing; a folder holding a run is continued only with --resume, never overwritten)")
    parser.add_argument("--resume", action="store_true", help="continue the run in OUT from its checkpoint.pt")
    metavars = {int: "N", float: "X", str: "NAME"}
    hints = typing.get_type_hints(TrainConfig)
    for name, kind, note in _OVERRIDES:
        hint = hints[name]
        if type(None) in typing.get_args(hint):  # Optional[X] -> X
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        metavar = "LEN:STEP,..." if name == "curriculum" else metavars.get(hint, "A,B,...")
        parser.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, default=None, metavar=metavar,
                            help=f"{note} (default: {_default_text(name)})")
    parser.add_argument("--gradient-checkpointing", "--checkpoint-activations", dest="gradient_checkpointing",
                        action="store_true", help="recompute activations in backward")
    parser.add_argument("--timeout", type=arguments.number(1.0, 86400.0), default=600.0, metavar="S",
                        help="with --data-parallel / --context-parallel: seconds after which a collective that waits "
                             "on a failed rank stops every rank (default 600)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true", help="end with one JSON line (out, final_eval) instead of "
                        "the summary")
    parser.add_argument("--pack", action="store_true", help="packed batches: each step's tokens as one row of "
                        "documents of random lengths (attention and positions restart at each; no target crosses one)")
    parser.set_defaults(func=_run_cli)
    register_generate_cli(subparsers)
    return parser


def load_model(path: str, device: str = "cpu"):
    """(model in eval mode on `device`, TrainConfig) from a checkpoint file or the run folder holding one."""
    file = Path(path) / CHECKPOINT_NAME if Path(path).is_dir() else Path(path)
    state = load_checkpoint(file)
    config = checkpoint_config(state, file, device=device)
    model = build_model(config)
    load_weights(model, state, file)
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
                        help="tokens to generate (default: 16, or 1 with --retrieval)")
    parser.add_argument("--top-k", type=arguments.integer(1), default=None, help="sample among the K best (default: "
                        "greedy)")
    parser.add_argument("--temperature", type=arguments.number(0.0), default=1.0, help="sampling temperature (> 0)")
    parser.add_argument("--seed", type=arguments.integer(0, 2 ** 63 - 1), default=0,
                        help="sampling seed; with --retrieval also which eval batch")
    parser.add_argument("--device", type=arguments.available_device, default="cpu", help=arguments.DEVICE_SYNTAX)
    parser.add_argument("--no-cache", action="store_true", help="recompute the whole prefix per token (same tokens)")
    parser.set_defaults(func=_run_generate)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Standalone entry, the same as `hilbert-lab train ...`: main(["--out", "runs/tiny"])."""
    parser = argparse.ArgumentParser(prog="hilbert-lab")
    register_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["train", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)
