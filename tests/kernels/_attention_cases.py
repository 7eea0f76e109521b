"""Shared checks of the fused Triton kernel against the engine's float64 reference.

Used by the interpreter test (run in a subprocess with TRITON_INTERPRET=1, CPU) and by the GPU
tests. `run_case` returns relative errors of out, lse and the three gradients (random upstream
gradients for both out and lse, never a mean() loss) plus structural facts (-inf rows match,
every output element written).
"""
from __future__ import annotations

import json
import random
import sys

import torch

from hilbert_lab.attention.engine import dilated_attention
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.reference import reference_attention

# (B, N, H, D, segment_lengths, dilation_rates, mode, causal): divisible and ragged N, w > N,
# dilations that do not divide the segment or each other, heads not divisible by groups/rates.
INTERPRET_CASES = [
    (1, 32, 4, 16, [8, 16], [1, 2], "longnet", False),
    (2, 37, 4, 16, [8, 16, 32], [1, 2, 4], "head_groups", True),
    (1, 29, 5, 16, [6, 10, 64], [1, 3, 2], "longnet", True),
    (1, 27, 3, 16, [9, 27], [3, 1], "head_groups", False),
    (1, 24, 2, 16, [24], [1], "longnet", True),
    (1, 64, 2, 16, [32, 64], [1, 2], "longnet", False),  # tiles that take the unmasked fast paths
    (1, 64, 2, 16, [64], [1], "head_groups", True),
    (1, 29, 4, 16, [8, 1 << 40], [1, 4], "longnet", True),  # "the whole sequence": clipped to N, no int32 overflow
]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    denom = b.norm().item()
    return (a - b).norm().item() / (denom if denom > 0 else 1.0)


def run_case(case, device: str, dtype: torch.dtype, seed: int = 0) -> dict:
    batch, seq_len, heads, head_dim, segs, dils, mode, causal = case
    gen = torch.Generator(device="cpu").manual_seed(seed)
    pattern = DilatedPattern.create(segs, dils, mode=mode, causal=causal)
    q, k, v = (torch.randn(batch, seq_len, heads, head_dim, generator=gen).to(device=device, dtype=dtype)
               .requires_grad_(True) for _ in range(3))
    out, lse = dilated_attention(q, k, v, segment_lengths=segs, dilation_rates=dils, mode=mode, causal=causal, backend="triton",
                                 return_lse=True)
    q64, k64, v64 = (t.detach().double().cpu().requires_grad_(True) for t in (q, k, v))
    ref_out, ref_lse = reference_attention(q64, k64, v64, pattern)
    finite = torch.isfinite(ref_lse)
    grad_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    grad_lse = torch.where(finite, torch.randn(ref_lse.shape, generator=gen, dtype=torch.float64), 0.0)
    loss_ref = (ref_out * grad_out).sum() + (torch.where(finite, ref_lse, 0.0) * grad_lse).sum()
    ref_grads = torch.autograd.grad(loss_ref, (q64, k64, v64))
    lse_safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    loss = (out.float() * grad_out.to(device=device, dtype=torch.float32)).sum() + \
        (lse_safe * grad_lse.to(device=device, dtype=torch.float32)).sum()
    grads = torch.autograd.grad(loss, (q, k, v))
    out_c, lse_c = out.detach().cpu(), lse.detach().cpu()
    return {
        "case": list(case[:4]) + [list(segs), list(dils), mode, causal],
        "dtype": str(dtype).replace("torch.", ""),
        "out": _rel(out_c, ref_out.detach()),
        "lse": (lse_c.double()[finite] - ref_lse.detach()[finite]).abs().max().item() if finite.any() else 0.0,
        "neg_inf_rows_match": bool(torch.equal(torch.isfinite(lse_c), finite)),
        "no_keys_rows_zero": bool((out_c.permute(0, 2, 1, 3)[~finite] == 0).all()),
        "finite": bool(torch.isfinite(out_c).all() and all(torch.isfinite(g).all() for g in grads)),
        "dq": _rel(grads[0].cpu(), ref_grads[0]),
        "dk": _rel(grads[1].cpu(), ref_grads[1]),
        "dv": _rel(grads[2].cpu(), ref_grads[2]),
    }


def random_cases(count: int, seed: int) -> list[tuple]:
    """`count` random cases of `seed` (INTERPRET_CASES' form): N 1-48, one to three branches of segments 1-64 (longer
    than N too) with rates up to 6 that need not divide them, 1-5 heads, D 16 or 32, both modes, causal or not."""
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        segments = [rng.choice([1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 24, 32, 64]) for _ in range(rng.randint(1, 3))]
        cases.append((rng.randint(1, 2), rng.randint(1, 48), rng.randint(1, 5), rng.choice([16, 32]), segments,
                      [rng.randint(1, min(w, 6)) for w in segments], rng.choice(["longnet", "head_groups"]),
                      rng.random() < 0.5))
    return cases


if __name__ == "__main__":  # interpreter mode: python _attention_cases.py [COUNT SEED] -> one JSON line per case
    cases = INTERPRET_CASES if len(sys.argv) < 3 else random_cases(int(sys.argv[1]), int(sys.argv[2]))
    for index, case in enumerate(cases):
        print(json.dumps(run_case(case, "cpu", torch.float32, seed=index)), flush=True)
    sys.exit(0)
