"""In-place SDPA executor: the plan's blocks read as strided views by cuDNN / flash kernels (no gather).

Each block of the plan is one kernel call on (B * count, h, L, D) views of q, k, v in their own
(B, N, H, D) memory; the kernel's output is written into the output's view, its LSE into a
(B, N, H) buffer. Branches that share (position, head) pairs (longnet mode) are merged by LSE.
Backward calls each block's fused backward with the *merged* output and LSE (exact gradients,
through the merge weights too); blocks that own their entries write gradients in place, merged
ones accumulate in float32. Used by the engine for the "sdpa" backends on CUDA with fp16/bf16.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from hilbert_lab.attention.merge import merge_lse
from hilbert_lab.attention.plan import Block, Plan
from hilbert_lab.kernels import triton_merge

aten = torch.ops.aten
KERNELS = ("cudnn", "flash")


@dataclass(frozen=True)
class _Unit:
    """Blocks run by one set of kernel calls: one block, or G blocks of one branch with consecutive
    offsets o0 + g and heads h0 + g * head_shift + i * head_step (i < heads), read as one view whose
    "head" axis walks the G offsets together (address step: one position plus head_shift heads)."""

    blocks: tuple[Block, ...]
    head_shift: int = 0

    @property
    def branch(self) -> int:
        return self.blocks[0].branch


_CACHE: dict[tuple, tuple] = {}  # (id(plan), ...) -> (plan, value): the plan is kept so its id stays its own


def _cached(key: tuple, plan: Plan, compute):
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is plan:
        return hit[1]
    if len(_CACHE) > 512:
        _CACHE.clear()
    value = compute()
    _CACHE[key] = (plan, value)
    return value


def plan_units(plan: Plan) -> tuple[_Unit, ...]:
    """The plan's blocks grouped into units (fewer kernel calls where offsets fold into one view)."""
    return _cached((id(plan), "units"), plan, lambda: _units(plan))


def _units(plan: Plan) -> tuple[_Unit, ...]:
    groups: dict[tuple, list[Block]] = {}
    for blk in plan.blocks:
        if blk.index is not None:
            return tuple(_Unit((b,)) for b in plan.blocks)
        key = (blk.branch, blk.start, blk.count, blk.seg, blk.step, blk.length, blk.num_heads, blk.heads.step or 1)
        groups.setdefault(key, []).append(blk)
    units = []
    for members in groups.values():
        members.sort(key=lambda b: b.offset)
        shifts = {b.heads.start - a.heads.start for a, b in zip(members, members[1:])}
        consecutive = all(b.offset == a.offset + 1 for a, b in zip(members, members[1:]))
        if len(members) > 1 and consecutive and len(shifts) == 1 and members[0].num_heads < len(members):
            units.append(_Unit(tuple(members), shifts.pop()))
        else:
            units.extend(_Unit((b,)) for b in members)
    return tuple(units)


