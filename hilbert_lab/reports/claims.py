"""The predecessor's claims (claims.md, shipped with the package) reproduced with exact semantics: claimed vs measured, verdict.

Every experiment here computes real dilated attention through the engine; an ordering only permutes
tokens in memory (per segment, after dilation), so the attention output is the same and any speed or
memory difference comes from layout alone. Timing claims tied to a GPU the machine at hand does not
have are measured on what is here and reported as "not reproducible here", with the measurement.
This module reads claims.md and runs every experiment (`evaluate_all`); the experiments are in
reports.claims_experiments, their measurement kit in reports.claims_measure, the page in reports.claims_page.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

from hilbert_lab.io import strip_paths
from hilbert_lab.reports.claims_experiments import (
    claim_c1_c2, claim_c3, claim_c4_c5_cache, claim_c5_time, claim_c6, claim_c7, claim_c8, claim_c9, claim_c10,
    claim_c11, claim_c12,
)
from hilbert_lab.reports.claims_measure import CLAIM_ROW_COLUMNS, VERDICTS, _row

# The claims this module evaluates: the package's own copy (package data).
PACKAGE_CLAIMS = Path(__file__).resolve().parent / "claims.md"
CLAIMS_LOCATIONS = (PACKAGE_CLAIMS,)


def find_claims_file(path: str | Path | None = None) -> Path | None:
    """`path` when given, else the first existing CLAIMS_LOCATIONS entry (None when none exists)."""
    if path:
        candidate = Path(path)
        if not candidate.exists():
            raise ValueError(f"claims_file must name an existing file, got {str(path)!r}")
        return candidate
    return next((candidate for candidate in CLAIMS_LOCATIONS if candidate.exists()), None)


def parse_claims(text: str) -> list[dict[str, str]]:
    """Rows of the markdown claims table: id, claim, configuration, hardware (in file order)."""
    claims = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and re.fullmatch(r"C\d+", cells[0]):
            claims.append({"id": cells[0], "claim": cells[1], "configuration": cells[2], "hardware": cells[3]})
    return claims


def evaluate_all(*, device: str = "cpu", repeats: int = 3, max_tokens: int = 8192, results_dir: str | Path = ".",
                 claims_file: str | Path | None = None, progress: bool = True) -> tuple[Any, dict]:
    """Run every experiment; (DataFrame of CLAIM_ROW_COLUMNS, extra measurements). Every claim of
    claims.md gets at least one row (a claim id no experiment covers gets a 'not reproducible here' row)."""
    import pandas as pd
    from tqdm.auto import tqdm

    results_dir = Path(results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    seq_lens = [n for n in (1024, 2048, 4096, 8192) if n <= max_tokens]
    steps: list[tuple[str, Callable[[], list[dict]]]] = []
    extra: dict[str, Any] = {}

    def c1_c2() -> list[dict]:
        rows, measured = claim_c1_c2(seq_lens=seq_lens, repeats=repeats, device=device)
        extra["c1_measurements"] = measured
        return rows

    steps = [
        ("C1/C2", c1_c2),
        ("C3", lambda: claim_c3(repeats=repeats, device=device, max_tokens=max_tokens)),
        ("C4/C5 cache", lambda: claim_c4_c5_cache(progress=False)),
        ("C5 time", lambda: claim_c5_time(repeats=repeats, device=device, max_tokens=max_tokens)),
        ("C6", lambda: claim_c6(results_dir=results_dir, device=device, max_tokens=max_tokens, progress=False)),
        ("C7", lambda: claim_c7(repeats=repeats, device=device, max_tokens=max_tokens)),
        ("C8", lambda: claim_c8(repeats=repeats, device=device, max_tokens=max_tokens)),
        ("C9", lambda: claim_c9(repeats=repeats, device=device, max_tokens=max_tokens)),
        ("C10", claim_c10),
        ("C11", claim_c11),
        ("C12", lambda: claim_c12(repeats=repeats, device=device, max_tokens=max_tokens)),
    ]
    rows: list[dict] = []
    for name, step in tqdm(steps, desc="claims", disable=not progress):
        try:
            rows += step()
        except Exception as error:  # one broken experiment must not hide the others
            rows.append(_row(name.split("/")[0].split()[0], "experiment failed", "-", "-",
                             f"{type(error).__name__}: {error}"[:300], "not reproducible here",
                             "the experiment raised; see the notebook for the traceback-free message"))
    path = find_claims_file(claims_file)
    listed = parse_claims(path.read_text(encoding="utf-8")) if path else []
    extra["claims_file"] = strip_paths(path) if path else None
    extra["claims_listed"] = listed
    covered = {row["claim"] for row in rows}
    for claim in listed:
        if claim["id"] not in covered:
            rows.append(_row(claim["id"], "not covered", claim["configuration"], claim["claim"], "-",
                             "not reproducible here", "no experiment for this claim id in hilbert_lab.reports.claims"))
    order = {f"C{index}": index for index in range(1, 100)}
    frame = pd.DataFrame(rows, columns=list(CLAIM_ROW_COLUMNS))
    frame = frame.sort_values("claim", key=lambda column: column.map(lambda c: order.get(c, 99)), kind="stable")
    return frame.reset_index(drop=True), extra


def claim_summary(frame: Any, listed: list[dict[str, str]]) -> Any:
    """One row per claim: text from claims.md, verdicts of its rows (counts)."""
    import pandas as pd

    texts = {claim["id"]: claim["claim"] for claim in listed}
    rows = []
    for claim, group in frame.groupby("claim", sort=False):
        counts = group["verdict"].value_counts()
        rows.append({"claim": claim, "text": texts.get(claim, ""),
                     **{verdict: int(counts.get(verdict, 0)) for verdict in VERDICTS}})
    return pd.DataFrame(rows)
