"""Data and context parallelism of a LongNet model on a DeviceMesh, with PyTorch's FSDP2, as torchtitan applies them.

``parallelize(model, mesh)`` takes a mesh whose dimensions are named "dp" (data parallel: ranks hold different
rows of the batch) and/or "cp" (context parallel: ranks hold shards of each sequence). Along "cp" every block's
attention becomes ring attention over that dimension's group (models.ring.use_ring_attention); FSDP2
(``fully_shard``) shards parameters, gradients and optimizer state over "cp" and replicates them over "dp"
(HSDP; a 1-D mesh shards over its one dimension), so gradients are reduced over both. ``local_batch`` cuts a
rank's rows and sequence positions out of the global batch and ``mean_token_loss`` gives the loss whose
gradients, reduced by FSDP, equal those of the single-process mean over every token of the global batch.
``save_sharded`` / ``load_sharded`` keep model and optimizer state with torch.distributed.checkpoint, so a run
resumes on another number of ranks, one process included.

The ring (hilbert_lab.distributed) is a peer package, imported when a mesh is used, as in models.ring.
"""
from __future__ import annotations

import hashlib
import json
import warnings
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .ring import _blocks, use_ring_attention

MESH_DIMS = ("dp", "cp")


def _check_mesh(mesh) -> tuple[str, ...]:
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    if not names or len(set(names)) != len(names) or not set(names) <= set(MESH_DIMS) or \
            (len(names) == 2 and names != MESH_DIMS):
        raise ValueError(f"mesh must be a DeviceMesh with dimensions named 'dp' and/or 'cp' (in that order), got "
                         f"dimension names {names or None}")
    return names


def degrees(mesh) -> tuple[int, int]:
    """(data-parallel degree, context-parallel degree) of the mesh (1 for a dimension it lacks)."""
    names = _check_mesh(mesh)
    return tuple(mesh[name].size() if name in names else 1 for name in MESH_DIMS)


def coordinates(mesh) -> tuple[int, int]:
    """This rank's (data-parallel index, context-parallel index) on the mesh (0 for a dimension it lacks)."""
    names = _check_mesh(mesh)
    return tuple(mesh[name].get_local_rank() if name in names else 0 for name in MESH_DIMS)


def init_mesh(data_parallel: int, context_parallel: int, device_type: str = "cpu"):
    """A DeviceMesh over the world of the initialised process group: dimensions ("dp", "cp") of these degrees,
    or the one of them above 1 (a 1-D mesh). ValueError, the same on every rank, unless a process group is
    initialised and the degrees' product is its world size."""
    from torch.distributed.device_mesh import init_device_mesh

    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(f"data_parallel={data_parallel} x context_parallel={context_parallel} needs an initialised "
                         "torch.distributed process group: run under torchrun with that many processes")
    world = dist.get_world_size()
    if data_parallel * context_parallel != world:
        raise ValueError(f"data_parallel x context_parallel must equal the world size {world}, got {data_parallel} x "
                         f"{context_parallel}")
    if data_parallel > 1 and context_parallel > 1:
        return init_device_mesh(device_type, (data_parallel, context_parallel), mesh_dim_names=MESH_DIMS)
    return init_device_mesh(device_type, (world,), mesh_dim_names=("dp" if data_parallel > 1 else "cp",))


def check_agreement(what: str, value) -> None:
    """ValueError on every rank of the initialised process group unless all ranks pass an equal `value` (a
    JSON-able description of `what`, e.g. a run's configuration and folder); the message names the ranks that
    differ from rank 0."""
    text = json.dumps(value, sort_keys=True, default=str)
    digests = [None] * dist.get_world_size()
    dist.all_gather_object(digests, hashlib.sha256(text.encode()).hexdigest())
    differing = [rank for rank, digest in enumerate(digests) if digest != digests[0]]
    if differing:
        raise ValueError(f"every rank must start with the same {what}; ranks {differing} differ from rank 0 (launch "
                         "every rank with the same command)")