def _pieces(unit: _Unit, shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[tuple, ...]:
    """((size, stride, storage offset delta), ...): the unit as (Bc, heads, L, *rest) views of a tensor of
    `shape` / `stride` (B, N, H, *rest); the batch folds with the segments where the strides allow."""
    first = unit.blocks[0]
    s_b, s_n, s_h, *rest = stride
    base = (first.start + first.offset) * s_n + first.heads.start * s_h
    head_step = (first.heads.step or 1) * s_h
    if len(unit.blocks) == 1:  # heads of one block on the head axis
        calls = [((first.num_heads,), (head_step,), 0)]
    else:  # the G offsets on the head axis, one call per head of a block
        calls = [((len(unit.blocks),), (s_n + unit.head_shift * s_h,), i * head_step) for i in range(first.num_heads)]
    tail_size, tail_stride = tuple(shape[3:]), tuple(rest)
    batch = shape[0]
    fold = batch == 1 or first.count == 1 or s_b == first.count * first.seg * s_n
    pieces = []
    for heads, heads_stride, shift in calls:
        size = heads + (first.length,) + tail_size
        inner = heads_stride + (first.step * s_n,) + tail_stride
        if fold:
            outer = first.seg * s_n if first.count > 1 else s_b
            pieces.append(((batch * first.count,) + size, (outer,) + inner, base + shift))
        else:
            pieces.extend(((first.count,) + size, (first.seg * s_n,) + inner, base + shift + b * s_b)
                          for b in range(batch))
    return tuple(pieces)


def _geometry(plan: Plan, x: torch.Tensor) -> tuple[tuple[tuple, ...], ...]:
    """Per unit of the plan, the pieces of x (cached per plan, shape and strides)."""
    shape, stride = tuple(x.shape), x.stride()
    return _cached((id(plan), shape, stride), plan, lambda: tuple(_pieces(u, shape, stride) for u in plan_units(plan)))


def _views(unit: _Unit, x: torch.Tensor) -> list[torch.Tensor]:
    return [x.as_strided(size, stride, x.storage_offset() + delta)
            for size, stride, delta in _pieces(unit, tuple(x.shape), tuple(x.stride()))]


def _plan_views(plan: Plan, tensors: list[torch.Tensor]) -> list[list[tuple[torch.Tensor, ...]]]:
    """Per unit, per piece, one view of each tensor. The first tensor is a fresh contiguous buffer; any
    other that splits differently (its batch does not fold like the buffer's) is read from a copy."""
    geometries = [_geometry(plan, t) for t in tensors]
    result = []
    for i in range(len(geometries[0])):
        count = len(geometries[0][i])
        per_tensor = []
        for t, geometry in zip(tensors, geometries):
            pieces = geometry[i]
            if len(pieces) != count:
                t = t.contiguous()
                pieces = _geometry(plan, t)[i]
            offset = t.storage_offset()
            per_tensor.append([t.as_strided(size, stride, offset + delta) for size, stride, delta in pieces])
        result.append(list(zip(*per_tensor)))
    return result


def _forward_kernel(kernel: str, q, k, v, causal: bool, scale: float, need_lse: bool = True):
    if kernel == "cudnn":
        out, lse, cq, ck, mq, mk, seed, offset, _ = aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, need_lse, 0.0, causal, False, scale=scale)
        return out, (lse.view(lse.shape[:3]) if need_lse else None), (cq, ck, mq, mk, seed, offset)
    out, lse, cq, ck, mq, mk, seed, offset, _ = aten._scaled_dot_product_flash_attention(
        q, k, v, 0.0, causal, False, scale=scale)
    return out, lse, (cq, ck, mq, mk, seed, offset)


def _backward_kernel(kernel: str, grad_out, q, k, v, out, lse, aux, causal: bool, scale: float):
    cq, ck, mq, mk, seed, offset = aux
    if kernel == "cudnn":
        return aten._scaled_dot_product_cudnn_attention_backward(
            grad_out, q, k, v, out, lse.unsqueeze(-1), seed, offset, None, cq, ck, mq, mk, 0.0, causal, scale=scale)
    return aten._scaled_dot_product_flash_attention_backward(
        grad_out, q, k, v, out, lse, cq, ck, mq, mk, 0.0, causal, seed, offset, scale=scale)


def forward_into(plan: Plan, kernel: str, q, k, v, scale: float, causal: bool, outs: torch.Tensor,
                 lses: torch.Tensor, need_lse: bool = True, slots: Optional[dict[int, int]] = None) -> list:
    """Run the plan's blocks, writing each branch's partial result into its slot: outs (P, B, N, H, D)
    in q's dtype and lses (P, B, N, H) float32, slot = slots[branch] (default: the branch; slot 0 for
    every block when P = 1). Returns the kernels' per-unit state for `backward_into`."""
    auxes = []
    views = _plan_views(plan, [outs[0], lses[0], q, k, v])
    for unit, unit_views in zip(plan_units(plan), views):
        slot = (slots[unit.branch] if slots is not None else unit.branch) if outs.shape[0] > 1 else 0
        unit_aux = []
        for ov, lv, qv, kv, vv in unit_views:
            if slot:
                ov, lv = outs[slot].as_strided(ov.shape, ov.stride(), ov.storage_offset() + slot * outs[0].numel()), \
                    lses[slot].as_strided(lv.shape, lv.stride(), lv.storage_offset() + slot * lses[0].numel())
            out_b, lse_b, aux = _forward_kernel(kernel, qv, kv, vv, causal, scale, need_lse)
            ov.copy_(out_b)
            if lse_b is not None and need_lse:  # flash returns one even when none is wanted
                lv.copy_(lse_b)
            unit_aux.append(aux)
        auxes.append(unit_aux)
    return auxes


