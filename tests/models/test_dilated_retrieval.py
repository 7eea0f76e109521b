"""Small-scale analogue of the 32K grid: a *dilated* whole-sequence branch carries the needle across the
sequence, segments that do not span it stay at chance.

N = 512, the pair at least 127 tokens before the question (beyond the 32- and 128-token segments),
presets cpu-512-dil8 ([32, 128, 512] / [1, 4, 8], 8 heads: every offset of the rate-8 branch has a head)
and cpu-512-local ([32, 128] / [1, 4]); same model, curriculum (64 -> 128 -> 512 tokens) and steps. The
final eval covers 512 answers, chance is 1/8. In LongNet mode the question's spanning head only sees
positions of its residue mod 8 and a value always sits at an odd position while the question (510) is
6 mod 8, so the value can only reach it through a local branch in an earlier layer: the test passing
shows the relay over layers, not a direct look-up.
"""
from __future__ import annotations

import pytest

from hilbert_lab.models.train import PRESETS, TrainConfig, train

CHANCE = 1 / 8
DILATED_MARGIN = 0.5  # dilated accuracy >= chance + 0.5 (the run reaches ~1.0)
CONTROL_BAND = 0.07  # |control accuracy - chance| <= 0.07 (~4.8 standard errors at 512 answers)


def _final(preset: str) -> dict:
    config = TrainConfig(**{**PRESETS[preset], "progress": False, "seed": 0})
    result = train(config)
    assert config.task().chance_accuracy == CHANCE
    assert result.final_eval["count"] == 512
    return result.final_eval


# two tests (not one) so that the two trainings run on two workers side by side
@pytest.mark.slow
def test_dilated_spanning_branch_learns():
    dilated = _final("cpu-512-dil8")
    assert dilated["accuracy"] >= CHANCE + DILATED_MARGIN, dilated
    assert dilated["accuracy_low"] > CHANCE + DILATED_MARGIN - 0.05, dilated


@pytest.mark.slow
def test_local_segments_without_a_spanning_branch_stay_at_chance():
    control = _final("cpu-512-local")
    assert abs(control["accuracy"] - CHANCE) <= CONTROL_BAND, control
    assert control["accuracy_low"] <= CHANCE <= control["accuracy_high"] + 0.02, control
