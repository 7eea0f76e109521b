"""`train` on a DeviceMesh (data_parallel x context_parallel, FSDP2): on gloo ranks (CPU, float64) every logged
training loss and the final evaluation equal the single-process run's (grouped-query heads, checkpointed
activations and a packed row sharded over context_parallel included); the sharded checkpoint the ranks write
resumes in one process with the uninterrupted run's next losses; a wrong world size, or ranks started with different
configurations, fail on every rank; a rank that dies stops the others."""
from __future__ import annotations

import json
import os

import pytest

from gloo_world import NO_GLOO, run_world  # tests/models is on sys.path (pytest prepend import mode)

# (data_parallel, context_parallel, ring_layout, other TrainConfig fields)
MESHES = {1: [(1, 1, "contiguous", {"fsdp": True})],
          2: [(2, 1, "contiguous", {}), (1, 2, "zigzag", {}),
              (2, 1, "contiguous", {"num_kv_heads": 2}),
              (1, 2, "contiguous", {"gradient_checkpointing": True, "num_kv_heads": 2}), (1, 2, "zigzag", {"pack": True})],
          4: [(2, 2, "zigzag", {})],
          8: [(2, 4, "zigzag", {}), (1, 8, "contiguous", {"pack": True})]}


def _config(**overrides):
    from hilbert_lab.models.train import TrainConfig

    # segments 8 and 16 fit a 32-token shard, 64 spans the shards; dilation 2 and 4
    return TrainConfig(seq_len=64, segment_lengths=[8, 16, 64], dilation_rates=[1, 2, 4], dim=32, depth=2,
                       num_heads=4, batch_size=4, steps=4, warmup_steps=1, lr=1e-2, dtype="float64",
                       backend="manual", log_every=1, eval_every=2, eval_batches=1, checkpoint_every=100,
                       progress=False, **overrides)


def _losses(history):
    return [(r["step"], r["kind"], r["loss"]) for r in history]


def _rank_trains_each_mesh(rank: int, world_size: int, folder: str) -> None:
    """Every mesh of MESHES[world_size] trains to step 3; rank 0 writes each run's losses and evaluation."""
    from hilbert_lab.models.train import train

    for index, (dp, cp, layout, extra) in enumerate(MESHES[world_size]):
        result = train(_config(data_parallel=dp, context_parallel=cp, ring_layout=layout, **extra),
                       os.path.join(folder, f"run{index}"), stop_at=3)
        if rank == 0:
            with open(os.path.join(folder, f"run{index}.json"), "w") as handle:
                json.dump({"history": _losses(result.history), "eval": result.final_eval["loss"]}, handle)


def _rank_trains(rank: int, world_size: int, folder: str) -> None:
    from hilbert_lab.models.train import train

    _rank_trains_each_mesh(rank, world_size, folder)
    with pytest.raises(ValueError, match="must equal the world size"):
        train(_config(data_parallel=world_size, context_parallel=2, ring_layout="zigzag"))
    with pytest.raises(ValueError, match=r"same configuration, run folder and resume flag; ranks \[1\] differ"):
        train(_config(data_parallel=world_size, seed=int(rank == 1)))  # every rank refuses, none hangs


def _check_against_one_process(folder, world_size):
    from hilbert_lab.models.train import train

    for index, (dp, cp, _, extra) in enumerate(MESHES[world_size]):
        extra = {name: value for name, value in extra.items() if name != "fsdp"}  # one process: no mesh at all
        reference = train(_config(**extra), folder / f"reference{index}")
        expected = _losses(reference.history)
        run = json.loads((folder / f"run{index}.json").read_text())
        assert [tuple(r[:2]) for r in run["history"]] == [r[:2] for r in expected[:len(run["history"])]]
        for (step, kind, loss), (_, _, want) in zip(run["history"], expected):
            assert abs(loss - want) < 1e-10, (dp, cp, step, kind, loss, want)
        # the sharded checkpoint of step 3, resumed in one process: the uninterrupted run's step 4
        resumed = train(_config(**extra), folder / f"run{index}", resume=True)
        got = _losses(resumed.history)
        assert [r[:2] for r in got] == [r[:2] for r in expected]
        for (step, kind, loss), (_, _, want) in zip(got, expected):
            assert abs(loss - want) < 1e-10, ("resumed", dp, cp, step, kind, loss, want)
        assert abs(resumed.final_eval["loss"] - reference.final_eval["loss"]) < 1e-10


