"""Where the curve matters: a synthetic spatial task, a serialized LongNet classifier and its training.

Task (``MajorityTask``; nothing is downloaded, every batch is a pure function of (seed, split, step)):
each token of a 2D grid or a 3D point cloud carries a random bit (Bernoulli(1/2)); its label is the
majority of the bits in its spatial neighbourhood, itself included: on a grid the cells within
Euclidean distance ``radius`` (cells outside the grid count as 0; the disk has an odd number of
cells, so there are no ties), in a point cloud the ``neighbours`` (odd) nearest points. A token
that sees all of its neighbourhood can be 100% right; one that sees part of it is limited by
chance (50% with nothing), so the accuracy a model reaches measures how much spatial context its
attention windows deliver.

Model (``SpatialClassifier``): bit embedding + a linear map of Fourier features of the coordinates,
the blocks of a ``LongNetEncoder`` (no rotary: the coordinates carry the position), a 2-way head.
Before block l the tokens are serialized by ``orderings[l]`` (one name for all blocks, or one per
block, e.g. PTv3-style alternation) and put back afterwards, so the dilated pattern applies to
serialized positions and every ordering costs the same compute.
"""
from __future__ import annotations

import math
import time
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from hilbert_lab.attention.serialized import permute_tokens

from .blocks import LongNetEncoder

TASK_KINDS = ("grid", "points")
SPLITS = ("train", "eval")
# two-sided 95% Student t quantiles for 1..30 degrees of freedom
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)


@dataclass(frozen=True)
class MajorityTask:
    """Per-token majority of random bits over a spatial neighbourhood (module docstring).

    kind "grid": ``grid_shape`` (H, W) and ``radius`` (cells); kind "points": ``num_points`` points
    in the unit cube (``ndim`` 3), uniform or, with ``clusters`` > 0, Gaussian blobs of std
    ``spread``, labelled over their ``neighbours`` nearest points (odd, the point included).
    """

    kind: str = "grid"
    grid_shape: tuple[int, ...] = (16, 16)
    radius: float = 1.0
    num_points: int = 512
    ndim: int = 3
    neighbours: int = 9
    clusters: int = 0
    spread: float = 0.05

    def __post_init__(self) -> None:
        if self.kind not in TASK_KINDS:
            raise ValueError(f"kind must be one of {TASK_KINDS}, got {self.kind!r}")
        if self.kind == "grid":
            shape = tuple(self.grid_shape)
            if len(shape) not in (2, 3) or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shape):
                raise ValueError(f"grid_shape must be (H, W) or (T, H, W) of positive ints, got {self.grid_shape!r}")
            object.__setattr__(self, "grid_shape", shape)
            if not self.radius >= 1:
                raise ValueError(f"radius must be >= 1, got {self.radius!r}")
        else:
            if isinstance(self.num_points, bool) or not isinstance(self.num_points, int) or self.num_points < 2:
                raise ValueError(f"num_points must be an integer >= 2, got {self.num_points!r}")
            if self.ndim not in (2, 3):
                raise ValueError(f"ndim must be 2 or 3, got {self.ndim!r}")
            if not isinstance(self.neighbours, int) or self.neighbours < 1 or self.neighbours % 2 == 0 \
                    or self.neighbours > self.num_points:
                raise ValueError(f"neighbours must be an odd integer in [1, num_points], got {self.neighbours!r}")

    @property
    def num_tokens(self) -> int:
        return math.prod(self.grid_shape) if self.kind == "grid" else self.num_points

    @property
    def coord_dims(self) -> int:
        return len(self.grid_shape) if self.kind == "grid" else self.ndim

    def disk_offsets(self) -> torch.Tensor:
        """(M, ndim) int64 grid offsets (x, y[, z]) within ``radius`` (M odd, origin included)."""
        reach = int(math.floor(self.radius))
        axes = [torch.arange(-reach, reach + 1)] * len(self.grid_shape)
        offsets = torch.cartesian_prod(*axes).reshape(-1, len(self.grid_shape))
        return offsets[(offsets.double() ** 2).sum(1) <= self.radius**2 + 1e-9]


