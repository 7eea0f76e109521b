"""Benchmark matrices: expand base + swept fields into cases; read them from YAML or TOML files."""
from __future__ import annotations

import itertools
import os
from typing import Any

from hilbert_lab.bench.cases import normalize_case

MATRIX_KEYS = ("base", "matrix", "cases")


def expand_matrix(base: dict[str, Any] | None = None, matrix: dict[str, list] | None = None,
                  cases: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Validated cases: the cartesian product of `matrix` (field -> list of values) over `base`,
    then each explicit case of `cases` (merged over `base`). Duplicates are dropped, order kept.

    Example: expand_matrix({"kind": "attention"}, {"backend": ["manual", "sdpa"], "seq_len": [1024, 2048]})
    gives 4 cases. A swept list-valued field (segment_lengths) takes a list of lists.
    """
    base = dict(base or {})
    matrix = dict(matrix or {})
    for name, values in matrix.items():
        if not isinstance(values, (list, tuple)) or not values:
            raise ValueError(f"matrix field {name!r} must be a non-empty list of values, got {values!r}")
    expanded: list[dict[str, Any]] = []
    if matrix:
        names = list(matrix)
        for combination in itertools.product(*(matrix[n] for n in names)):
            expanded.append(normalize_case({**base, **dict(zip(names, combination))}))
    for extra in cases or []:
        if not isinstance(extra, dict):
            raise ValueError(f"each entry of cases must be a mapping, got {extra!r}")
        expanded.append(normalize_case({**base, **extra}))
    if not matrix and not cases:
        expanded.append(normalize_case(base))
    unique: dict[str, dict[str, Any]] = {}
    for case in expanded:
        unique.setdefault(repr(sorted(case.items())), case)
    return list(unique.values())


def load_matrix_file(path: str) -> list[dict[str, Any]]:
    """Cases from a YAML (.yaml/.yml) or TOML (.toml) file with top-level keys base, matrix, cases.

    Raises ValueError naming the file and the problem when it is missing, unreadable or malformed.
    """
    if not os.path.isfile(path):
        raise ValueError(f"matrix file {path!r} does not exist")
    extension = os.path.splitext(path)[1].lower()
    if extension not in (".yaml", ".yml", ".toml"):
        raise ValueError(f"matrix file {path!r} must end in .yaml, .yml or .toml")
    try:
        if extension == ".toml":
            import tomllib

            with open(path, "rb") as handle:
                data = tomllib.load(handle)
        else:
            import yaml

            with open(path) as handle:
                data = yaml.safe_load(handle)
    except Exception as exc:  # yaml.YAMLError, tomllib.TOMLDecodeError, OSError, UnicodeDecodeError
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"matrix file {path!r} is malformed: {first_line}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"matrix file {path!r} must hold a mapping with keys {', '.join(MATRIX_KEYS)}")
    unknown = set(data) - set(MATRIX_KEYS)
    if unknown:
        raise ValueError(f"matrix file {path!r} has unknown key(s) {sorted(unknown)}; allowed: {', '.join(MATRIX_KEYS)}")
    if not isinstance(data.get("base", {}), dict) or not isinstance(data.get("matrix", {}), dict):
        raise ValueError(f"matrix file {path!r}: 'base' and 'matrix' must be mappings")
    if not isinstance(data.get("cases", []), list):
        raise ValueError(f"matrix file {path!r}: 'cases' must be a list of mappings")
    try:
        return expand_matrix(data.get("base"), data.get("matrix"), data.get("cases"))
    except ValueError as exc:
        raise ValueError(f"matrix file {path!r}: {exc}") from exc
