"""One decoding step of causal dilated attention in two Triton launches, with no host value in it.

`dilated_decode(q, k_new, v_new, keys, values, positions, branches, offsets, bounds, scale)`:
each row b of the batch holds one new token at position positions[b] (a device tensor). The cache stores
the key and value of position m at row m % C of keys / values (B, C, H_kv, D); C must be at least the
longest segment, so a row is overwritten only once no query can see its key any more.

In branch i (segment w_i, dilation r_i) query head h with offset o = offsets[i, h] (-1: not in the branch)
sees anything only when (p % w_i) % r_i == o, and then the positions p - p % w_i + o + j r_i, j = 0 .. (p % w_i
- o) / r_i, the last of them p itself. So at any position a branch is read by at most as many heads as share one
offset, each over at most ceil(w_i / r_i) keys: launch 1 runs exactly that many programs per row and branch, one
per (head of the position's residue, split of at most `keys_per_split` keys), each an online softmax over its
strided key rows straight from the cache (the new key is read from k_new; program 0 writes k_new / v_new at row
p % C, which no program reads), and marks the branch empty for the other heads. In float16 and bfloat16 at
power-of-two head dims its scores and weighted sums run on tensor cores, the query repeated in the 16 rows an
MMA tile takes, its key and value loads pipelined `stages` deep as asynchronous copies; otherwise each key block
is reduced across threads, its loads plain (Triton pipelines the loads that feed a dot). Launch 2 merges every
(branch, split) partial by its LSE (max-subtracted, sum-normalised) and adds 1 to positions (unless told not
to). Shapes depend only on the arguments' shapes and on the bounds, so the step can be captured in a CUDA graph
and replayed as positions advance. Both launches are the op `hilbert_lab::dilated_decode` (`decode_op`,
writing keys, values and positions in place; `read_op`, `hilbert_lab::dilated_decode_read`, where nothing is
written: a caller's own cache, positions kept), which torch.compile holds as one call (a compiled step launches them
as an eager call does). Plain tensors in, nothing from hilbert_lab imported.
"""
from __future__ import annotations

import math

import torch

# triton and tl are None where Triton is missing
from hilbert_lab.kernels.triton_support import HAVE_TRITON, define_op, require_triton, tl, triton

LOG2E = 1.4426950408889634