FUSED_MERGE_DEVICES = ("cuda",)  # where the Triton merge runs (tests add "cpu" with a stand-in for it)


def fused_merge_applies(device: torch.device, out_dtype: torch.dtype, lse_dtype: torch.dtype) -> bool:
    """Whether `merge_into_one` takes the fused Triton merge (which never reads entries whose lse is -inf,
    so slot buffers need no zeros)."""
    return (triton_merge.HAVE_TRITON and device.type in FUSED_MERGE_DEVICES and lse_dtype == torch.float32
            and out_dtype != torch.float64)


def merge_into_one(outs: torch.Tensor, lses: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge slot partials outs (P, B, N, H, D), lses (P, B, N, H) float32 by LSE: (out (B, N, H, D)
    in `dtype`, lse (B, H, N) float32). Entries with lse -inf are never read by the fused merge."""
    parts, batch, seq_len, num_heads, dim = outs.shape
    if fused_merge_applies(outs.device, outs.dtype, lses.dtype):
        out = torch.empty(outs.shape[1:], dtype=dtype, device=outs.device)
        lse = torch.empty((batch, seq_len, num_heads), dtype=torch.float32, device=outs.device)
        triton_merge.merge_partials(outs.view(parts, -1, dim), lses.view(parts, -1), out.view(-1, dim), lse.view(-1))
        return out, lse.transpose(1, 2)
    out, lse = merge_lse(list(outs), [t.transpose(1, 2) for t in lses])
    return out.to(dtype), lse


def backward_into(plan: Plan, kernel: str, auxes: list, grads: tuple[torch.Tensor, ...], q, k, v,
                  out: torch.Tensor, grad_out: torch.Tensor, lse_bnh: torch.Tensor, scale: float, causal: bool,
                  accumulate: bool) -> None:
    """Each block's fused backward with the merged (out, lse): add (accumulate) or write its share into
    grads = (dq, dk, dv) (B, N, H, D). out and grad_out must be contiguous, lse_bnh (B, N, H) too."""
    all_views = _plan_views(plan, [grads[0], grads[1], grads[2], out, grad_out, lse_bnh, q, k, v])
    for views, unit_aux in zip(all_views, auxes):
        for (dqv, dkv, dvv, ov, gv, lv, qv, kv, vv), aux in zip(views, unit_aux, strict=True):
            shares = _backward_kernel(kernel, gv.contiguous(), qv, kv, vv, ov.contiguous(), lv.contiguous(),
                                      aux, causal, scale)
            for total, share in zip((dqv, dkv, dvv), shares):
                if accumulate:
                    total.add_(share)
                else:
                    total.copy_(share)


def _run_forward(plan: Plan, kernel: str, q, k, v, scale: float, causal: bool, need_lse: bool = True):
    batch, seq_len, num_heads, _ = q.shape
    parts = plan.num_branches if plan.merge else 1
    fused_merge = plan.merge and fused_merge_applies(q.device, q.dtype, torch.float32)
    # Merged branches: every entry a branch does not compute keeps lse -inf and is never read by the
    # fused merge, so its output buffer needs no zeros; in place, unselected rows must read 0.
    outs = (torch.empty if fused_merge else torch.zeros)((parts, *q.shape), dtype=q.dtype, device=q.device)
    lse_shape = (parts, batch, seq_len, num_heads) if need_lse or plan.merge else (parts, 1, 1, 1)
    lses = torch.full(lse_shape, float("-inf"), dtype=torch.float32, device=q.device)
    if lse_shape[1] == 1:  # not wanted: one broadcast row stands in for the (B, N, H) buffer
        lses = lses.expand(parts, batch, seq_len, num_heads)
    auxes = forward_into(plan, kernel, q, k, v, scale, causal, outs, lses, need_lse or plan.merge)
    if not plan.merge:
        return outs[0], lses[0].transpose(1, 2), auxes
    out, lse = merge_into_one(outs, lses, q.dtype)
    return out, lse, auxes


class _InPlaceFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, plan: Plan, kernel: str, scale: float, causal: bool, need_lse: bool):
        out, lse, auxes = _run_forward(plan, kernel, q, k, v, scale, causal, need_lse)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan, ctx.kernel, ctx.scale, ctx.causal, ctx.auxes = plan, kernel, scale, causal, auxes
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        plan = ctx.plan
        if grad_out is None and grad_lse is None:
            return None, None, None, None, None, None, None, None
        acc = torch.float32 if plan.merge or grad_lse is not None else q.dtype
        grads = tuple(torch.zeros(t.shape, dtype=acc, device=t.device) for t in (q, k, v))
        lse_bnh = lse.transpose(1, 2).contiguous()
        if grad_out is not None:
            # The kernels read q, k, v in place; they want out and grad_out in one dense layout and the
            # LSE contiguous, so those are packed once.
            backward_into(plan, ctx.kernel, ctx.auxes, grads, q, k, v, out.contiguous(), grad_out.contiguous(),
                          lse_bnh, ctx.scale, ctx.causal, accumulate=acc == torch.float32)
        if grad_lse is not None:
            add_lse_share(plan, ctx.kernel, ctx.auxes, grads, q, k, grad_lse, lse_bnh, ctx.scale, ctx.causal)
        dq, dk, dv = (g.to(t.dtype) for g, t in zip(grads, (q, k, v)))
        return dq, dk, dv, None, None, None, None, None


def lse_share_inputs(grad_lse_bnh: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad_out, out, v) that make a fused backward return the LSE's gradient share in dq and dk.

    With dO = e_0, O = -g e_0 and V = 0 the kernel's dS = P * (dP - rowsum(dO * O)) = P * g: exactly
    d(g * LSE)/dS. grad_lse_bnh: (B, N, H); g is rounded to q's dtype."""
    unit = torch.zeros_like(q)
    unit[..., 0] = 1
    shifted = torch.zeros_like(q)
    shifted[..., 0] = -grad_lse_bnh.to(q.dtype)
    return unit, shifted, torch.zeros_like(q)


def add_lse_share(plan: Plan, kernel: str, auxes: list, grads: tuple[torch.Tensor, ...], q, k, grad_lse: torch.Tensor,
                  lse_bnh: torch.Tensor, scale: float, causal: bool) -> None:
    """Add the share of (dq, dk) that flows from a gradient of the merged LSE (grad_lse (B, H, N))."""
    unit, shifted, zero_v = lse_share_inputs(grad_lse.transpose(1, 2), q)
    discard = torch.zeros_like(grads[2])
    backward_into(plan, kernel, auxes, (grads[0], grads[1], discard), q, k, zero_v, shifted, unit, lse_bnh,
                  scale, causal, accumulate=True)


def inplace_kernel(name: str, q: torch.Tensor) -> Optional[str]:
    """The in-place kernel for SDPA backend `name` on q, or None when this executor does not apply
    (CPU, fp32/fp64, head dims the kernels do not take, kernels other than cuDNN / flash)."""
    if q.device.type != "cuda":
        return None
    return kernel_for(name, q.dtype, q.shape[-1], torch.cuda.get_device_capability(q.device),
                      torch.backends.cudnn.is_available())


def kernel_for(name: str, dtype: torch.dtype, head_dim: int, capability: tuple[int, int], cudnn: bool) -> Optional[str]:
    """The in-place kernel ("cudnn" / "flash") for backend `name` on a CUDA device of compute `capability`
    (cudnn: whether cuDNN is available), or None when this executor does not apply."""
    if not name.startswith("sdpa") or dtype not in (torch.float16, torch.bfloat16) or head_dim % 8:
        return None
    major = capability[0]
    if name == "sdpa":
        name = "sdpa_cudnn" if major >= 9 and head_dim <= 128 and cudnn else "sdpa_flash"
    kernel = name.removeprefix("sdpa_")
    if kernel not in KERNELS or major < 8 or head_dim > (128 if kernel == "cudnn" else 256):
        return None
    return kernel


def inplace_attention(plan: Plan, kernel: str, q, k, v, scale: float, causal: bool, *,
                      need_lse: bool = True):
    """(out (B, N, H, D), lse (B, H, N)) of `plan` with the in-place kernel; differentiable.
    need_lse=False (inference without the LSE): the kernels skip it where no merge needs it."""
    if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        out, lse, _ = _run_forward(plan, kernel, q, k, v, scale, causal, need_lse)  # no graph to record
        return out, lse
    return _InPlaceFunction.apply(q, k, v, plan, kernel, scale, causal, need_lse)
