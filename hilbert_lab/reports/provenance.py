"""Where a page's data come from: the git revision, device, date and command of each run, read from its
env.json (report runs) or from the environment block of a committed result file, with what git history
adds when a run did not record it (the commit that committed its results). No machine's absolute path is
kept: paths in commands are cut to their file names.
"""
from __future__ import annotations

import functools
import subprocess
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from hilbert_lab.io import strip_paths
from hilbert_lab.reports.repo_paths import REPO_ROOT

NOT_RECORDED = "not recorded"
SOURCE_FIELDS = ("what", "device", "revision", "recorded", "command")
# the commit that made the attention core one executor interface: cost figures (time, memory, lengths) of a
# revision that does not contain it were measured with older code
CURRENT_CODE = "b3d5760abbdabd847aa2afe72a66f55381f0e619"
# the commit that runs a zigzag branch whose segments are whole chunks as one ring over their holders: causal-layout
# timings of a revision that does not contain it measured the older zigzag path
ZIGZAG_CODE = "adab9dbb52805ba1bcf512444eefe37543c137fa"
# the commit from which a ring step or head-parallel all-to-all on NCCL no longer makes the host wait for its transfer:
# context-parallel timings of a revision that does not contain it measured the host waiting at every step
RING_WAIT_CODE = "6d0bbb0484e229a7b6b120f77bbb35f77fee930d"
# the commit from which a training step no longer makes the host wait for its backward (the gradient norm stays on
# the device until a log step): training throughput of a revision that does not contain it measured that wait
TRAIN_STEP_CODE = "5cbf0873b232b3c9e831f169eb59608f2ff14e71"

# Committed GPU results under reports/results that carry no git revision, each with why it is kept: wherever
# they are quoted (a page, a docstring) they read "measured with older code (rev unrecorded)" (older_code(None);
# document_source gives a page built from one 'not recorded'). Every other GPU result file records its revision
# (tests/reports/test_results_paths.py checks both ways).
UNRECORDED_REVISION = {
    "bench_engine_h100.json": "engine timings on an H100, written without a git revision (first committed in "
                              "0591b7a); quoted by no page",
    "gpu_curves.json": "curve-kernel timings on an H100 (benchmarks/bench_gpu_curves.py), written without a git "
                       "revision (first committed in 02265ff); the kernels' docstrings quote it as older code",
    "train_gpu_h100_run/summary.json": "the summary of a training run on an H100, written without a git revision "
                                       "(first committed in 0591b7a); quoted by no page",
    "train_gpu_h100_run/log.jsonl": "the log of that run, without an environment block (first committed in "
                                    "0591b7a); quoted by no page",
}

__all__ = ["CURRENT_CODE", "NOT_RECORDED", "RING_WAIT_CODE", "SOURCE_FIELDS", "TRAIN_STEP_CODE", "UNRECORDED_REVISION",
           "committed_in", "document_source", "env_source", "gpus_used", "older_code", "older_code_of_revision",
           "result_git", "revision_text", "strip_paths", "when"]


def result_git(document: Any) -> dict[str, Any] | None:
    """The git block a committed result records: its environment's ('environment' or 'env') git, or a top-level
    'revision'; None when it records none."""
    if not isinstance(document, Mapping):
        return None
    for key in ("environment", "env"):
        block = document.get(key)
        if isinstance(block, Mapping) and isinstance(block.get("git"), Mapping) and block["git"].get("commit"):
            return dict(block["git"])
    revision = document.get("revision")
    return {"commit": revision} if isinstance(revision, str) and revision else None