if HAVE_TRITON:

    @triton.jit
    def _partial_kernel(q_ptr, knew_ptr, vnew_ptr, k_ptr, v_ptr, pos_ptr, br_ptr, off_ptr, out_ptr, lse_ptr,
                        sq_b, sq_h, sn_b, sn_h, svn_b, svn_h, sk_b, sk_n, sk_h, sv_b, sv_n, sv_h,
                        capacity, heads, kv_heads, group, branches, rows, scale_log2, keys_per_split,
                        BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_KV: tl.constexpr, DIM: tl.constexpr,
                        BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr, EVEN_D: tl.constexpr,
                        APPEND: tl.constexpr, DOT: tl.constexpr):
        program = tl.program_id(0)
        b = tl.program_id(1)
        d = tl.arange(0, BLOCK_D)
        dmask = d < DIM
        p = tl.load(pos_ptr + b).to(tl.int64)
        if APPEND:
            if program == 0:  # the new keys and values of every key/value head go to row p % C
                kvh = tl.arange(0, BLOCK_KV)
                kvmask = (kvh < kv_heads)[:, None] & dmask[None, :]
                slot = p % capacity
                kn = tl.load(knew_ptr + b * sn_b + kvh[:, None] * sn_h + d[None, :], mask=kvmask)
                vn = tl.load(vnew_ptr + b * svn_b + kvh[:, None] * svn_h + d[None, :], mask=kvmask)
                tl.store(k_ptr + b * sk_b + slot * sk_n + kvh[:, None] * sk_h + d[None, :], kn, mask=kvmask)
                tl.store(v_ptr + b * sv_b + slot * sv_n + kvh[:, None] * sv_h + d[None, :], vn, mask=kvmask)
        # the program's branch, head slot and split: branch i holds heads_i x splits_i programs (slot-major). The
        # whole branch table and every branch's offsets are read at once, with the position, so that the head
        # (and then the query and the first keys) is known one memory round trip after the start
        i = tl.arange(0, BLOCK_B)
        in_table = i < branches
        hs = tl.arange(0, BLOCK_H)
        all_offsets = tl.load(off_ptr + i[:, None] * heads + hs[None, :], mask=in_table[:, None] & (hs < heads)[None, :],
                              other=-1).to(tl.int64)
        segments = tl.load(br_ptr + i * 4, mask=in_table, other=1).to(tl.int64)
        rates = tl.load(br_ptr + i * 4 + 1, mask=in_table, other=1).to(tl.int64)
        branch_heads = tl.load(br_ptr + i * 4 + 2, mask=in_table, other=0)
        branch_splits = (tl.load(br_ptr + i * 4 + 3, mask=in_table, other=0) + keys_per_split - 1) // keys_per_split
        ends = tl.cumsum(branch_heads * branch_splits, axis=0)
        branch = tl.sum((ends <= program).to(tl.int32), axis=0)
        this = i == branch
        local = program - tl.sum(tl.where(this, ends - branch_heads * branch_splits, 0), axis=0)
        splits = tl.sum(tl.where(this, branch_splits, 0), axis=0)
        part = tl.sum(tl.where(i < branch, branch_splits, 0), axis=0) + local % splits
        split = local % splits
        slot_rank = local // splits
        w = tl.sum(tl.where(this, segments, 0), axis=0)
        r = tl.sum(tl.where(this, rates, 0), axis=0)
        within = p % w
        residue = within % r
        # the query heads whose offset is the residue, in order; this program takes the slot_rank-th of them
        offsets = tl.sum(tl.where(this[:, None], all_offsets, 0), axis=0)
        match = (offsets == residue) & (hs < heads)
        hit = match & (tl.cumsum(match.to(tl.int32), axis=0) == slot_rank + 1)
        if slot_rank == 0:  # the heads that see nothing of this branch: no keys in this part
            tl.store(lse_ptr + part * rows + b * heads + hs, tl.full((BLOCK_H,), float("-inf"), tl.float32),
                     mask=(hs < heads) & ~match)
        if tl.sum(hit.to(tl.int32), axis=0) == 0:
            return
        h = tl.sum(tl.where(hit, hs, 0), axis=0)
        row = b * heads + h
        kv = h // group
        first = p - within + residue
        count = (within - residue) // r + 1
        j0 = split * keys_per_split
        j1 = tl.minimum(count, j0 + keys_per_split)
        if j0 >= count:  # a split past this head's keys
            tl.store(lse_ptr + part * rows + row, float("-inf"))
            return
        q_raw = tl.load(q_ptr + b * sq_b + h * sq_h + d, mask=dmask, other=0.0)
        q = (q_raw.to(tl.float32) * scale_log2).to(tl.float32)
        peak = tl.full((), float("-inf"), tl.float32)  # fp32 whatever type a caller's float arguments get
        total = tl.full((), 0.0, tl.float32)
        acc = tl.zeros((BLOCK_D,), tl.float32)
        if DOT:  # tensor cores: the query repeated in 16 identical rows (the smallest tile an MMA takes)
            q_rows = tl.broadcast_to(q_raw[None, :], (16, BLOCK_D))
            peak_rows = tl.full((16,), float("-inf"), tl.float32)
            total_rows = tl.zeros((16,), tl.float32)
            acc_rows = tl.zeros((16, BLOCK_D), tl.float32)
        k_base = k_ptr + b * sk_b + kv * sk_h
        v_base = v_ptr + b * sv_b + kv * sv_h
        # the split's first key's row; later rows step by r and wrap once at most (a segment spans <= C rows)
        base_slot = ((first + j0 * r) % capacity).to(tl.int32)
        step = r.to(tl.int32)
        last = (j1 - 1).to(tl.int32)
        for start in tl.range(j0.to(tl.int32), j1.to(tl.int32), BLOCK_N, num_stages=STAGES):
            j = start + tl.arange(0, BLOCK_N)
            if APPEND:  # position p: the new key, read from k_new below
                valid = (j <= last) & (first + j.to(tl.int64) * r < p)
            else:
                valid = j <= last
            slot = base_slot + (j - j0.to(tl.int32)) * step
            slot = tl.where(slot >= capacity, slot - capacity, slot)
            if EVEN_D:  # a mask constant along the head dim: vector loads
                mask = valid[:, None]
            else:
                mask = valid[:, None] & dmask[None, :]
            k = tl.load(k_base + slot[:, None].to(tl.int64) * sk_n + d[None, :], mask=mask, other=0.0)
            v = tl.load(v_base + slot[:, None].to(tl.int64) * sv_n + d[None, :], mask=mask, other=0.0)
            if DOT:
                s = (tl.dot(q_rows, tl.trans(k)) * scale_log2).to(tl.float32)  # fp64 under torch.compile
                s = tl.where(valid[None, :], s, float("-inf"))
                new_peak = tl.maximum(peak_rows, tl.max(s, axis=1))
                safe = tl.where(new_peak == float("-inf"), 0.0, new_peak)
                weights = tl.exp2(s - safe[:, None])
                alpha = tl.exp2(peak_rows - safe)
                acc_rows = acc_rows * alpha[:, None] + tl.dot(weights.to(v.dtype), v)
                total_rows = total_rows * alpha + tl.sum(weights, axis=1)
                peak_rows = new_peak
            else:
                s = tl.where(valid, tl.sum(k.to(tl.float32) * q[None, :], axis=1), float("-inf"))
                new_peak = tl.maximum(peak, tl.max(s, axis=0))
                safe = tl.where(new_peak == float("-inf"), 0.0, new_peak)
                weights = tl.exp2(s - safe)
                alpha = tl.exp2(peak - safe)
                acc = acc * alpha + tl.sum(weights[:, None] * v.to(tl.float32), axis=0)
                total = total * alpha + tl.sum(weights, axis=0)
                peak = new_peak
        if DOT:  # every row holds the same state: keep row 0
            first_row = (tl.arange(0, 16) == 0)[:, None]
            acc = tl.sum(tl.where(first_row, acc_rows, 0.0), axis=0)
            peak = tl.max(peak_rows, axis=0)
            total = tl.max(total_rows, axis=0)
        if APPEND:
            if (count > 0) & (count - 1 >= j0) & (count - 1 < j1):  # this split holds the new token's own key
                kn = tl.load(knew_ptr + b * sn_b + kv * sn_h + d, mask=dmask, other=0.0).to(tl.float32)
                vn = tl.load(vnew_ptr + b * svn_b + kv * svn_h + d, mask=dmask, other=0.0).to(tl.float32)
                s1 = tl.sum(kn * q, axis=0)
                new_peak = tl.maximum(peak, s1)
                alpha = tl.exp2(peak - new_peak)
                weight = tl.exp2(s1 - new_peak)
                acc = acc * alpha + weight * vn
                total = total * alpha + weight
                peak = new_peak
        has_keys = total > 0
        out = acc / tl.where(has_keys, total, 1.0)
        lse = tl.where(has_keys, (peak + tl.log2(tl.where(has_keys, total, 1.0))) * 0.6931471805599453,
                       float("-inf"))
        tl.store(out_ptr + (part * rows + row).to(tl.int64) * DIM + d, out, mask=dmask)
        tl.store(lse_ptr + part * rows + row, lse)

    @triton.jit
    def _merge_kernel(part_ptr, plse_ptr, out_ptr, lse_ptr, pos_ptr, so_b, so_h, heads, rows, parts,
                      DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr, EVEN_D: tl.constexpr,
                      ADVANCE: tl.constexpr):
        row = tl.program_id(0)
        chunk = tl.program_id(1)
        b = row // heads
        h = row % heads
        d = chunk * BLOCK_D + tl.arange(0, BLOCK_D)
        dmask = d < DIM
        # the LSEs and the parts read together (one memory round trip where the row's parts fit one block); a part
        # whose LSE is -inf was never stored (its values may be anything) and weighs 0
        peak = tl.full((), float("-inf"), tl.float32)
        total = tl.zeros((BLOCK_P,), tl.float32)
        acc = tl.zeros((BLOCK_P, BLOCK_D), tl.float32)
        for start in range(0, parts, BLOCK_P):
            i = start + tl.arange(0, BLOCK_P)
            inside = i < parts
            part_lse = tl.load(plse_ptr + i * rows + row, mask=inside, other=float("-inf"))
            if EVEN_D:
                x = tl.load(part_ptr + (i[:, None] * rows + row).to(tl.int64) * DIM + d[None, :], mask=inside[:, None],
                            other=0.0)
            else:
                x = tl.load(part_ptr + (i[:, None] * rows + row).to(tl.int64) * DIM + d[None, :],
                            mask=inside[:, None] & dmask[None, :], other=0.0)
            new_peak = tl.maximum(peak, tl.max(part_lse, axis=0))
            safe = tl.where(new_peak == float("-inf"), 0.0, new_peak)
            alpha = tl.exp2((peak - safe) * 1.4426950408889634)
            weights = tl.exp2((part_lse - safe) * 1.4426950408889634)
            used = part_lse > float("-inf")
            acc = acc * alpha + tl.where(used[:, None], weights[:, None] * x, 0.0)
            total = total * alpha + tl.where(used, weights, 0.0)
            peak = new_peak
        safe = tl.where(peak == float("-inf"), 0.0, peak)
        weight = tl.sum(total, axis=0)
        has_keys = weight > 0
        out = tl.sum(acc, axis=0) / tl.where(has_keys, weight, 1.0)
        tl.store(out_ptr + b * so_b + h * so_h + d, out.to(out_ptr.dtype.element_ty), mask=dmask)
        if chunk == 0:
            tl.store(lse_ptr + row, tl.where(has_keys, safe + tl.log(tl.where(has_keys, weight, 1.0)), float("-inf")))
            if ADVANCE:
                if h == 0:
                    tl.store(pos_ptr + b, tl.load(pos_ptr + b) + 1)


