"""Benchmark matrices: expand base + swept fields into cases; read them from YAML or TOML files."""
from __future__ import annotations

import io
import itertools
import os
from typing import Any

from hilbert_lab.bench.cases import normalize_case
from hilbert_lab.io import read_bounded

MATRIX_KEYS = ("base", "matrix", "cases")
MAX_MATRIX_BYTES = 1 << 20  # a matrix file is a few kilobytes
MAX_MATRIX_NODES = 100_000  # values of a YAML matrix with its aliases expanded (nested aliases multiply)
MAX_CASES = 100_000


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
    count = 1
    for values in matrix.values():
        count *= len(values)
    if count + len(cases or []) > MAX_CASES:
        raise ValueError(f"the matrix expands to {count + len(cases or [])} cases, more than the {MAX_CASES} allowed")
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
    if not os.path.lexists(path):
        raise ValueError(f"matrix file {path!r} does not exist")
    extension = os.path.splitext(path)[1].lower()
    if extension not in (".yaml", ".yml", ".toml"):
        raise ValueError(f"matrix file {path!r} must end in .yaml, .yml or .toml")
    raw = read_bounded(path, "matrix file", MAX_MATRIX_BYTES)  # a regular file of bounded size
    try:
        if extension == ".toml":
            import tomllib

            data = tomllib.load(io.BytesIO(raw))
        else:
            data = _load_yaml(raw.decode("utf-8"))
    except _AliasError as exc:
        raise ValueError(f"matrix file {path!r}: {exc}") from None
    except Exception as exc:  # yaml.YAMLError, tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError
        raise ValueError(f"matrix file {path!r} is malformed: {_first_line(exc)}") from None
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


class _AliasError(ValueError):
    pass


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _load_yaml(text: str) -> Any:
    """yaml.safe_load, refusing a document whose aliases expand to more than MAX_MATRIX_NODES values
    (nested aliases, a "billion laughs") or refer to themselves, before anything is built from it."""
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        def construct_document(self, node):
            _check_expanded_size(node)
            return super().construct_document(node)

    return yaml.load(text, Loader=BoundedLoader)  # noqa: S506 - a SafeLoader


def _check_expanded_size(root: Any) -> None:
    import yaml

    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: Any) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise _AliasError("a YAML alias refers to the value that contains it")
        open_nodes.add(key)
        if isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total = 1 + sum(size(name) + size(value) for name, value in node.value)
        else:
            total = 1
        open_nodes.discard(key)
        if total > MAX_MATRIX_NODES:
            raise _AliasError(f"its YAML aliases expand to more than {MAX_MATRIX_NODES} values; "
                             "write the matrix out, or use fewer nested aliases")
        sizes[key] = total
        return total

    size(root)
