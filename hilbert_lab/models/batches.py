"""A rank's part of a training or evaluation batch of the retrieval task: the batch of a step (plain or packed),
its logits and targets (the whole batch, this rank's ring shard, or its rows and shard of a DeviceMesh) under the
configured autocast, the answer loss, and sums over the ranks."""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from .positions import document_positions
from .config import TrainConfig
from .packing import make_packed_batch
from .parallel import local_batch
from .tasks import IGNORE_INDEX, make_batch


def widened(logits: torch.Tensor) -> torch.Tensor:
    """float16 / bfloat16 logits as float32 for the loss; float32 and float64 as they are."""
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def answer_loss(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Summed cross-entropy over the positions with a target (in float32 at least), the number of correct
    argmaxes, and the number of such positions. logits (B, N, V), targets (B, N)."""
    mask = targets != IGNORE_INDEX
    selected = widened(logits[mask])
    wanted = targets[mask]
    loss_sum = F.cross_entropy(selected, wanted, reduction="sum")
    return loss_sum, (selected.argmax(dim=-1) == wanted).sum(), int(wanted.numel())


def autocast_scope(config: TrainConfig):
    """The configured torch.autocast (none on a mesh, where FSDP's mixed precision casts instead)."""
    if config.autocast == "none" or config.on_mesh:
        return contextlib.nullcontext()
    device_type = torch.device(config.device).type
    return torch.autocast(device_type=device_type, dtype=getattr(torch, config.autocast))


def sequence_positions(config: TrainConfig, seq_len: int | None = None) -> torch.Tensor | None:
    """This rank's original positions of a seq_len sequence (default config.seq_len) sharded over the
    ranks (config.ring), else None."""
    if not config.ring:
        return None
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("ring=True needs an initialised torch.distributed process group (e.g. run under torchrun)")
    from hilbert_lab.distributed import shard_positions

    length = config.seq_len if seq_len is None else seq_len
    return shard_positions(dist.get_rank(), dist.get_world_size(), length, config.ring_layout)


def is_main_rank() -> bool:
    """Whether this process is rank 0 of the initialised process group, or the only process."""
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def all_reduce_sum(values: list[float], config: TrainConfig, mesh=None) -> list[float]:
    """values summed over the ranks where each holds a part of the batch (config.ring, or a `mesh`), else as given."""
    if not (config.ring or mesh is not None):
        return values
    import torch.distributed as dist

    from hilbert_lab.distributed import settle_transfers

    settle_transfers()  # the host waits for the device here anyway: check the ring's last steps, bounded
    buffer = torch.tensor(values, dtype=torch.float64, device=config.device)
    dist.all_reduce(buffer)
    return buffer.tolist()


def batch_logits(runner, tokens, targets, positions, config: TrainConfig, cu_seqlens=None, mesh=None):
    """(logits, targets) of this rank's part of the batch (the whole batch without ring or mesh); cu_seqlens: the
    documents of a packed row; mesh: this rank's rows and sequence shard of it (models.parallel.local_batch)."""
    if mesh is not None:
        tokens, targets, positions = local_batch(mesh, tokens, targets, layout=config.ring_layout)
        if cu_seqlens is not None:  # the shard's positions in their documents; the ring reads the whole row's
            documents = document_positions(cu_seqlens, config.device)  # boundaries stay in host memory
            return runner(tokens.to(config.device), documents[positions.to(config.device)],
                          cu_seqlens=cu_seqlens), targets.to(config.device)
        return runner(tokens.to(config.device), positions.to(config.device)), targets.to(config.device)
    tokens, targets = tokens.to(config.device), targets.to(config.device)
    with autocast_scope(config):
        if cu_seqlens is not None:  # boundaries in host memory: read with no device synchronisation
            return runner(tokens, cu_seqlens=cu_seqlens), targets
        if positions is None:
            return runner(tokens), targets
        positions = positions.to(config.device)
        return runner(tokens[:, positions], positions), targets[:, positions]


def training_batch(config: TrainConfig, step: int):
    """(tokens, targets, cu_seqlens or None) of training `step`: batch_size samples, or with config.pack one
    packed row of documents holding the same number of tokens."""
    task = config.task(step)
    if config.pack:
        packed = make_packed_batch(task, config.batch_size, seed=config.seed, split="train", step=step)
        return packed.tokens, packed.targets, packed.cu_seqlens
    tokens, targets = make_batch(task, config.batch_size, seed=config.seed, split="train", step=step)
    return tokens, targets, None