REDUCE_TUNING = {"block_keys": 64, "warps": 2, "stages": 1, "most_keys_per_split": 256}  # per path
DOT_TUNING = {"block_keys": 64, "warps": 4, "stages": 3, "most_keys_per_split": 512}
WIDE_DOT_BLOCK_KEYS = 32  # the tensor-core path's keys per iteration at head dims above 128 (64 untimed there)


def split_size(max_keys: int, block: int = 64, most: int = 256) -> int:
    """Keys per program: a power of two from `block` to `most`, about an eighth of the longest branch's keys (a long
    branch is read by several programs at once). The tunings' `most_keys_per_split` were the fastest for a
    1B-class layer on an H200: 256 of 128-1024 for the reductions, 512 of 128-1024 for the tensor-core path."""
    return max(block, min(most, triton.next_power_of_2(max(1, math.ceil(max_keys / 8))) if HAVE_TRITON else block))


def dilated_decode(q: torch.Tensor, k_new: torch.Tensor | None, v_new: torch.Tensor | None, keys: torch.Tensor,
                   values: torch.Tensor, positions: torch.Tensor, branches: torch.Tensor, offsets: torch.Tensor,
                   bounds: tuple, scale: float, keys_per_split: int | None = None, block_keys: int | None = None,
                   warps: int | None = None, stages: int | None = None, advance: bool = True,
                   dot: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One step (see the module docstring) -> (out (B, H, D) in q's dtype, lse (B, H) float32).

    q (B, H, D); k_new, v_new (B, H_kv, D) (H a multiple of H_kv), written at row positions % C of keys, values
    (B, C, H_kv, D), or None where the cache already holds the new token's key and value there (a caller's own
    cache); positions (B,) int64, advanced by 1 unless `advance` is False; branches int32 (P, 4), per branch its
    segment w, its dilation rate r, the most query heads that share one offset and the most keys one head sees
    (at least ceil(min(w, C) / r)); offsets int32 (P, H); bounds: branches' last two columns as host ints, ((heads,
    keys), ...) per branch (the launch's size); every last dimension contiguous. keys_per_split (default
    split_size), block_keys (keys per loop iteration), warps and stages (loads in flight) tune the partial launch;
    dot: scores and sums on tensor cores (default: where q is float16 or bfloat16 and D a power of two from 16),
    else one reduction per key block across threads."""
    require_triton("dilated_decode")
    if (k_new is None) != (v_new is None):
        raise ValueError("k_new and v_new must both be tensors or both be None")
    new = () if k_new is None else (k_new, v_new)
    batch, heads, dim = q.shape
    capacity, kv_heads, count = keys.shape[1], keys.shape[2], branches.shape[0]
    bounds = tuple((int(h), int(n)) for h, n in bounds)
    if any(t.shape != (batch, kv_heads, dim) for t in new) or heads % kv_heads \
            or keys.shape != (batch, capacity, kv_heads, dim) or values.shape != keys.shape \
            or positions.shape != (batch,) or branches.shape != (count, 4) or offsets.shape != (count, heads) \
            or len(bounds) != count:
        raise ValueError(f"shapes must be q (B, H, D), k_new, v_new (B, H_kv, D), keys, values (B, C, H_kv, D), "
                         f"positions (B,), branches (P, 4), offsets (P, H), P bounds; got {tuple(q.shape)}, "
                         f"{[tuple(t.shape) for t in new]}, {tuple(keys.shape)}, {tuple(values.shape)}, "
                         f"{tuple(positions.shape)}, {tuple(branches.shape)}, {tuple(offsets.shape)}, "
                         f"{len(bounds)} bounds")
    if any(t.stride(-1) != 1 for t in (q, keys, values, *new)):
        raise ValueError("q, k_new, v_new, keys and values must have a contiguous last dimension")
    if any(h < 1 or n < 1 for h, n in bounds):
        raise ValueError(f"bounds must be (heads >= 1, keys >= 1) per branch; got {bounds}")
    block_d = triton.next_power_of_2(dim)
    tensor_cores = q.dtype in (torch.float16, torch.bfloat16) and dim == block_d and dim >= 16
    if dot is None:
        dot = tensor_cores
    elif dot and not tensor_cores:
        raise ValueError(f"dot=True needs q in float16 or bfloat16 and a head dim that is a power of two from 16; "
                         f"got {q.dtype}, D {dim}")
    tuned = DOT_TUNING if dot else REDUCE_TUNING
    block_keys = block_keys or (WIDE_DOT_BLOCK_KEYS if dot and dim > 128 else tuned["block_keys"])
    warps = warps or tuned["warps"]
    stages = stages or tuned["stages"]
    per_split = keys_per_split or split_size(max(n for _, n in bounds), block_keys, tuned["most_keys_per_split"])
    sizes = ([h for h, _ in bounds], [n for _, n in bounds], float(scale), per_split, block_keys, warps, stages)
    if k_new is None and not advance:  # nothing written: the op that declares no mutation (read_op)
        return read_op(q, keys, values, positions, branches, offsets, *sizes, dot)
    return decode_op(q, k_new, v_new, keys, values, positions, branches, offsets, *sizes, advance, dot)


def _decode_launch(q: torch.Tensor, k_new: torch.Tensor | None, v_new: torch.Tensor | None, keys: torch.Tensor,
                   values: torch.Tensor, positions: torch.Tensor, branches: torch.Tensor, offsets: torch.Tensor,
                   bound_heads: list, bound_keys: list, scale: float, per_split: int, block_keys: int, warps: int,
                   stages: int, advance: bool, dot: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The two launches of `dilated_decode` on checked arguments (k_new, v_new None: nothing appended)."""
    append = k_new is not None
    if not append:  # placeholders the kernel never reads
        k_new = v_new = keys[:, 0]
    batch, heads, dim = q.shape
    kv_heads = keys.shape[2]
    count = branches.shape[0]
    block_d = triton.next_power_of_2(dim)
    programs = sum(h * math.ceil(n / per_split) for h, n in zip(bound_heads, bound_keys))
    parts_per_row = sum(math.ceil(n / per_split) for n in bound_keys)
    rows = batch * heads
    parts = torch.empty((parts_per_row, rows, dim), dtype=torch.float32, device=q.device)
    part_lse = torch.empty((parts_per_row, rows), dtype=torch.float32, device=q.device)
    _partial_kernel[(programs, batch)](
        q, k_new, v_new, keys, values, positions, branches, offsets, parts, part_lse,
        q.stride(0), q.stride(1), k_new.stride(0), k_new.stride(1), v_new.stride(0), v_new.stride(1),
        keys.stride(0), keys.stride(1), keys.stride(2), values.stride(0), values.stride(1), values.stride(2),
        keys.shape[1], heads, kv_heads, heads // kv_heads, count, rows, scale * LOG2E, per_split,
        BLOCK_B=triton.next_power_of_2(count), BLOCK_H=triton.next_power_of_2(heads),
        BLOCK_KV=triton.next_power_of_2(kv_heads), DIM=dim, BLOCK_D=block_d, BLOCK_N=block_keys, STAGES=stages,
        EVEN_D=dim == block_d, APPEND=append, DOT=dot, num_warps=warps)
    out = torch.empty((batch, heads, dim), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads), dtype=torch.float32, device=q.device)
    chunk = min(block_d, 32)
    _merge_kernel[(rows, triton.cdiv(dim, chunk))](parts, part_lse, out, lse, positions, out.stride(0), out.stride(1),
                                                  heads, rows, parts_per_row, DIM=dim, BLOCK_D=chunk, BLOCK_P=64,
                                                  EVEN_D=dim % chunk == 0, ADVANCE=advance, num_warps=4)
    return out, lse


