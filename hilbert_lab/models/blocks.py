"""LongNet building blocks: the pre-norm transformer block (MultiheadDilatedAttention with rotary
positions + MLP), the encoder stack and the causal language model with weight tying and generation."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from hilbert_lab.attention.kv_cache import DilatedKVCache
from hilbert_lab.attention.static_cache import DilatedStaticCache
from hilbert_lab.attention.modules import MultiheadDilatedAttention, check_device
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.validation import host_boundaries

from .decoding_layer import decoding_layer, rotates_in_gemv
from .positions import check_positions, document_positions, values_readable
from .projection import project
from .rotary import apply_rotary, pass_rotary_tables

DecodingCache = DilatedKVCache | DilatedStaticCache  # a layer's keys and values while decoding


class DilatedTransformerBlock(nn.Module):
    """Pre-norm block: x + Attn(LN(x)), then x + MLP(LN(x)); dropout on both residual branches.
    x (B, N, C), positions (N,) int64 original positions -> (B, N, C); with cu_seqlens (B = 1) the
    documents of a packed row attend each as its own sequence (positions then restart per document).
    num_kv_heads: key/value heads (grouped-query attention; default num_heads).

    ``attention`` is a ``MultiheadDilatedAttention`` (or, after ``models.ring.use_ring_attention``,
    a ``RingMultiheadDilatedAttention`` with the same parameters). The block runs its q/k/v
    projections, rotates q and k by the tokens' original positions (rotary), then its inner
    dilated attention and output projection, so any ``ordering`` leaves the output unchanged.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        segment_lengths: Sequence[int],
        dilation_rates: Sequence[int],
        *,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        causal: bool = False,
        mode: str = "longnet",
        ordering: str | None = None,
        backend: str = "auto",
        rotary: bool = True,
        rotary_base: float = 10000.0,
        norm_eps: float = 1e-5,
        num_kv_heads: int | None = None,
    ) -> None:
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if mlp_ratio <= 0:
            raise ValueError(f"mlp_ratio must be > 0, got {mlp_ratio}")
        if rotary and isinstance(num_heads, int) and num_heads > 0 and (dim // num_heads) % 2:
            raise ValueError(f"rotary needs an even head dim (dim // num_heads), got {dim // num_heads}")
        self.rotary, self.rotary_base = bool(rotary), float(rotary_base)
        self.attention_norm = nn.LayerNorm(dim, eps=norm_eps)
        self.attention = MultiheadDilatedAttention(
            dim, num_heads, segment_lengths, dilation_rates, dropout=attention_dropout, causal=causal,
            mode=mode, backend=backend, ordering=ordering, num_kv_heads=num_kv_heads,
        )
        hidden = max(1, int(round(dim * mlp_ratio)))
        self.mlp_norm = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.dropout = nn.Dropout(dropout)

    def attend(self, x: torch.Tensor, positions: torch.Tensor,
               cu_seqlens: torch.Tensor | Sequence[int] | None = None,
               cache: DecodingCache | None = None, rotary_tables: dict | None = None) -> torch.Tensor:
        """Self-attention of x (B, N, C) with rotary q/k on ``positions`` (N,) -> (B, N, C); cu_seqlens: the
        documents of a packed row (B = 1); with a ``cache`` the tokens follow those it holds (their keys and
        values are appended to it); rotary_tables: the rotary tables of the forward pass over these positions
        (models.rotary.pass_rotary_tables, which the encoder computes once and hands every block)."""
        mha = self.attention
        split = lambda t: t.unflatten(-1, (-1, mha.head_dim))  # noqa: E731
        q, k, v = split(mha.q_proj(x)), split(mha.k_proj(x)), split(mha.v_proj(x))
        if self.rotary:
            q = apply_rotary(q, positions, base=self.rotary_base, tables=rotary_tables)
            k = apply_rotary(k, positions, base=self.rotary_base, tables=rotary_tables)
        if cache is not None:
            attended = cache.attend(q, k, v)
        elif cu_seqlens is None:
            attended = mha.attention(q, k, v)
        else:
            attended = mha.attention(q, k, v, cu_seqlens=cu_seqlens)
        return project(attended.flatten(-2), mha.out_proj)

    def forward(self, x: torch.Tensor, positions: torch.Tensor,
                cu_seqlens: torch.Tensor | Sequence[int] | None = None,
                cache: DecodingCache | None = None, rotary_tables: dict | None = None) -> torch.Tensor:
        check_device("x", x, self.attention_norm.weight, "block")
        projections = cache.projections if isinstance(cache, DilatedStaticCache) else None
        if projections is not None and not (self.training and self.dropout.p > 0):
            return decoding_layer(self, x, positions, cache, projections, rotary_tables)
        x = x + self.dropout(self.attend(self.attention_norm(x), positions, cu_seqlens, cache, rotary_tables))
        return x + self.dropout(project(self.mlp_norm(x), self.mlp))


class LongNetEncoder(nn.Module):
    """A stack of ``depth`` DilatedTransformerBlocks and a final LayerNorm.
    x (B, N, C), positions (N,) or None (= arange(N), or each token's position in its document with
    cu_seqlens) -> (B, N, C). cu_seqlens [0, n1, ..., N] (B = 1): a packed row of documents, each
    attended as its own sequence."""

    def __init__(
        self,
        dim: int,
        depth: int,
        num_heads: int,
        segment_lengths: Sequence[int],
        dilation_rates: Sequence[int],
        *,
        max_seq_len: int | None = None,
        gradient_checkpointing: bool = False,
        **block_kwargs: Any,
    ) -> None:
        super().__init__()
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be a positive integer, got {depth!r}")
        self.max_seq_len = int(max_seq_len) if max_seq_len is not None else None
        if self.max_seq_len is not None and self.max_seq_len < 1:
            raise ValueError(f"max_seq_len must be a positive integer or None, got {max_seq_len!r}")
        self.gradient_checkpointing = bool(gradient_checkpointing)
        self.blocks = nn.ModuleList(
            DilatedTransformerBlock(dim, num_heads, segment_lengths, dilation_rates, **block_kwargs)
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(dim, eps=block_kwargs.get("norm_eps", 1e-5))

    def rotary_tables(self, positions: torch.Tensor, x: torch.Tensor) -> dict:
        """The rotary tables of one forward pass over positions, computed once for every block that rotates
        (models.rotary.pass_rotary_tables), cast to the dtype of the blocks' q and k: x's, or autocast's."""
        kind = x.device.type
        autocast = kind in ("cpu", "cuda") and torch.is_autocast_enabled(kind)
        return pass_rotary_tables(positions, [(block.attention.head_dim, block.rotary_base) for block in self.blocks
                                              if block.rotary], torch.get_autocast_dtype(kind) if autocast else x.dtype)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None,
                cu_seqlens: torch.Tensor | Sequence[int] | None = None,
                caches: Sequence[DecodingCache] | None = None) -> torch.Tensor:
        """cu_seqlens: a packed row of documents (B = 1), a tensor or host integers, handed to every layer in host
        memory (a device tensor copied once, here; a host tensor is what a compiled graph takes without
        specializing on its values); caches: one DilatedKVCache or
        DilatedStaticCache per block (models.generate.new_caches): x then holds the tokens after those the caches
        hold (positions default to theirs: (N,), or (B, N) for a static cache)."""
        if x.dim() != 3:
            raise ValueError(f"x must have shape (B, N, C), got {tuple(x.shape)}")
        check_device("x", x, self.norm.weight, "encoder")
        limit = self.max_seq_len if self.max_seq_len is not None else math.inf
        if caches is not None:
            if cu_seqlens is not None:
                raise ValueError("caches (decoding) and cu_seqlens (packed documents) do not go together")
            if len(caches) != len(self.blocks):
                raise ValueError(f"caches must hold one cache per block ({len(self.blocks)}), got {len(caches)}")
            past = caches[0].length
            if not torch.compiler.is_compiling() and past + x.shape[1] > limit:  # compiled: no guard on a count
                raise ValueError(f"sequence length must be <= max_seq_len={limit}, got {past} cached + {x.shape[1]}")
            positions = caches[0].token_positions(x.shape[1], x.device) if positions is None else \
                check_positions(positions, x.shape[1], limit, x.device)
            # steps that rotate inside their q, k, v GEMVs need no tables (a block that falls back to its modules
            # computes its own)
            in_gemv = all(isinstance(cache, DilatedStaticCache) and rotates_in_gemv(x, cache.projections)
                          for cache in caches)
            tables = {} if in_gemv else self.rotary_tables(positions, x)
            for block, cache in zip(self.blocks, caches):
                x = block(x, positions, None, cache, tables)
            return self.norm(x)
        if cu_seqlens is not None:
            cu_seqlens = host_boundaries(cu_seqlens, x)  # in host memory for every layer: copied once
        if positions is None and cu_seqlens is not None:  # each token's place in its document, checked on the host
            positions = document_positions(cu_seqlens, x.device, length=x.shape[1], max_length=limit)
        else:
            positions = check_positions(positions, x.shape[1], limit, x.device, packed=cu_seqlens is not None)
        tables = self.rotary_tables(positions, x)
        for block in self.blocks:
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, positions, cu_seqlens, None, tables, use_reentrant=False)
            else:
                x = block(x, positions, cu_seqlens, None, tables)
        return self.norm(x)


