"""Head-parallel and hybrid (head-parallel x ring) dilated attention on gloo worlds of 2, 4 and 8 ranks (every
grid of 8) against the float64 dense reference, and the all-to-all's key/value head assignment."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

from hilbert_lab.distributed.exchange import kv_heads_per_rank  # noqa: E402
from ring_worlds import run_world  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available in this torch build")
CHECKS = ["check_ulysses_matches_reference", "check_ulysses_grouped_heads", "check_ulysses_packed_rows",
          "check_ulysses_refuses_bad_input", "check_ulysses_module", "check_ring_of_a_run_of_heads",
          "check_hybrid_matches_reference", "check_hybrid_module", "check_ulysses_random_patterns",
          "check_hybrid_random_patterns"]


@pytest.mark.parametrize("world_size", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_ulysses_matches_reference(tmp_path, world_size):
    """On 2 ranks the hybrid's mesh is 2 x 1 (ring x ulysses), on 4 ranks 2 x 2."""
    run_world(world_size, tmp_path, CHECKS)


@pytest.mark.slow  # eight gloo ranks on a 2-core machine
def test_eight_ranks_on_every_hybrid_grid_match_the_reference(tmp_path):
    run_world(8, tmp_path, ["check_eight_rank_grids"])


@pytest.mark.parametrize("heads, kv_heads, world, expected", [
    (8, 4, 2, None),  # P divides H_kv: shards of H_kv / P heads
    (4, 1, 2, ((0,), (0,))),
    (4, 1, 4, ((0,), (0,), (0,), (0,))),
    (6, 3, 2, ((0, 0, 1), (1, 2, 2))),  # query heads 0-2 read kv 0, 0, 1; local head j reads j
    (12, 3, 2, ((0, 0, 1), (1, 2, 2))),  # runs of 2 query heads per copy
    (8, 2, 4, ((0,), (0,), (1,), (1,))),
])
def test_kv_heads_per_rank(heads, kv_heads, world, expected):
    per_rank = kv_heads_per_rank(heads, kv_heads, world)
    assert per_rank == expected
    for rank in range(world):  # local query head j reads local kv head j // (H/P / h_kv): the global one
        local = per_rank[rank] if per_rank else tuple(range(rank * kv_heads // world, (rank + 1) * kv_heads // world))
        for j in range(heads // world):
            assert local[j // (heads // world // len(local))] == (rank * heads // world + j) // (heads // kv_heads)


def test_module_refuses_unknown_parallel_and_a_ring_size():
    from hilbert_lab.distributed.modules import RingDilatedAttention

    with pytest.raises(ValueError, match=r"parallel must be one of \('ring', 'ulysses', 'hybrid'\)"):
        RingDilatedAttention([4], [1], parallel="heads")
    with pytest.raises(ValueError, match="ring_size must be None with parallel='ulysses'"):
        RingDilatedAttention([4], [1], parallel="ulysses", ring_size=2)


class _Mesh:
    """Stands for a 2-D DeviceMesh where only its shape and dimension names are read (no process group)."""

    def __init__(self, names=("ring", "ulysses")):
        self.ndim, self.mesh_dim_names = len(names), names


@pytest.mark.parametrize("module", ["RingDilatedAttention", "RingMultiheadDilatedAttention"])
def test_module_hybrid_needs_a_mesh_and_only_it(module):
    from hilbert_lab.distributed import modules

    cls = getattr(modules, module)
    args = (8, 2, [4], [1]) if module == "RingMultiheadDilatedAttention" else ([4], [1])
    with pytest.raises(ValueError, match=r"mesh must be a 2-D DeviceMesh with dimensions named \('ring', 'ulysses'\) "
                                         r"with parallel='hybrid', got None"):
        cls(*args, parallel="hybrid")
    with pytest.raises(ValueError, match=r"mesh must be a 2-D DeviceMesh .* got _Mesh with dimensions \('dp',\)"):
        cls(*args, parallel="hybrid", mesh=_Mesh(("dp",)))
    for parallel in ("ring", "ulysses"):
        with pytest.raises(ValueError, match=f"mesh must be None with parallel='{parallel}' .*'hybrid' only"):
            cls(*args, parallel=parallel, mesh=_Mesh())
    with pytest.raises(ValueError, match="ring_size must be None with parallel='hybrid'"):
        cls(*args, parallel="hybrid", mesh=_Mesh(), ring_size=2)
    with pytest.raises(ValueError, match="group must be None with parallel='hybrid'"):
        cls(*args, parallel="hybrid", mesh=_Mesh(), group=object())
    assert cls(*args, parallel="hybrid", mesh=_Mesh(("ulysses", "ring"))) is not None


@pytest.mark.gpu
@pytest.mark.parametrize("world_size", [2, 4])
def test_gpus_nccl(tmp_path, monkeypatch, world_size):
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < world_size or not dist.is_nccl_available():
        pytest.skip(f"needs {world_size} CUDA GPUs and NCCL")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    run_world(world_size, tmp_path, ["check_nccl_ulysses"], timeout_s=300, backend="nccl")
