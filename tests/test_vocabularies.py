"""Each vocabulary and helper has one definition in the package; the shared ones behave as their users expect."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

import hilbert_lab
from hilbert_lab.dtypes import DTYPES, torch_dtype

PACKAGE = Path(hilbert_lab.__file__).parent
DEFINITIONS = {
    "MODES": r"^MODES\s*=", "DTYPES": r"^DTYPES\s*=\s*\(", "GRID_ORDERINGS": r"^GRID_ORDERINGS\s*=",
    "ORDERINGS": r"^ORDERINGS\s*=", "_orderings": r"^def _orderings\(", "curve_coordinates": r"^def curve_coordinates\(",
    "useful_pairs": r"^def useful_pairs\(", "atomic_write": r"^def atomic_write\(", "VERDICTS": r"^VERDICTS\s*=",
    "verdict_sentence": r"^def verdict_sentence\(",
}


@pytest.mark.parametrize("name", sorted(DEFINITIONS))
def test_defined_at_most_once(name):
    pattern = re.compile(DEFINITIONS[name], re.MULTILINE)
    homes = [str(p.relative_to(PACKAGE)) for p in sorted(PACKAGE.rglob("*.py")) if pattern.search(p.read_text())]
    assert len(homes) <= 1, f"{name} defined in {homes}"


def test_write_temp_then_replace_only_in_io():
    users = [str(p.relative_to(PACKAGE)) for p in sorted(PACKAGE.rglob("*.py"))
             if re.search(r"os\.replace\(|\.replace\(path\)|mkstemp\(", p.read_text())]
    assert users == ["io.py"]


def test_torch_dtype_names_every_dtype_and_refuses_others():
    assert [torch_dtype(name) for name in DTYPES] == [torch.float32, torch.float64, torch.float16, torch.bfloat16]
    with pytest.raises(ValueError, match="dtype must be one of float32, float64, float16, bfloat16"):
        torch_dtype("float8")


def test_users_share_the_vocabularies():
    from hilbert_lab.attention.pattern import MODES
    from hilbert_lab.curves import GRID_ORDERINGS
    from hilbert_lab.locality import GRID_ORDERINGS as locality_orderings
    from hilbert_lab.models.train import DTYPES as train_dtypes
    from hilbert_lab.attention.memory import DTYPE_BYTES, MemoryConfig

    assert locality_orderings is GRID_ORDERINGS
    assert set(train_dtypes) < set(DTYPES) and all(train_dtypes[n] is torch_dtype(n) for n in train_dtypes)
    assert DTYPE_BYTES == {name: torch_dtype(name).itemsize for name in DTYPES}
    with pytest.raises(ValueError, match="mode must be one of " + ", ".join(MODES)):
        MemoryConfig(seq_len=64, mode="windowed")


@pytest.mark.parametrize("family", ["hilbert", "morton", "snake", "rowmajor"])
@pytest.mark.parametrize("sizes", [dict(width=5, height=3), dict(width=4, height=2, depth=3, ndim=3)])
def test_curve_coordinates_by_size_follow_grid_permutation(family, sizes):
    from hilbert_lab.curves import curve_coordinates, grid_permutation

    shape = tuple(sizes[k] for k in ("depth", "height", "width") if k in sizes)
    coords = curve_coordinates(family, **sizes)
    perm, _ = grid_permutation(shape, family)
    # token i of the traversal is the cell whose row-major flat index is perm[i]; coords are (x, y[, z])
    assert np.array_equal(np.ravel_multi_index(tuple(coords[:, ::-1].T), shape), perm)
