"""A hypothesis strategy shared by the decoding caches' property tests: a random causal pattern of 1-3 branches
(segments that nest, that do not divide each other, and whole-sequence ones) over grouped or plain heads."""
from __future__ import annotations

from property_testing import st


@st.composite
def decoding_patterns(draw) -> dict:
    """dict(segments, rates, mode, heads, kv_heads)."""
    branches = draw(st.integers(1, 3))
    segments = [draw(st.sampled_from([1, 2, 3, 4, 5, 8, 12, 16, 1 << 40])) for _ in range(branches)]
    kv_heads = draw(st.integers(1, 2))
    return dict(segments=segments, rates=[draw(st.integers(1, min(w, 6))) for w in segments],
                mode=draw(st.sampled_from(["longnet", "head_groups"])), kv_heads=kv_heads,
                heads=kv_heads * draw(st.integers(1, 3)))