@pytest.mark.skipif(NO_GLOO, reason="torch.distributed with the gloo backend is not available in this build")
def test_training_on_two_ranks_equals_one_process_and_resumes_in_one(tmp_path):
    run_world(_rank_trains, 2, tmp_path)
    _check_against_one_process(tmp_path, 2)


@pytest.mark.skipif(NO_GLOO, reason="torch.distributed with the gloo backend is not available in this build")
def test_training_on_a_mesh_of_one_equals_one_process_and_resumes_in_one(tmp_path):
    """fsdp=True on one rank (the program every mesh rank runs: the scaling table's like-for-like one-GPU
    baseline) logs the one-process losses, and its sharded checkpoint resumes in one process."""
    run_world(_rank_trains_each_mesh, 1, tmp_path)
    assert list((tmp_path / "run0").glob("checkpoint-step*.dcp")), "the run did not train on a mesh"
    _check_against_one_process(tmp_path, 1)


@pytest.mark.slow  # eight gloo ranks on a 2-core machine
@pytest.mark.skipif(NO_GLOO, reason="torch.distributed with the gloo backend is not available in this build")
def test_training_on_eight_ranks_equals_one_process_and_resumes_in_one(tmp_path):
    """A 2 x 4 mesh (zigzag) and a packed row over 8 context-parallel ranks: every logged loss and the final
    evaluation equal one process's, and each sharded checkpoint resumes in one process."""
    run_world(_rank_trains_each_mesh, 8, tmp_path)
    _check_against_one_process(tmp_path, 8)


def _rank_resumes_on_two(rank: int, world_size: int, folder: str) -> None:
    """The 2 x 2 run's sharded checkpoint of step 3, resumed on a 2-rank context-parallel mesh to the end."""
    from hilbert_lab.models.train import train

    result = train(_config(context_parallel=2, ring_layout="zigzag"), os.path.join(folder, "run0_copy"), resume=True)
    if rank == 0:
        with open(os.path.join(folder, "resumed_on_two.json"), "w") as handle:
            json.dump({"history": _losses(result.history), "eval": result.final_eval["loss"]}, handle)


@pytest.mark.slow  # four gloo ranks on a 2-core machine
@pytest.mark.skipif(NO_GLOO, reason="torch.distributed with the gloo backend is not available in this build")
def test_training_on_a_two_by_two_mesh_equals_one_process_and_resumes_on_two_ranks(tmp_path):
    import shutil

    from hilbert_lab.models.train import train

    run_world(_rank_trains, 4, tmp_path)
    shutil.copytree(tmp_path / "run0", tmp_path / "run0_copy")
    (tmp_path / "rendezvous").unlink(missing_ok=True)
    run_world(_rank_resumes_on_two, 2, tmp_path)
    resumed = json.loads((tmp_path / "resumed_on_two.json").read_text())
    _check_against_one_process(tmp_path, 4)  # the same checkpoint resumed in one process

    reference = train(_config(), tmp_path / "reference_again")
    expected = _losses(reference.history)
    assert [tuple(r[:2]) for r in resumed["history"]] == [r[:2] for r in expected]
    for (step, kind, loss), (_, _, want) in zip(resumed["history"], expected):
        assert abs(loss - want) < 1e-10, ("resumed on two ranks", step, kind, loss, want)
    assert abs(resumed["eval"] - reference.final_eval["loss"]) < 1e-10


def test_a_mesh_config_evaluates_a_plain_model_in_one_process():
    """evaluate() without a mesh scores the whole batch, whatever degrees the configuration names (a mesh run's
    checkpoint evaluated in one process)."""
    from hilbert_lab.models.train import build_model, evaluate

    model = build_model(_config())
    want = evaluate(model, _config(), batches=1)
    got = evaluate(model, _config(data_parallel=2, context_parallel=2), batches=1)
    assert got["count"] == want["count"] and abs(got["loss"] - want["loss"]) < 1e-12


def test_a_mesh_run_needs_a_process_group_and_divisible_batches():
    from hilbert_lab.models.train import train

    with pytest.raises(ValueError, match="needs an initialised torch.distributed process group"):
        train(_config(data_parallel=2))
    with pytest.raises(ValueError, match="batch_size=4 must divide among the data_parallel=3 ranks"):
        _config(data_parallel=3)
    with pytest.raises(ValueError, match=r"every training length \(\[64\]\) must be a multiple of 6: the zigzag"):
        _config(context_parallel=3, ring_layout="zigzag")
    with pytest.raises(ValueError, match="pack=True .* data_parallel > 1: a packed batch is one row; shard it with "
                                         "context_parallel instead"):
        _config(pack=True, data_parallel=2)