def _generator(seed: int, split: str, step: int) -> torch.Generator:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return torch.Generator().manual_seed(zlib.crc32(f"spatial/{int(seed)}/{split}/{int(step)}".encode()))


def grid_coordinates(shape: Sequence[int]) -> torch.Tensor:
    """(prod(shape), ndim) float64 cell coordinates (x, y[, z]) of a row-major grid, scaled to [0, 1)."""
    shape = tuple(int(s) for s in shape)
    cells = torch.cartesian_prod(*[torch.arange(s) for s in shape]).reshape(-1, len(shape)).flip(-1)
    sides = torch.tensor(shape[::-1], dtype=torch.float64)
    return cells.double() / sides


def _grid_labels(task: MajorityTask, bits: torch.Tensor) -> torch.Tensor:
    """Majority over the disk of every cell (zero padding): bits (B, N) -> labels (B, N)."""
    shape = task.grid_shape
    field_ = bits.reshape(bits.shape[0], 1, *shape).float()
    offsets = task.disk_offsets()
    reach = int(math.floor(task.radius))
    kernel = torch.zeros((1, 1) + (2 * reach + 1,) * len(shape), device=bits.device)
    for offset in offsets.tolist():  # offsets are (x, y[, z]); the field is (..., [z,] y, x)
        kernel[(0, 0) + tuple(reach + o for o in offset[::-1])] = 1.0
    conv = F.conv2d if len(shape) == 2 else F.conv3d
    counts = conv(field_, kernel, padding=reach).reshape(bits.shape)
    return (2 * counts > len(offsets)).long()