class LongNetLM(nn.Module):
    """Causal LongNet language model: token embedding -> causal LongNetEncoder -> LM head whose
    weight is tied to the embedding. tokens (B, N) int64 -> logits (B, N, vocab_size).

    ``config`` holds the constructor arguments (JSON-able) so a checkpoint can rebuild the model.
    """

    def __init__(
        self,
        vocab_size: int,
        dim: int,
        depth: int,
        num_heads: int,
        segment_lengths: Sequence[int],
        dilation_rates: Sequence[int],
        *,
        max_seq_len: int,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        mode: str = "longnet",
        ordering: str | None = None,
        backend: str = "auto",
        rotary: bool = True,
        rotary_base: float = 10000.0,
        tie_weights: bool = True,
        gradient_checkpointing: bool = False,
        num_kv_heads: int | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("dim", dim), ("max_seq_len", max_seq_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        pattern = DilatedPattern.create(segment_lengths, dilation_rates, mode=mode, causal=True)
        self.config: dict[str, Any] = dict(
            vocab_size=vocab_size, dim=dim, depth=depth, num_heads=num_heads,
            segment_lengths=list(pattern.segment_lengths), dilation_rates=list(pattern.dilation_rates),
            max_seq_len=max_seq_len, mlp_ratio=mlp_ratio, dropout=dropout, attention_dropout=attention_dropout,
            mode=mode, ordering=ordering, backend=backend, rotary=rotary, rotary_base=rotary_base,
            tie_weights=tie_weights, num_kv_heads=num_kv_heads,
        )
        self.vocab_size, self.max_seq_len = vocab_size, max_seq_len
        self.embedding = nn.Embedding(vocab_size, dim)
        self.embedding_dropout = nn.Dropout(dropout)
        self.encoder = LongNetEncoder(
            dim, depth, num_heads, segment_lengths, dilation_rates, max_seq_len=max_seq_len,
            gradient_checkpointing=gradient_checkpointing, mlp_ratio=mlp_ratio, dropout=dropout,
            attention_dropout=attention_dropout, causal=True, mode=mode, ordering=ordering, backend=backend,
            rotary=rotary, rotary_base=rotary_base, num_kv_heads=num_kv_heads,
        )
        self.head = nn.Linear(dim, vocab_size, bias=False)
        self.reset_parameters(depth)
        if tie_weights:
            self.head.weight = self.embedding.weight

    @classmethod
    def from_config(cls, config: dict[str, Any], **overrides: Any) -> "LongNetLM":
        return cls(**{**config, **overrides})

    def reset_parameters(self, depth: int) -> None:
        """GPT-2 style init: N(0, 0.02), residual output projections scaled by 1/sqrt(2 * depth)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for block in self.encoder.blocks:
            nn.init.normal_(block.attention.out_proj.weight, std=0.02 / math.sqrt(2 * depth))
            nn.init.normal_(block.mlp[2].weight, std=0.02 / math.sqrt(2 * depth))

    @property
    def gradient_checkpointing(self) -> bool:
        return self.encoder.gradient_checkpointing

    @gradient_checkpointing.setter
    def gradient_checkpointing(self, enabled: bool) -> None:
        self.encoder.gradient_checkpointing = bool(enabled)

    def check_tokens(self, tokens: torch.Tensor, packed: bool = False) -> None:
        """ValueError unless tokens is (B, N) integer with ids in [0, vocab_size) and N <= max_seq_len
        (packed: a row of documents, whose positions the encoder checks instead)."""
        if tokens.dim() != 2 or tokens.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"tokens must be an integer tensor (B, N), got {tuple(tokens.shape)} {tokens.dtype}")
        if tokens.numel() == 0:
            raise ValueError(f"tokens must hold at least one token in each of at least one row, got shape "
                             f"{tuple(tokens.shape)}")
        if tokens.shape[1] > self.max_seq_len and not packed:
            raise ValueError(f"sequence length must be <= max_seq_len={self.max_seq_len}, got {tokens.shape[1]}")
        if tokens.numel() and values_readable(tokens):
            low, high = int(tokens.min()), int(tokens.max())
            if low < 0 or high >= self.vocab_size:
                raise ValueError(
                    f"tokens must be ids in [0, vocab_size={self.vocab_size}), got values in [{low}, {high}]"
                )

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None,
                cu_seqlens: torch.Tensor | Sequence[int] | None = None,
                caches: Sequence[DecodingCache] | None = None, logits_to_keep: int = 0) -> torch.Tensor:
        """tokens (B, N) -> logits (B, N, vocab_size); positions (N,) original positions (default arange).
        cu_seqlens [0, n1, ..., N] with B = 1: a packed row of documents, each its own causal sequence
        (positions default to each token's position in its document; every document <= max_seq_len); a tensor
        or host integers; a tensor in host memory (cpu) is what a compiled training step takes whole with no
        recompilation for a new packing.
        caches (models.generate.new_caches): tokens follow those the caches hold, whose keys and values
        they append (decoding). logits_to_keep: 0 for every position's logits, else those of the last
        logits_to_keep positions (B, logits_to_keep, vocab_size), as transformers' models take it."""
        check_device("tokens", tokens, self.embedding.weight, "model")
        self.check_tokens(tokens, packed=cu_seqlens is not None)
        if isinstance(logits_to_keep, bool) or not isinstance(logits_to_keep, int) or logits_to_keep < 0:
            raise ValueError(f"logits_to_keep must be a non-negative integer (0: every position), got "
                             f"{logits_to_keep!r}")
        x = self.embedding_dropout(self.embedding(tokens))
        hidden = self.encoder(x, positions, cu_seqlens, caches)
        return project(hidden[:, -logits_to_keep:] if logits_to_keep else hidden, self.head)

    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        *,
        top_k: int | None = None,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
        use_cache: bool | None = None,
        attention_mask: torch.Tensor | None = None,
        cuda_graph: bool | None = None,
        compile_step: bool = False,
    ) -> torch.Tensor:
        """Extend prompt (B, N0) by max_new_tokens tokens -> (B, N0 + max_new_tokens).

        Greedy when ``top_k`` is None (or 1), else sampling among the ``top_k`` most likely tokens at
        ``temperature``. With the cache (default where every layer is a local MultiheadDilatedAttention,
        ``use_cache=True`` insists) the prompt runs once and each new token is one decoding step per layer
        (cost of the keys it sees, memory of the longest segment): on a GPU in fixed storage
        (attention.DilatedStaticCache) whose steps replay as one CUDA graph per token (``cuda_graph``,
        default on there; a greedy pick inside it, so a replay is the whole token), on the CPU in
        attention.DilatedKVCache. ``attention_mask`` (B, N0) of 0/1 marks left padding: rows of different
        lengths decode side by side, each as if alone. ``use_cache=False``
        recomputes the whole prefix per token. All are exact: the causal dilated pattern depends only on
        absolute positions, so they give the same tokens. ``compile_step=True`` runs the steps on static caches
        through ``torch.compile`` (small ops fused, so low-precision logits may differ in their last bits;
        compiling takes seconds to minutes), a greedy pick compiled with them.
        """
        from .generate import generate

        return generate(self, prompt, max_new_tokens, top_k=top_k, temperature=temperature, generator=generator,
                        use_cache=use_cache, attention_mask=attention_mask, cuda_graph=cuda_graph,
                        compile_step=compile_step)