def _decode_fake(q, k_new, v_new, keys, values, positions, branches, offsets, bound_heads, bound_keys, scale,
                 per_split, block_keys, warps, stages, advance, dot):
    return q.new_empty(q.shape), q.new_empty(q.shape[:2], dtype=torch.float32)


# One op to torch.compile, writing the new key and value into keys and values and advancing positions in place
# (the graph holds the two launches as one call, launched as `_decode_launch` launches them).
decode_op = define_op("dilated_decode(Tensor q, Tensor? k_new, Tensor? v_new, Tensor(a!) keys, Tensor(b!) values, "
                      "Tensor(c!) positions, Tensor branches, Tensor offsets, int[] bound_heads, int[] bound_keys, "
                      "float scale, int per_split, int block_keys, int warps, int stages, bool advance, bool dot) "
                      "-> (Tensor, Tensor)", _decode_launch, _decode_fake)


def _read_launch(q, keys, values, positions, branches, offsets, bound_heads, bound_keys, scale, per_split, block_keys,
                 warps, stages, dot):
    """`_decode_launch` with nothing appended and positions kept: keys, values and positions only read."""
    return _decode_launch(q, None, None, keys, values, positions, branches, offsets, bound_heads, bound_keys, scale,
                          per_split, block_keys, warps, stages, False, dot)


def _read_fake(q, keys, values, positions, branches, offsets, bound_heads, bound_keys, scale, per_split, block_keys,
               warps, stages, dot):
    return q.new_empty(q.shape), q.new_empty(q.shape[:2], dtype=torch.float32)


# The same launches where the caller's storage already holds the new token and its positions stay: an op that
# declares no mutation, so that a compiled caller's CUDA graphs (torch.compile's "reduce-overhead", as transformers'
# compiled generate runs a static cache) do not skip the graph for mutated inputs.
read_op = define_op("dilated_decode_read(Tensor q, Tensor keys, Tensor values, Tensor positions, Tensor branches, "
                    "Tensor offsets, int[] bound_heads, int[] bound_keys, float scale, int per_split, int block_keys, "
                    "int warps, int stages, bool dot) -> (Tensor, Tensor)", _read_launch, _read_fake)
