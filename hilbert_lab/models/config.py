"""Training configuration: TrainConfig (task, model, optimisation, run control), the presets and
the length-curriculum syntax."""
from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import numbers
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

from hilbert_lab.arguments import parse_int
from hilbert_lab.attention.executors import BACKENDS
from hilbert_lab.attention.pattern import MODES
from hilbert_lab.curves import ORDERINGS
from hilbert_lab.dtypes import DTYPES as FLOAT_DTYPES, torch_dtype

from .tasks import RetrievalTask

DTYPES = {name: torch_dtype(name) for name in FLOAT_DTYPES if name != "float16"}  # float16 only through autocast
AUTOCAST_DTYPES = ("none", "bfloat16", "float16")
OPTIMIZERS = ("adamw", "sgd")
RING_LAYOUTS = ("contiguous", "zigzag")
MAX_SEED = 2 ** 63 - 1

# Fields that only steer a run (where it logs, how often, which device); they may change on resume.
# Every other field changes the loss curve (``steps`` too: it shapes the cosine schedule), so resuming
# with a different value is refused.
RUN_CONTROL_FIELDS = frozenset(
    {"log_every", "eval_every", "eval_batches", "final_eval_batches", "checkpoint_every", "device", "gradient_checkpointing",
     "compile", "progress", "ring", "ring_layout", "data_parallel", "context_parallel", "fsdp"}
)