def when(stamp: Any) -> str | None:
    """'2026-11-22T07:27:59+00:00' -> '2026-11-22 07:27 UTC' (None for nothing)."""
    if not stamp:
        return None
    try:
        moment = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return str(stamp)
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def committed_in(path: str | Path, repo_root: str | Path = REPO_ROOT) -> dict[str, str] | None:
    """{'commit': short sha, 'date': ISO} of the last commit that changed `path` (the results as they are;
    None outside git or for an uncommitted file)."""
    try:
        out = subprocess.run(["git", "-C", str(repo_root), "log", "-1", "--format=%h %cI", "--",
                              str(Path(path).resolve().relative_to(Path(repo_root).resolve()))],
                             capture_output=True, text=True, timeout=20, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return {"commit": out[0], "date": out[1]} if len(out) >= 2 else None


def revision_text(git: Mapping[str, Any] | None, committed: Mapping[str, Any] | None = None) -> str:
    """'0ceb35e', '0ceb35e + uncommitted changes (results committed in 4aff45d)' or
    'not recorded (results committed in 4aff45d)'."""
    git = git or {}
    commit = git.get("commit")
    text = f"{commit[:7]}{' + uncommitted changes' if git.get('dirty') else ''}" if commit else NOT_RECORDED
    if committed and committed.get("commit") and (not commit or git.get("dirty")):
        text += f" (results committed in {committed['commit']})"
    return text


@functools.lru_cache(maxsize=64)
def _contains(since: str, commit: str, repo_root: str) -> bool:
    try:
        return subprocess.run(["git", "-C", repo_root, "merge-base", "--is-ancestor", since, commit],
                              capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def older_code(git: Mapping[str, Any] | None, repo_root: str | Path = REPO_ROOT, *, since: str = CURRENT_CODE) -> str:
    """'' when the recorded revision contains `since` (default CURRENT_CODE, the current attention core), else the
    label its figures are shown under: 'measured with older code (rev 530aee9 + uncommitted changes)' or
    'measured with older code (rev unrecorded)'. A revision git cannot place counts as older."""
    git = git or {}
    commit = str(git.get("commit") or "")
    if not commit:
        return "measured with older code (rev unrecorded)"
    if _contains(since, commit, str(repo_root)):
        return ""
    return f"measured with older code (rev {revision_text(git)})"


def older_code_of_revision(revision: Any, *, since: str = CURRENT_CODE) -> str:
    """older_code of a revision as revision_text writes it ('ca29081 + uncommitted changes (results committed in
    91678e4)', 'not recorded (...)'): how a page built from a table's revision column labels its figures."""
    text = str(revision or "")
    if not text or text.startswith(NOT_RECORDED) or text in ("nan", "None", "-"):
        return older_code(None)
    return older_code({"commit": text.split()[0], "dirty": "uncommitted" in text.split(" (")[0]}, since=since)


def gpus_used(env: Mapping[str, Any]) -> int | None:
    """GPUs the run used: env['gpus_used'] when recorded, else the device count of a ring run, else 1 on a
    GPU (a single-device report on a machine with several) and None on the CPU."""
    device = env.get("device") or {}
    if env.get("gpus_used"):
        return int(env["gpus_used"])
    gpu = device.get("cuda_available", str(device.get("device", "")).startswith("cuda"))
    if not gpu:
        return None
    if (env.get("parameters") or {}).get("report") == "ring":
        return int(device.get("device_count") or 1)
    return 1


def _device_text(name: str | None, used: int | None, available: int | None) -> str:
    name = name or "unknown device"
    if not used:
        return name
    text = f"{name}, {used} GPU{'s' if used > 1 else ''}"
    if available and available > used:
        text += f" (of the machine's {available})"
    return text


def env_source(env: Mapping[str, Any], what: str = "this run") -> dict[str, str]:
    """SOURCE_FIELDS of a report run's env.json; a 'provenance' block in it ({'committed_in': {'commit', 'date'},
    'command', 'note'}: recovered from git history for a run that did not record them) fills the gaps."""
    recovered = env.get("provenance") or {}
    device = env.get("device") or {}
    cpu = env.get("cpu") or {}
    used = gpus_used(env)
    if used:
        name = device.get("name") if str(device.get("device", "")).startswith("cuda") else device.get("device")
        text = _device_text(name or device.get("name"), used, device.get("device_count"))
    else:
        text = f"CPU ({cpu.get('model', 'unknown')}, {cpu.get('usable_cores', '?')} usable cores)"
    recorded = when(env.get("created_utc"))
    if not recorded:
        date = when((recovered.get("committed_in") or {}).get("date"))
        recorded = f"{NOT_RECORDED} (results committed {date})" if date else NOT_RECORDED
    command = env.get("command") or recovered.get("command") or NOT_RECORDED
    return {"what": what, "device": text, "revision": revision_text(env.get("git"), recovered.get("committed_in")),
            "recorded": recorded, "command": strip_paths(command)}


def document_source(document: Mapping[str, Any], path: str | Path | None, what: str) -> dict[str, str]:
    """SOURCE_FIELDS of a committed result file (training, serialization, ring or grid JSON): its environment
    block, its command, and the commit that added it to git (for the date and an unrecorded revision)."""
    environment = document.get("environment") or document.get("env") or {}
    device = environment.get("device") if isinstance(environment.get("device"), Mapping) else {}
    committed = committed_in(path) if path is not None else None
    name = device.get("name") or str(document.get("device") or "unknown device")
    if str(device.get("device", "")).startswith("cuda"):
        text = _device_text(name, int(document.get("world_size") or environment.get("world_size") or 1), None)
    else:
        text = f"CPU ({name})" if name not in ("cpu", "CPU") else "CPU"
    recorded = when(document.get("created") or document.get("created_utc") or environment.get("created_utc"))
    if not recorded:
        recorded = (f"{NOT_RECORDED} (results committed {when(committed['date'])})" if committed
                    else NOT_RECORDED)
    command = document.get("command") or NOT_RECORDED
    return {"what": what, "device": text, "revision": revision_text(environment.get("git"), committed),
            "recorded": recorded, "command": strip_paths(command)}
