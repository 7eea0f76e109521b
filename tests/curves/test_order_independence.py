"""The curve tests that patch or use the CUDA kernels' build and load pass in both orders: a failure that one test
patches in (a failed build, an extension that does not import) must not reach the tests that run after it.
On a CUDA machine the GPU tests of these modules run in both orders too."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODULES = ["tests/curves/test_layouts.py", "tests/curves/test_serialize.py"]
SELECTION = "extension or build or cuda"  # the tests that touch the kernels' build and load


def run_in_order(reverse: bool) -> tuple[int, list[str], str]:
    """Exit status, the node ids in the order they ran, and the output of one pytest run over MODULES."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(Path(__file__).parent),
                                                        os.environ.get("PYTHONPATH", "")]))
    plugins = ["-p", "reversed_order"] if reverse else []
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:randomly", "-p", "no:cacheprovider",
                           *plugins, "-v", "-k", SELECTION, *MODULES], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    ran = re.findall(r"^(tests/\S+::\S+) (?:PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)", proc.stdout, flags=re.M)
    return proc.returncode, ran, proc.stdout + proc.stderr


@pytest.mark.slow
def test_kernel_tests_pass_forward_and_reversed():
    forward_status, forward, forward_output = run_in_order(reverse=False)
    assert forward_status == 0, forward_output
    reversed_status, backward, reversed_output = run_in_order(reverse=True)
    assert reversed_status == 0, reversed_output
    assert len(forward) >= 3 and backward == forward[::-1]