@dataclass
class TrainConfig:
    """Everything that defines a training run (task, model, optimisation, run control)."""

    # task (see hilbert_lab.models.tasks.RetrievalTask)
    seq_len: int = 128
    # Length curriculum: [[seq_len, until_step], ...] trains steps [previous until_step, until_step) on
    # that shorter length (same task proportions), then config.seq_len; evaluation is always at seq_len.
    curriculum: list[list[int]] = field(default_factory=list)
    num_pairs: int = 1
    num_queries: int = 1
    num_keys: int = 8
    num_values: int = 8
    num_filler: int = 4
    context_length: int | None = None
    # model (see LongNetLM)
    dim: int = 64
    depth: int = 2
    num_heads: int = 4
    num_kv_heads: int | None = None  # key/value heads (grouped-query attention); None: num_heads
    segment_lengths: list[int] = field(default_factory=lambda: [16, 32, 128])
    dilation_rates: list[int] = field(default_factory=lambda: [1, 2, 4])
    mlp_ratio: float = 2.0
    dropout: float = 0.0
    mode: str = "longnet"
    ordering: str | None = None
    backend: str = "auto"
    rotary: bool = True
    rotary_base: float = 10000.0
    # Packed batches (models.packing): each step's batch_size x seq_len tokens as one row of documents of
    # random lengths, each attended as its own sequence (cu_seqlens); evaluation stays on the unpacked stream.
    pack: bool = False
    # optimisation
    steps: int = 200
    batch_size: int = 16
    optimizer: str = "adamw"
    lr: float = 3e-3
    weight_decay: float = 0.0
    warmup_steps: int = 10
    grad_clip: float | None = 1.0
    seed: int = 0
    dtype: str = "float32"
    autocast: str = "none"
    # run control
    log_every: int = 10
    eval_every: int = 50
    eval_batches: int = 4
    final_eval_batches: int | None = None  # batches of the end-of-run eval (default eval_batches)
    checkpoint_every: int = 50
    device: str = "cpu"
    gradient_checkpointing: bool = False
    compile: bool = False
    progress: bool = True
    ring: bool = False  # shard the sequence over the ranks of the initialised process group (ring attention)
    ring_layout: str = "contiguous"
    # A DeviceMesh over the initialised process group (models.parallel, FSDP2): batch rows split over
    # data_parallel ranks, each sequence sharded over context_parallel ranks (ring attention, ring_layout);
    # their product must be the world size. 1 and 1: one process.
    data_parallel: int = 1
    context_parallel: int = 1
    # With data_parallel = context_parallel = 1: train on a DeviceMesh of one rank all the same (FSDP2's mixed
    # precision instead of autocast): the program every rank of a mesh runs, a like-for-like one-GPU baseline.
    fsdp: bool = False
    # Checkpoint whose model weights start the run (fresh optimizer and schedule): fine-tuning at another
    # length or pattern. The pattern holds no parameters, so segments and rates may differ from the checkpoint's.
    init_from: str | None = None

    def __post_init__(self) -> None:
        types_ = _field_types()
        for item in dataclasses.fields(self):
            setattr(self, item.name, check_field(item.name, getattr(self, item.name), types_[item.name]))
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads must be a positive integer dividing num_heads={self.num_heads} (or unset: "
                             f"one per head), got {self.num_kv_heads!r}")
        # the model's shapes, before a run folder is made: heads of dim / num_heads channels, rotated in pairs
        if self.dim % self.num_heads:
            raise ValueError(f"dim={self.dim} must be a multiple of num_heads={self.num_heads} (a head's width is their "
                             "quotient)")
        if self.rotary and (self.dim // self.num_heads) % 2:
            raise ValueError(f"rotary needs an even head dim: dim={self.dim} / num_heads={self.num_heads} = "
                             f"{self.dim // self.num_heads}")
        if self.pack and self.ring:
            raise ValueError("pack=True (packed documents) does not run with ring=True: ring attention takes one "
                             "sequence per row; use one of them")
        if self.ring and self.on_mesh:
            raise ValueError("ring=True does not go with data_parallel or context_parallel > 1 or fsdp: "
                             "context_parallel is the ring on a DeviceMesh; use it alone")
        if self.pack and self.data_parallel > 1:
            raise ValueError("pack=True (packed documents) does not run with data_parallel > 1: a packed batch is one "
                             "row; shard it with context_parallel instead")
        shards = self.context_parallel * (2 if self.ring_layout == "zigzag" and self.context_parallel > 1 else 1)
        lengths = sorted({self.seq_len, *(phase[0] for phase in self.curriculum if len(phase) == 2)})
        if any(length % shards for length in lengths):
            raise ValueError(f"every training length ({lengths}) must be a multiple of {shards}: the "
                             f"{self.ring_layout} layout cuts each sequence into that many equal chunks over "
                             f"context_parallel={self.context_parallel} ranks")
        if self.batch_size % self.data_parallel:
            raise ValueError(f"batch_size={self.batch_size} must divide among the data_parallel={self.data_parallel} "
                             "ranks (a multiple of it)")
        self.task()  # validates the task fields
        previous_length, previous_step = 0, 0
        for index, phase in enumerate(self.curriculum):
            if len(phase) != 2:
                raise ValueError(f"curriculum[{index}] must be [seq_len, until_step], got {phase!r}")
            length, until = phase
            if not previous_length < length < self.seq_len or not previous_step < until <= self.steps:
                raise ValueError(
                    f"curriculum must list [seq_len, until_step] pairs with seq_len increasing and < seq_len="
                    f"{self.seq_len} and until_step increasing and <= steps={self.steps}; got {self.curriculum!r}")
            self.task(step=until - 1)  # the shorter task must be valid too
            previous_length, previous_step = length, until

    @property
    def on_mesh(self) -> bool:
        """Whether the run trains on a DeviceMesh: several ranks (data_parallel or context_parallel > 1), or one
        with fsdp."""
        return self.fsdp or self.data_parallel * self.context_parallel > 1

    def seq_len_at(self, step: int) -> int:
        """Training sequence length at (0-based) ``step``: the curriculum's phase, else seq_len."""
        for length, until in self.curriculum:
            if step < until:
                return length
        return self.seq_len

    def task(self, step: int | None = None) -> RetrievalTask:
        """The task at the full length, or at training ``step``'s curriculum length (the context
        keeps the same fraction of the sequence)."""
        length = self.seq_len if step is None else self.seq_len_at(step)
        context = self.context_length
        if context is not None and length != self.seq_len:
            context = max(2 * self.num_pairs, min(length - 2 * self.num_queries, context * length // self.seq_len))
        return RetrievalTask(
            seq_len=length, num_pairs=self.num_pairs, num_queries=self.num_queries,
            num_keys=self.num_keys, num_values=self.num_values, num_filler=self.num_filler,
            context_length=context,
        )

    def model_kwargs(self) -> dict[str, Any]:
        return dict(
            vocab_size=self.task().vocab_size, dim=self.dim, depth=self.depth, num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            segment_lengths=self.segment_lengths, dilation_rates=self.dilation_rates, max_seq_len=self.seq_len,
            mlp_ratio=self.mlp_ratio, dropout=self.dropout, mode=self.mode, ordering=self.ordering,
            backend=self.backend, rotary=self.rotary, rotary_base=self.rotary_base,
            gradient_checkpointing=self.gradient_checkpointing,
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TrainConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown TrainConfig fields {unknown}; allowed: {sorted(known)}")
        return cls(**values)


def _choices(allowed: tuple) -> tuple[Callable[[Any], bool], str]:
    return (lambda value: value in allowed), "one of " + ", ".join(repr(a) for a in allowed)


def _at_least(low: int | float, what: str = "an integer") -> tuple[Callable[[Any], bool], str]:
    return (lambda value: value >= low), f"{what} >= {low}"


# The allowed values of every TrainConfig field (its type comes from the annotation, checked first):
# (predicate on the typed value, the allowed values in words; None is JSON's null). Every field has one.
FIELD_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "seq_len": _at_least(2), "num_pairs": _at_least(1), "num_queries": _at_least(1), "num_keys": _at_least(1),
    "num_values": _at_least(1), "num_filler": _at_least(1),
    "curriculum": ((lambda value: True), "a list of [seq_len, until_step] integer pairs"),
    "context_length": ((lambda value: value >= 2), "None or an integer >= 2"),
    "dim": _at_least(1), "depth": _at_least(1), "num_heads": _at_least(1),
    "segment_lengths": ((lambda value: bool(value) and min(value) >= 1), "a non-empty list of integers >= 1"),
    "dilation_rates": ((lambda value: bool(value) and min(value) >= 1), "a non-empty list of integers >= 1"),
    "mlp_ratio": ((lambda value: value > 0), "a finite number > 0"),
    "dropout": ((lambda value: 0 <= value < 1), "a number in [0, 1)"),
    "mode": _choices(tuple(MODES)),
    "ordering": ((lambda value: value in ORDERINGS), "None or one of " + ", ".join(repr(o) for o in ORDERINGS)),
    "backend": _choices(("auto",) + tuple(BACKENDS)),
    "rotary": ((lambda value: True), "true or false"),
    "rotary_base": ((lambda value: value > 1), "a finite number > 1"),
    "steps": _at_least(1), "batch_size": _at_least(1), "optimizer": _choices(OPTIMIZERS),
    "lr": ((lambda value: value > 0), "a finite number > 0"),
    "weight_decay": ((lambda value: value >= 0), "a finite number >= 0"),
    "warmup_steps": _at_least(0),
    "grad_clip": ((lambda value: value > 0), "None or a finite number > 0"),
    "seed": ((lambda value: 0 <= value <= MAX_SEED), f"an integer in [0, {MAX_SEED}]"),
    "dtype": _choices(tuple(DTYPES)), "autocast": _choices(AUTOCAST_DTYPES),
    "log_every": _at_least(1), "eval_every": _at_least(1), "eval_batches": _at_least(1),
    "final_eval_batches": ((lambda value: value >= 1), "None or an integer >= 1"),
    "checkpoint_every": _at_least(1),
    "device": ((lambda value: value in ("cpu", "cuda") or (value.startswith("cuda:") and value[5:].isascii()
                                                          and value[5:].isdigit())), "'cpu', 'cuda' or 'cuda:N'"),
    "gradient_checkpointing": ((lambda value: True), "true or false"),
    "compile": ((lambda value: True), "true or false"), "progress": ((lambda value: True), "true or false"),
    "ring": ((lambda value: True), "true or false"), "ring_layout": _choices(RING_LAYOUTS),
    "data_parallel": _at_least(1), "context_parallel": _at_least(1), "fsdp": ((lambda value: True), "true or false"),
    "init_from": ((lambda value: bool(value)), "None or a checkpoint path"),
    "num_kv_heads": ((lambda value: value >= 1), "None or an integer >= 1 dividing num_heads"),
    "pack": ((lambda value: True), "true or false"),
}


@functools.lru_cache(maxsize=1)
def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(TrainConfig)


class _WrongType(Exception):
    pass


def _typed(value: Any, hint: Any) -> Any:
    """`value` as the annotation `hint` holds it (int for int, float for float, lists as lists); _WrongType
    for anything else: no bool for a number, no string for a number, no 0/1 or "false" for a bool."""
    origin, arguments = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in arguments:
            return None
        (hint,) = [a for a in arguments if a is not type(None)]
        origin, arguments = typing.get_origin(hint), typing.get_args(hint)
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return int(value)
    elif hint is float:
        if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    elif origin is list:
        if isinstance(value, (list, tuple)):
            return [_typed(item, arguments[0]) for item in value]
    else:  # pragma: no cover - a field type this checker does not know
        raise TypeError(f"TrainConfig field type {hint!r} has no check")
    raise _WrongType


def check_field(name: str, value: Any, hint: Any = None) -> Any:
    """The value of TrainConfig field `name` in its type (e.g. an int for a float field becomes a float);
    ValueError naming the field and its allowed values (FIELD_RULES) for a value of another type or range."""
    hint = _field_types()[name] if hint is None else hint
    predicate, allowed = FIELD_RULES[name]
    try:
        typed = _typed(value, hint)
    except _WrongType:
        raise ValueError(f"{name} must be {allowed}, got {value!r} ({type(value).__name__})") from None
    if typed is not None and not predicate(typed):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return typed


# Needle retrieval over 32K tokens on one GPU (bf16 autocast): the pair lies >= 8K tokens before the
# question, beyond the 2048- and 8192-token segments. Two things were needed to learn it with the dense
# top segment of "gpu-32k" (reports/results/train_gpu_h100*.json): rotary_base 1e6 (with the usual
# 10000 and head dim 32 the slowest rotary frequency turns a full circle over ~35K tokens, so no q/k
# channel can match content across 8K-32K tokens; a CPU exploration at the same ratio, N=1024, head
# dim 16, stayed at chance with base 367 and learned with base 56000) and a length curriculum (from
# scratch at 32K the needle holds ~1/32768 of the initial attention and 1000 steps stayed at chance;
# learned at 1K, the retrieval carries over to 32K within a few hundred steps). Intermediate evals use
# 64 samples, the final one 512 (final_eval_batches x batch_size).
_GPU_32K: dict[str, Any] = dict(
    seq_len=32768, context_length=32768 - 8192, num_keys=16, num_values=64, dim=256, depth=4, rotary_base=1e6,
    curriculum=[[1024, 1200], [4096, 1500], [16384, 1700]], steps=2400, batch_size=8, lr=1e-3, warmup_steps=50,
    autocast="bfloat16", device="cuda", eval_every=100, eval_batches=8, final_eval_batches=64, checkpoint_every=200,
    log_every=25)

_CPU_512: dict[str, Any] = dict(
    seq_len=512, context_length=384, num_keys=8, num_values=8, dim=64, depth=3, num_heads=8,
    curriculum=[[64, 400], [128, 600]], steps=800, batch_size=16, lr=3e-3, warmup_steps=20, eval_every=100,
    eval_batches=4, final_eval_batches=32, checkpoint_every=100, log_every=25)

PRESETS: dict[str, dict[str, Any]] = {
    # Needle retrieval over 64 tokens (pair in [0, 48), question at 62); the last segment spans the
    # sequence. About a minute on a 2-core CPU.
    "cpu-tiny": dict(seq_len=64, context_length=48, segment_lengths=[8, 16, 64], dilation_rates=[1, 2, 1], dim=64, depth=2,
                     num_heads=4, steps=300, batch_size=16, lr=3e-3, eval_every=50, eval_batches=8,
                     checkpoint_every=50),
    # The small-scale analogue of the 32K grid (CPU, 1-2 minutes per run on one core): N = 512, the pair
    # >= 127 tokens before the question (beyond the 32- and 128-token segments), a length curriculum from 64
    # tokens (where the rate-8/16 branch already spans the sequence, so the relay is learned cheaply); only
    # the pattern differs between the rows (reports/results/retrieval_grid_cpu.json). 300 steps with a short
    # curriculum stayed at chance for the dilated row, and so did depth 1 (an earlier layer must bind the value
    # to its key and, for a dilated branch, move it to a position of the question's residue); depth 2 learned.
    # With 4 heads for the rate-8 branch (the question's residue 6 has no head) it reached only 0.56 at step
    # 800 (a relay through covered positions near the question), against 0.99 with 8 heads.
    "cpu-512-dil8": dict(_CPU_512, segment_lengths=[32, 128, 512], dilation_rates=[1, 4, 8]),
    "cpu-512-dil16": dict(_CPU_512, segment_lengths=[32, 128, 512], dilation_rates=[1, 4, 16], num_heads=16),
    "cpu-512-dense": dict(_CPU_512, segment_lengths=[32, 128, 512], dilation_rates=[1, 4, 1]),
    "cpu-512-local": dict(_CPU_512, segment_lengths=[32, 128], dilation_rates=[1, 4]),
    # The committed 32K result: the last segment spans the sequence densely (see _GPU_32K).
    "gpu-32k": dict(_GPU_32K, segment_lengths=[2048, 8192, 32768], dilation_rates=[1, 4, 1], num_heads=8),
    # The 32K grid (benchmarks/train_retrieval_grid.py): the same task, model size (dim 256, depth 4),
    # curriculum and steps as "gpu-32k"; only the pattern (and the heads it needs) changes. In LongNet mode
    # a query q takes part in branch (w, r) only through the head whose offset is (q % w) % r and sees
    # only keys of that residue, so num_heads >= r (every offset covered) and depth >= 2 (a local dense
    # branch moves the needle to a position of the query's residue, the spanning branch carries it).
    # H100 (reports/results/retrieval_grid_h100.json, measured with older code (rev 8043871 + uncommitted
    # changes), 3 seeds each unless noted), with this curriculum: dense top
    # 0.881 (0.998, 0.645, 1.000), dil8 0.662 (0.29, 0.74, 0.95), dil16 0.678 (1 seed), local at chance. A seed
    # learns the task at 1K first (step 800-1200 or later), the dilated relay within ~200 steps of 16K: the
    # "-long1k" rows give the 1K phase until step 1600 (dil8 0.965, dil16 0.938); "-early16k" stays at chance.
    # Attention FLOPs per token (models.cost, causal forward, 4 layers) relative to "gpu-32k":
    # dil8 1/11.5 (w/r <= 4096), dil16 1/13.1 (w/r <= 2048), dil16-w1024 1/27.6 (w/r <= 2048),
    # local 1/13.8 (control: no branch spans the sequence, must stay at chance 1/64). The plan counts a query
    # of a rate-r branch in H/r heads only (its offset's), each seeing w/r keys; charging every head w/r keys
    # per query would give dil8 1/4.5 instead.
    "gpu-32k-dil8": dict(_GPU_32K, segment_lengths=[2048, 8192, 32768], dilation_rates=[1, 4, 8], num_heads=8),
    # dil8 with a curriculum that reaches 16K at step 500 (gpu-32k's reaches it at 1500): from 16K on only
    # the 32768 rate-8 branch spans the sequence, so that is where the relay it needs is learned; the 1K
    # and 4K phases are solved by the 2048 dense and 8192 rate-4 branches.
    "gpu-32k-dil8-early16k": dict(_GPU_32K, segment_lengths=[2048, 8192, 32768], dilation_rates=[1, 4, 8],
                                  num_heads=8, curriculum=[[1024, 200], [4096, 500], [16384, 1400]]),
    # dil8 with a longer 1K phase: in every gpu-32k-dil8 seed the whole task (binding, matching) is learned
    # first at 1K through the dense 2048 branch, at step 800-1200 or not at all; the relay of the 32768
    # rate-8 branch follows within ~200 steps of 16K.
    "gpu-32k-dil8-long1k": dict(_GPU_32K, segment_lengths=[2048, 8192, 32768], dilation_rates=[1, 4, 8],
                                num_heads=8, curriculum=[[1024, 1600], [16384, 1900]]),
    "gpu-32k-dil16-long1k": dict(_GPU_32K, segment_lengths=[2048, 8192, 32768], dilation_rates=[1, 4, 16],
                                 num_heads=16, curriculum=[[1024, 1600], [16384, 1900]]),
    # 128K: gpu-32k-dil8-long1k's model fine-tuned (benchmarks/train_gpu.py --init-from its checkpoint) with a
    # fourth branch spanning the sequence at the same 4096 keys per query; the pair >= 32K before the question.
    # With 8 heads the rate-32 branch covers offsets 0-7 only: the needle is relayed through those positions.
    "gpu-128k-dil8": dict(_GPU_32K, seq_len=131072, context_length=131072 - 32768, curriculum=[],
                          segment_lengths=[2048, 8192, 32768, 131072], dilation_rates=[1, 4, 8, 32], num_heads=8,
                          batch_size=4, steps=500, lr=5e-4, warmup_steps=20, eval_every=50, eval_batches=16,
                          final_eval_batches=128, checkpoint_every=100),
    "gpu-32k-dil16": dict(_GPU_32K, segment_lengths=[2048, 8192, 32768], dilation_rates=[1, 4, 16], num_heads=16),
    "gpu-32k-dil16-w1024": dict(_GPU_32K, segment_lengths=[1024, 8192, 32768], dilation_rates=[1, 8, 16],
                                num_heads=16),
    "gpu-32k-local": dict(_GPU_32K, segment_lengths=[2048, 8192], dilation_rates=[1, 4], num_heads=8),
}


def parse_curriculum(text: str) -> list[list[int]]:
    """'1024:800,4096:1000' -> [[1024, 800], [4096, 1000]] (seq_len:until_step pairs)."""
    try:
        pairs = [part.split(":") for part in text.split(",") if part.strip()]
        return [[parse_int(length), parse_int(until)] for length, until in pairs]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seq_len:until_step pairs like 1024:800,4096:1000, got {text!r}") from None
