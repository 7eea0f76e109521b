"""Data and context parallelism on a DeviceMesh (models.parallel, FSDP2): on gloo ranks (CPU, float64) one step's
mean loss and parameter gradients equal the single-process step on the whole batch, for a data-parallel mesh,
context-parallel meshes in both ring layouts and (4 ranks) a 2 x 2 mesh; a sharded checkpoint saved by the ranks
resumes in one process with the world's next loss."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from gloo_world import NO_GLOO, run_world  # tests/models is on sys.path (pytest prepend import mode)

MESHES = {2: [((2,), ("dp",), "contiguous"), ((2,), ("cp",), "contiguous"), ((2,), ("cp",), "zigzag")],
          4: [((2, 2), ("dp", "cp"), "zigzag")]}


def _model():
    from hilbert_lab.models import LongNetLM

    torch.manual_seed(0)  # segments 8 and 16 inside a 32-token shard, 64 across shards; dilation 2 and 4
    return LongNetLM(20, 32, 2, 4, [8, 16, 64], [1, 2, 4], max_seq_len=64, backend="manual").double()


def _batch():
    tokens = torch.randint(0, 20, (4, 65), generator=torch.Generator().manual_seed(1))
    return tokens[:, :-1], tokens[:, 1:]


def _rank_checks(rank: int, world_size: int, folder: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from hilbert_lab.models.parallel import local_batch, mean_token_loss, parallelize, save_sharded

    inputs, targets = _batch()
    reference = _model()
    expected_loss = F.cross_entropy(reference(inputs).flatten(0, 1), targets.flatten())
    expected_loss.backward()
    expected = {name: p.grad for name, p in reference.named_parameters()}
    for shape, names, layout in MESHES[world_size]:
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        model = parallelize(_model(), mesh, layout=layout)
        local_inputs, local_targets, positions = local_batch(mesh, inputs, targets, layout=layout)
        loss, mean = mean_token_loss(model(local_inputs, positions), local_targets, mesh)
        loss.backward()
        what = f"mesh {names} {shape} {layout}"
        assert abs(mean.item() - expected_loss.item()) < 1e-10, (what, mean.item(), expected_loss.item())
        for name, p in model.named_parameters():
            torch.testing.assert_close(p.grad.full_tensor(), expected[name], atol=1e-10, rtol=0, msg=f"{what} {name}")
        # a step, then the state saved by every rank; the test resumes it in one process (_resume_in_one_process)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        optimizer.step()
        tag = "_".join(names) + "_" + layout
        save_sharded(os.path.join(folder, tag), model, optimizer)
        optimizer.zero_grad()
        loss, mean = mean_token_loss(model(local_inputs, positions), local_targets, mesh)
        loss.backward()
        optimizer.step()
        _, mean = mean_token_loss(model(local_inputs, positions), local_targets, mesh)
        if rank == 0:
            with open(os.path.join(folder, tag + ".loss"), "w") as handle:
                handle.write(repr(mean.item()))


def _resume_in_one_process(folder, tag: str) -> None:
    """The state a world saved, loaded into one plain process: its next step gives the world's next loss."""
    from hilbert_lab.models.parallel import load_sharded

    inputs, targets = _batch()
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    load_sharded(str(folder / tag), model, optimizer)
    F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten()).backward()
    optimizer.step()
    loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten()).item()
    assert abs(loss - float((folder / (tag + ".loss")).read_text())) < 1e-10, tag


@pytest.mark.skipif(NO_GLOO, reason="torch.distributed with the gloo backend is not available in this build")
def test_one_step_on_two_ranks_equals_the_single_process_step(tmp_path):
    run_world(_rank_checks, 2, tmp_path)
    for _, names, layout in MESHES[2]:
        _resume_in_one_process(tmp_path, "_".join(names) + "_" + layout)


@pytest.mark.slow  # four gloo ranks on a 2-core machine
@pytest.mark.skipif(NO_GLOO, reason="torch.distributed with the gloo backend is not available in this build")
def test_one_step_on_a_two_by_two_mesh_equals_the_single_process_step(tmp_path):
    run_world(_rank_checks, 4, tmp_path)
    _resume_in_one_process(tmp_path, "dp_cp_zigzag")


def test_a_mesh_needs_dp_and_cp_dimensions():
    from hilbert_lab.models.parallel import degrees

    class Mesh:
        mesh_dim_names = ("tp",)

    with pytest.raises(ValueError, match="mesh must be a DeviceMesh with dimensions named 'dp' and/or 'cp'"):
        degrees(Mesh())