def _point_labels(task: MajorityTask, bits: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """Majority over each point's `neighbours` nearest points (itself included): -> labels (B, N)."""
    distances = torch.cdist(points, points)  # (B, N, N)
    nearest = distances.topk(task.neighbours, dim=-1, largest=False).indices  # (B, N, k), self first
    counts = bits.gather(1, nearest.flatten(1)).reshape(nearest.shape).sum(-1)
    return (2 * counts > task.neighbours).long()


def make_spatial_batch(task: MajorityTask, batch_size: int, *, seed: int = 0, split: str = "train", step: int = 0,
                       device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """One batch: bits (B, N) int64, coords (B, N, d) float32 in [0, 1], labels (B, N) int64.

    Grid tokens are in row-major order; point clouds are random per sample. Deterministic in
    (task, batch_size, seed, split, step).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    generator = _generator(seed, split, step)
    n = task.num_tokens
    bits = torch.randint(0, 2, (batch_size, n), generator=generator).to(device)
    if task.kind == "grid":
        coords = grid_coordinates(task.grid_shape).float().to(device).expand(batch_size, n, task.coord_dims)
        labels = _grid_labels(task, bits)
    else:
        shape = (batch_size, n, task.ndim)
        if task.clusters > 0:
            centres = torch.rand(batch_size, task.clusters, task.ndim, generator=generator, dtype=torch.float64)
            which = torch.randint(0, task.clusters, (batch_size, n), generator=generator)
            jitter = torch.randn(shape, generator=generator, dtype=torch.float64) * task.spread
            points = (centres.gather(1, which[..., None].expand(shape)) + jitter).clamp(0.0, 1.0)
        else:
            points = torch.rand(shape, generator=generator, dtype=torch.float64)
        points = points.to(device)
        labels = _point_labels(task, bits, points)
        coords = points.float()
    return {"bits": bits, "coords": coords, "labels": labels}


class SpatialClassifier(nn.Module):
    """Serialized LongNet per-token classifier: bits (B, N), coords (B, N, d) -> logits (B, N, 2).

    orderings: one name of ``hilbert_lab.curves.SERIALIZATIONS`` for every block, or one per block.
    grid_shape: set for grid tasks (fixed, cached serialization); None for point clouds (serialized
    per sample from the coordinates with ``grid_size``).
    """

    def __init__(self, coord_dims: int, dim: int, depth: int, num_heads: int, segment_lengths: Sequence[int],
                 dilation_rates: Sequence[int], orderings: str | Sequence[str] = "hilbert", *,
                 grid_shape: Optional[Sequence[int]] = None, grid_size: Optional[float] = None,
                 frequencies: int = 8, mlp_ratio: float = 2.0, backend: str = "auto") -> None:
        super().__init__()
        from hilbert_lab.curves import SERIALIZATIONS  # noqa: PLC0415

        orderings = [orderings] * depth if isinstance(orderings, str) else list(orderings)
        if len(orderings) != depth or any(o not in SERIALIZATIONS for o in orderings):
            raise ValueError(f"orderings must be one of {SERIALIZATIONS} or a list of {depth} of them, got {orderings!r}")
        self.orderings = orderings
        self.grid_shape = None if grid_shape is None else tuple(int(s) for s in grid_shape)
        self.grid_size = grid_size
        self.register_buffer("frequencies", math.pi * 2.0 ** torch.arange(frequencies, dtype=torch.float32),
                             persistent=False)
        self.bit_embedding = nn.Embedding(2, dim)
        self.position = nn.Linear(2 * frequencies * coord_dims, dim)
        self.encoder = LongNetEncoder(dim, depth, num_heads, segment_lengths, dilation_rates, rotary=False,
                                      mlp_ratio=mlp_ratio, backend=backend)
        self.head = nn.Linear(dim, 2)
        self._grid_cache: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor]] = {}

    def serialization(self, ordering: str, coords: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(perm, inverse): (N,) for a grid model, (B, N) from the coordinates of a point model."""
        from hilbert_lab.curves import serialize  # noqa: PLC0415

        if self.grid_shape is None:
            return serialize(coords.detach(), ordering, grid_size=self.grid_size)
        key = (ordering, str(coords.device))
        if key not in self._grid_cache:
            perm, inverse = serialize(self.grid_shape, ordering)
            self._grid_cache[key] = (torch.tensor(perm, device=coords.device), torch.tensor(inverse, device=coords.device))
        return self._grid_cache[key]

    def forward(self, bits: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
        angles = coords.unsqueeze(-1) * self.frequencies  # (B, N, d, F)
        fourier = torch.cat((angles.sin(), angles.cos()), dim=-1).flatten(2)
        x = self.bit_embedding(bits) + self.position(fourier)
        pairs = {o: self.serialization(o, coords) for o in dict.fromkeys(self.orderings)}
        positions = torch.arange(x.shape[1], device=x.device)
        for ordering, block in zip(self.orderings, self.encoder.blocks):
            perm, inverse = pairs[ordering]
            x = permute_tokens(block(permute_tokens(x, perm), positions), inverse)
        return self.head(self.encoder.norm(x))


@dataclass
class SpatialRunConfig:
    """Model and optimisation of one training run (the task is separate)."""

    dim: int = 32
    depth: int = 2
    num_heads: int = 2
    segment_lengths: list[int] = field(default_factory=lambda: [16])
    dilation_rates: list[int] = field(default_factory=lambda: [1])
    frequencies: int = 6
    mlp_ratio: float = 2.0
    steps: int = 200
    batch_size: int = 16
    lr: float = 3e-3
    warmup_steps: int = 20
    eval_batches: int = 4
    eval_batch_size: int = 16
    backend: str = "auto"
    device: str = "cpu"
    autocast: str = "none"  # "bfloat16" on CUDA


def build_spatial_model(task: MajorityTask, config: SpatialRunConfig, orderings: str | Sequence[str]) -> SpatialClassifier:
    return SpatialClassifier(
        task.coord_dims, config.dim, config.depth, config.num_heads, config.segment_lengths, config.dilation_rates,
        orderings, grid_shape=task.grid_shape if task.kind == "grid" else None, frequencies=config.frequencies,
        mlp_ratio=config.mlp_ratio, backend=config.backend,
    )


def _autocast(config: SpatialRunConfig):
    if config.autocast == "none":
        return torch.autocast("cpu", enabled=False)
    if config.autocast != "bfloat16":
        raise ValueError(f"autocast must be 'none' or 'bfloat16', got {config.autocast!r}")
    return torch.autocast(torch.device(config.device).type, dtype=torch.bfloat16)


@torch.no_grad()
def evaluate_spatial(model: nn.Module, task: MajorityTask, config: SpatialRunConfig, *, seed: int) -> dict[str, float]:
    """Token accuracy and loss on `eval_batches` fixed eval batches (the same for every model with this seed)."""
    was_training = model.training
    model.eval()
    correct = total = 0
    loss_sum = 0.0
    for step in range(config.eval_batches):
        batch = make_spatial_batch(task, config.eval_batch_size, seed=seed, split="eval", step=step, device=config.device)
        with _autocast(config):
            logits = model(batch["bits"], batch["coords"]).float()
        loss_sum += float(F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), reduction="sum"))
        correct += int((logits.argmax(-1) == batch["labels"]).sum())
        total += batch["labels"].numel()
    model.train(was_training)
    return {"accuracy": correct / total, "loss": loss_sum / total, "tokens": total}


def train_spatial(task: MajorityTask, config: SpatialRunConfig, orderings: str | Sequence[str], *, seed: int = 0,
                  progress: Optional[Callable[[str], None]] = None) -> dict[str, Any]:
    """Train one model from scratch; returns the final eval, the loss curve and the wall time."""
    torch.manual_seed(seed)
    model = build_spatial_model(task, config, orderings).to(config.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    schedule = lambda step: min(1.0, (step + 1) / max(1, config.warmup_steps)) * 0.5 * (  # noqa: E731
        1 + math.cos(math.pi * min(step, config.steps) / max(1, config.steps)))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    start = time.perf_counter()
    curve = []
    for step in range(config.steps):
        batch = make_spatial_batch(task, config.batch_size, seed=seed, split="train", step=step, device=config.device)
        with _autocast(config):
            logits = model(batch["bits"], batch["coords"]).float()
        loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        if step % max(1, config.steps // 20) == 0 or step == config.steps - 1:
            curve.append([step, float(loss.detach())])
    evaluation = evaluate_spatial(model, task, config, seed=seed)
    seconds = time.perf_counter() - start
    if progress is not None:
        progress(f"orderings={orderings} seed={seed}: accuracy {evaluation['accuracy']:.4f} ({seconds:.1f} s)")
    return {"orderings": [orderings] if isinstance(orderings, str) else list(orderings), "seed": seed, **evaluation,
            "loss_curve": curve, "seconds": seconds, "parameters": sum(p.numel() for p in model.parameters())}


def mean_interval(values: Sequence[float]) -> dict[str, float]:
    """Mean and two-sided 95% Student t interval over independent runs (seeds): {mean, low, high, n}."""
    values = [float(v) for v in values]
    n = len(values)
    if n == 0:
        raise ValueError("values must hold at least one number")
    mean = sum(values) / n
    if n == 1:
        return {"mean": mean, "low": mean, "high": mean, "n": 1}
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = (_T95[n - 2] if n - 1 <= len(_T95) else 1.96) * sd / math.sqrt(n)
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": n}


def compare_trained(task: MajorityTask, config: SpatialRunConfig, orderings: Sequence[str | Sequence[str]],
                    seeds: Sequence[int], *, progress: Optional[Callable[[str], None]] = None) -> dict[str, Any]:
    """Train every ordering with every seed (same task, model and compute); runs + per-ordering intervals."""
    runs = [train_spatial(task, config, o, seed=s, progress=progress) for o in orderings for s in seeds]
    summary = []
    for ordering in orderings:
        label = ordering if isinstance(ordering, str) else "/".join(ordering)
        accs = [r["accuracy"] for r in runs if r["orderings"] == ([ordering] if isinstance(ordering, str) else list(ordering))]
        summary.append({"ordering": label, **mean_interval(accs)})
    summary.sort(key=lambda row: -row["mean"])
    return {"task": asdict(task), "config": asdict(config), "runs": runs, "summary": summary}
