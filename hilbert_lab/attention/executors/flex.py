"""FlexAttention as a dense kernel: a causal block mask on each call's views.

FlexAttention cannot be handed a merged LSE, so the backward recomputes the call's (out_b, lse_b) with
autograd and back-propagates the merged result's gradient through the merge weights
w_b = exp(lse_b - lse): d out_b = w_b dO, d lse_b = w_b (dO . (out_b - out)) + w_b g.
On the CPU FlexAttention runs forward only (torch raises for backward); compiled on CUDA.
"""
from __future__ import annotations

import contextlib
import functools
import warnings
from typing import Optional

import torch

from hilbert_lab.attention.executors.base import BackendUnavailableError, Capabilities
from hilbert_lab.attention.executors.blockwise import blockwise_executor
from hilbert_lab.attention.executors.kernel import DenseKernel
from hilbert_lab.attention.executors.manual import MANUAL_KERNEL


def _unavailable(device=None, dtype=None) -> Optional[str]:
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return f"torch.nn.attention.flex_attention is missing in torch {torch.__version__} (needs >= 2.5)"
    return None


@functools.lru_cache(maxsize=64)
def _causal_block_mask(length: int, device: str):
    from torch.nn.attention.flex_attention import create_block_mask

    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx

    return create_block_mask(causal, None, None, length, length, device=device)


@functools.lru_cache(maxsize=1)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def flex_attend(q, k, v, *, causal, scale):
    """Differentiable (out (b, L, h, D), lse (b, h, L)) through FlexAttention."""
    from torch.nn.attention.flex_attention import flex_attention

    fn = _compiled_flex() if q.device.type == "cuda" else flex_attention
    with warnings.catch_warnings():  # eager CPU FlexAttention warns that it is not compiled
        warnings.simplefilter("ignore", UserWarning)
        args = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        block_mask = _causal_block_mask(q.shape[1], str(q.device)) if causal else None
        try:
            from torch.nn.attention.flex_attention import AuxRequest
        except ImportError:  # torch < 2.9: the older keyword
            out, lse = fn(*args, block_mask=block_mask, scale=scale, return_lse=True)
        else:
            out, aux = fn(*args, block_mask=block_mask, scale=scale, return_aux=AuxRequest(lse=True))
            lse = aux.lse
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    return out.transpose(1, 2), lse.to(lse_dtype)


def _forward(q, k, v, *, causal, scale, need_lse=True):
    with torch.no_grad():
        out, lse = flex_attend(q.detach(), k.detach(), v.detach(), causal=causal, scale=scale)
    return out, lse, None


@contextlib.contextmanager
def _autograd_recording():
    """Autograd on, also inside a custom op's implementation (attention.op), where the dispatcher leaves the
    autograd keys out: the backward below differentiates a recompute of the forward."""
    C = torch._C
    exclude = C._dispatch_tls_local_exclude_set()
    for key in (C.DispatchKey.AutogradFunctionality, C.DispatchKey.AutogradOther, C.DispatchKey.AutogradNestedTensor,
                C.DispatchKey.ADInplaceOrView):
        exclude = exclude.remove(key)
    with C._ForceDispatchKeyGuard(C._dispatch_tls_local_include_set(), exclude), torch.enable_grad():
        yield


def _backward(grad_out, q, k, v, out, lse, aux=None, *, causal, scale, grad_lse=None):
    if q.device.type == "cpu":
        raise BackendUnavailableError("backend 'flex' has no backward on CPU (torch's FlexAttention is forward-only "
                                      "there); use 'manual' or 'sdpa' for training on CPU")
    with _autograd_recording():
        qd, kd, vd = (t.detach().requires_grad_(True) for t in (q, k, v))
        out_b, lse_b = flex_attend(qd, kd, vd, causal=causal, scale=scale)
        finite = torch.isfinite(lse)
        weight = torch.where(finite, torch.exp(lse_b.detach() - torch.where(finite, lse, torch.zeros_like(lse))),
                             torch.zeros_like(lse))  # (b, h, L)
        w = weight.transpose(1, 2).unsqueeze(-1)
        d_out_b = (w * grad_out.to(w.dtype)).to(out_b.dtype)
        d_lse_b = weight * ((grad_out.to(w.dtype) * (out_b.detach().to(w.dtype) - out.to(w.dtype))).sum(-1).transpose(1, 2))
        if grad_lse is not None:
            d_lse_b = d_lse_b + weight * grad_lse
        return torch.autograd.grad((out_b, lse_b), (qd, kd, vd), (d_out_b, d_lse_b.to(lse_b.dtype)))


def _workspace(q: torch.Tensor, k: torch.Tensor, backward: bool) -> int:
    """What `_backward` holds beyond the gradients it returns: the recomputed output and its upstream gradient
    (q-sized, input dtype), and at its widest the LSE gradient's float32 (float64) copies of dO, the output
    twice, and their difference; or, at the end, those two beside the gradients."""
    if not backward:
        return 0
    element, wide = q.element_size(), (8 if q.dtype == torch.float64 else 4)
    copies = 3 * q.numel() * wide if element != wide else 0
    outputs = (q.numel() + 2 * k.numel()) * element
    held = 2 * q.numel() * element
    return max(held + copies + q.numel() * wide, held + outputs) - outputs


FLEX_KERNEL = DenseKernel("flex", _forward, _backward, grad_lse=True, fallback=MANUAL_KERNEL, meta=False,
                          workspace=_workspace)


def executors() -> dict:
    """The FlexAttention executor (name -> Executor)."""
    return {"flex": blockwise_executor("flex", lambda q: FLEX_KERNEL, Capabilities(grad_lse=True),
                                       unavailable=_unavailable,
                                       description="FlexAttention on the plan's views (compiled on CUDA; forward "
                                                   "only on the CPU)")}