def _dying_rank(rank: int, world_size: int, folder: str) -> None:
    """train on a 2-rank data-parallel mesh; rank 1 exits abruptly at the start of step 2. Writes what train did on
    this rank and how long it took (rank 0 must stop with an error, not hang)."""
    import datetime
    import time

    import torch
    import torch.distributed as dist

    from hilbert_lab.models import loop

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=120))
    if rank == 1:
        schedule = loop.learning_rate

        def dying(config, step):
            if step == 1:
                os._exit(3)
            return schedule(config, step)

        loop.learning_rate = dying
    started = time.monotonic()
    try:
        loop.train(_config(data_parallel=2))
        outcome = "finished"
    except Exception as error:  # noqa: BLE001 (what the surviving rank raised is the result)
        outcome = f"{type(error).__name__}: {error}"
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as handle:
        json.dump({"outcome": outcome, "seconds": time.monotonic() - started}, handle)


@pytest.mark.skipif(NO_GLOO, reason="torch.distributed with the gloo backend is not available in this build")
def test_a_rank_that_dies_mid_run_stops_the_other_with_an_error(tmp_path):
    import torch.multiprocessing as mp

    context = mp.get_context("forkserver")
    processes = [context.Process(target=_dying_rank, args=(rank, 2, str(tmp_path))) for rank in range(2)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=110)
    alive = [p for p in processes if p.is_alive()]
    for process in alive:
        process.terminate()
    assert not alive, "a rank still runs: the survivor hangs instead of failing"
    assert processes[1].exitcode == 3
    survivor = json.loads((tmp_path / "rank0.json").read_text())
    assert survivor["outcome"] != "finished" and survivor["seconds"] < 100, survivor


FLAGS = ["--seq-len", "64", "--context-length", "48", "--segment-lengths", "8,16,64", "--dilation-rates", "1,2,4",
         "--dim", "32", "--depth", "2", "--num-heads", "4", "--batch-size", "4", "--steps", "2", "--dtype", "float64",
         "--backend", "manual", "--eval-every", "2", "--quiet", "--json"]


@pytest.mark.slow  # four interpreters (one process, torchrun and its two ranks): 30 s here
@pytest.mark.skipif(NO_GLOO, reason="torch.distributed with the gloo backend is not available in this build")
def test_the_train_command_under_torchrun_gives_the_one_process_result(tmp_path):
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    alone = subprocess.run([sys.executable, "-m", "hilbert_lab.cli", "train", "--out", str(tmp_path / "one"), *FLAGS],
                           capture_output=True, text=True, env=env, timeout=300)
    assert alone.returncode == 0, alone.stderr
    launched = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                               "-m", "hilbert_lab.cli", "train", "--out", str(tmp_path / "two"), *FLAGS,
                               "--context-parallel", "2", "--ring-layout", "zigzag"],
                              capture_output=True, text=True, env=env, timeout=300)
    assert launched.returncode == 0, launched.stderr[-3000:]
    lines = [line for line in launched.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1  # rank 0 alone reports
    want = json.loads(alone.stdout.splitlines()[-1])["final_eval"]
    got = json.loads(lines[0])["final_eval"]
    assert got["count"] == want["count"] and abs(got["loss"] - want["loss"]) < 1e-10
    assert (tmp_path / "two" / "checkpoint.pt").is_file() and list((tmp_path / "two").glob("checkpoint-step2.dcp"))


def test_the_train_command_without_torchrun_exits_2_saying_how_to_launch_it(tmp_path, capsys, monkeypatch):
    from hilbert_lab.cli import main

    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    code = main(["train", "--out", str(tmp_path / "bare"), *FLAGS, "--data-parallel", "2"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "torchrun --nproc-per-node 2" in err
    assert not (tmp_path / "bare").exists()


def test_ranks_agree_on_a_configuration_whatever_their_device_index():
    from hilbert_lab.models.loop import agreed_configuration

    first, second = (agreed_configuration(_config(data_parallel=2, device=f"cuda:{index}")) for index in (0, 1))
    assert first == second and first["device"] == "cuda"
    assert agreed_configuration(_config(data_parallel=2, seed=1)) != agreed_configuration(_config(data_parallel=2))