def parallelize(model: nn.Module, mesh, *, layout: str = "contiguous",
                param_dtype: Optional[torch.dtype] = None) -> nn.Module:
    """Ring attention over the mesh's "cp" dimension and FSDP2 over the mesh (in place; returns ``model``).

    model: a LongNetLM or LongNetEncoder (its DilatedTransformerBlocks are sharded one by one, then the rest).
    layout: the ring's sequence layout ("contiguous", or "zigzag", which balances causal work). param_dtype:
    the compute dtype of FSDP's mixed precision (e.g. torch.bfloat16; parameters stay in their dtype and
    gradients are reduced in float32); None keeps the parameters' dtype."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    names = _check_mesh(mesh)
    _, cp = degrees(mesh)
    if cp > 1:
        use_ring_attention(model, group=mesh["cp"].get_group(), layout=layout)
    policy = MixedPrecisionPolicy() if param_dtype is None else \
        MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)  # float32 master weights
    shard_mesh = mesh if len(names) == 2 else mesh[names[0]]
    for block in _blocks(model):
        fully_shard(block, mesh=shard_mesh, mp_policy=policy)
    fully_shard(model, mesh=shard_mesh, mp_policy=policy)
    return model


def local_batch(mesh, tokens: torch.Tensor, targets: torch.Tensor, *,
                layout: str = "contiguous") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens, targets, positions) of this rank: its "dp" share of the rows of the global (B, N) batch (B
    divisible by the dp degree) and its "cp" shard of the positions (ring layout `layout`)."""
    from hilbert_lab.distributed import shard_positions

    dp, cp = degrees(mesh)
    dp_index, cp_index = coordinates(mesh)
    if tokens.shape != targets.shape or tokens.dim() != 2:
        raise ValueError(f"tokens and targets must be (B, N) of one shape, got {tuple(tokens.shape)} and "
                         f"{tuple(targets.shape)}")
    if tokens.shape[0] % dp:
        raise ValueError(f"the batch ({tokens.shape[0]} rows) must divide among the {dp} data-parallel ranks")
    rows = slice(dp_index * tokens.shape[0] // dp, (dp_index + 1) * tokens.shape[0] // dp)
    positions = shard_positions(cp_index, cp, tokens.shape[1], layout).to(tokens.device)
    return tokens[rows][:, positions], targets[rows][:, positions], positions


def mean_token_loss(logits: torch.Tensor, targets: torch.Tensor, mesh,
                    ignore_index: int = -100) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss to call backward on, the mean cross-entropy over every counted token of the global batch, detached).

    logits (b, n, V) and targets (b, n) of this rank. FSDP averages gradients over the mesh's ranks, so this
    rank's loss is its token sum times (ranks / tokens of the global batch): the averaged gradients are then
    those of the global mean. The token count and the mean are reduced over the mesh (one all-reduce each)."""
    _check_mesh(mesh)
    wide = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    token_sum = F.cross_entropy(wide.flatten(0, 1), targets.flatten(), ignore_index=ignore_index, reduction="sum")
    counted = torch.stack([(targets != ignore_index).sum().to(torch.float64), token_sum.detach().to(torch.float64)])
    group = _flat_group(mesh)
    dist.all_reduce(counted, group=group)
    total, summed = counted[0].clamp_min(1), counted[1]
    ranks = dist.get_world_size(group)
    return token_sum * (ranks / total).to(token_sum.dtype), summed / total


def _flat_group(mesh):
    """The process group of every rank of the mesh: its one dimension's, or the world's for a 2-D mesh (which
    must then span the world)."""
    names = _check_mesh(mesh)
    if len(names) == 1:
        return mesh[names[0]].get_group()
    if mesh.size() != dist.get_world_size():
        raise ValueError(f"a 2-D mesh must span every rank ({dist.get_world_size()}), got {mesh.size()} ranks")
    return None


def save_sharded(path: str, model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None) -> None:
    """Save model (and optimizer) state with torch.distributed.checkpoint: every rank writes its shards to the
    folder `path`; a later run loads it on any number of ranks, one process included (`load_sharded`)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, [] if optimizer is None else [optimizer])
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=path)


def load_sharded(path: str, model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None) -> None:
    """Load what `save_sharded` wrote into model (and optimizer), resharded to this run's mesh: a parallelized
    model on any mesh, or a plain model in one process (no process group needed)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    optimizers = [] if optimizer is None else [optimizer]
    model_state, optimizer_state = get_state_dict(model, optimizers)
    state = {"model": model_state, "optimizer": optimizer_state}
    alone = not (dist.is_available() and dist.is_initialized())
    with warnings.catch_warnings():  # in one process: its notice that it assumes so
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.load(state, checkpoint_id=path, no_dist=alone)
    set_state_dict(model, optimizers, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
