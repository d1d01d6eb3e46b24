"""Whole jobs under ``mpiexec -n 2`` and ``-n 3``: launch, stop, failure, resume."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest


def _ok(proc: Any) -> None:
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(("n", "bit_generator"), [(2, "PCG64"), (3, "Philox")])
def test_every_rank_trains_the_same_model_from_the_chiefs_state(
    run_mpi: Any, n: int, bit_generator: str
) -> None:
    proc, results = run_mpi(n, "train.py", "plain", "10", env={"BIT_GENERATOR": bit_generator})
    _ok(proc)
    assert sorted(results) == list(range(n))
    assert [r["chief"] for r in results.values()] == [True] + [False] * (n - 1)
    assert {r["step"] for r in results.values()} == {10}
    chief = results[0]
    for name in ("w", "b", "fortran", "transposed", "pretrained"):
        assert all(r[name] == chief[name] for r in results.values()), name
    # Filled by the chief's init_fn: non-zero, and the same bytes on every rank whatever
    # the memory order of the workers' own arrays (Fortran, transposed).
    assert 0.0 not in np.ravel(chief["fortran"] + chief["transposed"] + chief["pretrained"])
    # init_fn ran on the chief only; its new entry reached the workers, not trainable.
    assert [r["init_ran"] for r in results.values()] == [True] + [False] * (n - 1)
    assert not any(r["pretrained_trainable"] for r in results.values())
    draws = [tuple(r["draws"]) for r in results.values()]
    assert len(set(draws)) == n, "each rank must draw its own random numbers"


def test_chief_only_plugins_load_on_rank_0_only(run_mpi: Any) -> None:
    proc, results = run_mpi(2, "train.py", "plain", "2")
    _ok(proc)
    for chief_only in ("checkpoint", "summaries", "progress"):
        assert chief_only in results[0]["plugins"]
        assert chief_only not in results[1]["plugins"]
    assert "mpi" in results[1]["plugins"]


@pytest.mark.parametrize("n", [2, 3])
def test_a_stop_requested_on_rank_1_only_ends_every_rank_at_that_step(run_mpi: Any, n: int) -> None:
    proc, results = run_mpi(n, "train.py", "stop7", "20")
    _ok(proc)
    assert [r["step"] for r in results.values()] == [7] * n


@pytest.mark.parametrize(
    ("scenario", "rank", "message"),
    [
        ("fail", 2, "ValueError: boom on the last rank"),
        ("nan", 1, "FloatingPointError: NaN loss on rank 1"),
    ],
)
def test_an_exception_on_one_rank_ends_every_rank_naming_the_rank(
    run_mpi: Any, scenario: str, rank: int, message: str
) -> None:
    proc, results = run_mpi(3, "train.py", scenario, "50")
    assert proc.returncode != 0
    assert results == {}, "no rank may finish normally"
    assert f"rank {rank} of 3 failed at step" in proc.stderr
    assert message in proc.stderr


def test_an_aborted_error_on_one_rank_ends_the_job_instead_of_recovering_alone(
    run_mpi: Any,
) -> None:
    # Alone, AbortedError re-creates the session; with other ranks that would
    # leave them in collectives this rank no longer calls: fail-stop instead.
    proc, results = run_mpi(2, "train.py", "aborted", "20")
    assert proc.returncode != 0
    assert results == {}
    assert "rank 1 of 2 failed at step 3 with AbortedError" in proc.stderr
    assert "Not recovered: this process trains with others" in proc.stderr
    assert "re-creating the session" not in proc.stderr
    assert "CollectiveTimeoutError" not in proc.stderr


def test_an_exception_while_closing_ends_the_job_naming_the_rank(run_mpi: Any) -> None:
    proc, results = run_mpi(2, "train.py", "endfail", "3")
    assert proc.returncode != 0
    assert 1 not in results
    assert "rank 1 of 2 failed at step 3 with RuntimeError: end hook failed on rank 1" in (
        proc.stderr
    )


def test_a_collective_on_only_some_ranks_times_out_naming_the_collective(run_mpi: Any) -> None:
    proc, results = run_mpi(3, "train.py", "partial", "10", env={"MONITORED_MPI_TIMEOUT": "2"})
    assert proc.returncode != 0
    assert results == {}
    # The first rank to time out ends the job: the one in the stray collective, or one
    # waiting for it in the step's stop decision; either names what it waited in.
    assert "CollectiveTimeoutError: " in proc.stderr
    assert "of 3 waited 2s and not every rank joined" in proc.stderr
    assert (
        "allreduce 'only-on-rank-0'" in proc.stderr
        or "the stop decision after step 2" in proc.stderr
    )


def test_ranks_with_different_arrays_are_refused_naming_the_array_and_ranks(
    run_mpi: Any,
) -> None:
    proc, results = run_mpi(3, "train.py", "mismatch", "10")
    assert proc.returncode != 0
    assert results == {}
    assert "StateMismatchError" in proc.stderr
    assert "rank 1: array 'w' has shape (5,) here, (4,) on the chief" in proc.stderr
    assert "rank 2: array 'w' has shape (6,) here, (4,) on the chief" in proc.stderr


def test_sigterm_on_rank_1_gives_one_checkpoint_at_one_step_and_a_clean_exit(
    run_mpi: Any, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    proc, results = run_mpi(2, "train.py", "sigterm", "50", env={"CKPT_DIR": str(ckpt)})
    _ok(proc)
    steps = {r["step"] for r in results.values()}
    assert len(steps) == 1
    (step,) = steps
    assert 5 <= step < 50
    assert "rank 1 received SIGTERM" in proc.stderr
    saved = sorted(p.name for p in ckpt.glob("model.ckpt-*.json"))
    assert saved == ["model.ckpt-0.json", f"model.ckpt-{step}.json"]
    assert f"saving a checkpoint of step {step} and stopping" in proc.stderr


def test_a_resumed_distributed_run_ends_bitwise_identical_to_an_uninterrupted_one(
    run_mpi: Any, tmp_path: Path
) -> None:
    whole, whole_results = run_mpi(
        2, "train.py", "plain", "12", env={"CKPT_DIR": str(tmp_path / "a"), "SAVE_STEPS": "6"}
    )
    _ok(whole)
    env = {"CKPT_DIR": str(tmp_path / "b"), "SAVE_STEPS": "6"}
    first, _ = run_mpi(2, "train.py", "plain", "6", env=env)
    _ok(first)
    second, resumed = run_mpi(2, "train.py", "plain", "12", env=env)
    _ok(second)
    # The resumed chief restored instead of running init_fn; all else is bitwise equal.
    assert [r.pop("init_ran") for r in resumed.values()] == [False, False]
    assert [r.pop("init_ran") for r in whole_results.values()] == [True, False]
    assert resumed == whole_results


def test_collectives_and_the_distributed_optimizer_average_over_ranks(run_mpi: Any) -> None:
    proc, results = run_mpi(3, "collectives.py")
    _ok(proc)
    for rank, r in results.items():
        assert r["allreduce_mean"] == [1.0, 1.0]
        assert r["allreduce_max"] == [2]
        assert r["broadcast"] == [20.0]
        assert r["allgather"] == [[0], [0, 1], [0, 1, 2]]
        assert r["allgather_scalar"] == [0.0, 1.0, 2.0]
        # Mean over the values 0 | 0 1 | 0 1 2 of the three ranks.
        assert r["mean"] == pytest.approx(4 / 6)
        assert r["w"] == [-2.0, -2.0, -2.0], rank  # the mean of 1, 2, 3, descended once
        # Rows 0, 1, 2 got 0/3, 1/3, 2/3 (each rank's row gathered, divided by 3).
        assert r["e"] == [[0.0, 0.0], [-1 / 3, -1 / 3], [-2 / 3, -2 / 3], [0.0, 0.0]]
        assert r["fp16"] == [[1.0, 1.0], "<f8"]
        # Averaged by reduce-scatter (each rank divides its block) and allgather.
        assert r["large"]["a"], rank
        assert r["large"]["b"], rank
        assert r["large"]["c"], rank
        assert r["large"]["dtypes"] == ["<f4", "<f8", "<f4"]
        assert r["large"]["self_world"], rank
        # op=Sum: the sum over the ranks 1 + 2 + 3, sparse rows not divided.
        assert r["summed"] == [[6.0, 6.0], [[1.0, 1.0]] * 3]
    # One machine: the local ranks are the ranks.
    assert [r.pop("local") for r in results.values()] == [[0, 3], [1, 3], [2, 3]]
    assert all(r == results[0] for r in results.values())
    refusals = results[0]["refusals"]
    assert refusals["allreduce_dtype"].startswith(
        "allreduce 'g': the ranks pass different arrays; every rank must pass the same dtype "
        "and shape:\n  rank 0: float64 (3,)\n  rank 1: float32 (3,)\n  rank 2: float32 (3,)"
    )
    assert "rank 1: float64 (2,)\n  rank 2: float64 (3,)" in refusals["allreduce_shape"]
    assert "broadcast 'broadcast'" in refusals["broadcast"]
    assert "rank 2: float64 (3, 1)" in refusals["broadcast"]
    assert "same shape after the first axis" in refusals["allgather"]
    assert "rank 1: float64 rows of shape (3,)" in refusals["allgather"]
    assert refusals["optimizer_same"] is None
    changed = refusals["optimizer_changed"]
    assert "DistributedOptimizer: the ranks pass different gradients" in changed
    assert "rank 1: 'v': no gradient (None) here, float64 (2, 2) on rank 0" in changed
    assert "rank 2: 'w': float32 (3,) here, float64 (3,) on rank 0" in changed
    names = refusals["optimizer_names"]
    assert "rank 1: a gradient for 'x', which rank 0 does not pass" in names
    assert "rank 2: a gradient for 'x'" in names
    # Changed on rank 1 alone after an agreed call: refused, and the collectives
    # after it (the results above) still work.
    for kind in ("scatter", "fp16"):
        assert (
            "rank 1: 'a': float32 (300001,) here, float32 (300000,) on rank 0"
            in (refusals[f"optimizer_{kind}_changed"])
        ), kind


def test_the_distributed_example_learns_on_two_ranks(run_mpi: Any) -> None:
    example = Path(__file__).parents[3] / "examples" / "distributed.py"
    proc, _ = run_mpi(2, example, "--steps", "150", pass_out=False)
    _ok(proc)
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("2 rank(s), step 150: held-out accuracy")
    assert float(line.split("accuracy ")[1].split()[0]) > 0.85


def test_the_horovod_example_with_rank_0_checkpoints_resumes_bit_for_bit(
    run_mpi: Any, tmp_path: Path
) -> None:
    # Issue 22: Horovod's TF1 script ported (checkpoint_dir on rank 0 only, a per-rank
    # generator through prefetch, StopAtStepHook(last_step // size)), stopped and
    # started again, ends with the bits of an uninterrupted run on every rank.
    example = Path(__file__).parents[3] / "examples" / "horovod_digits.py"

    def weights(steps: int, directory: Path) -> dict[str, str]:
        proc, _ = run_mpi(
            2, example, "--steps", str(steps), "--checkpoint-dir", str(directory), pass_out=False
        )
        _ok(proc)
        assert "BroadcastGlobalVariablesHook" not in proc.stderr
        # mpiexec forwards the ranks' output in chunks: another rank's line may be
        # glued to this one, so each digest is found by its pattern, not by line.
        return {
            f"rank {rank}": digest
            for rank, digest in re.findall(r"rank (\d+) weights ([0-9a-f]{16})", proc.stdout)
        }

    straight = weights(120, tmp_path / "a")
    weights(60, tmp_path / "b")
    resumed = weights(120, tmp_path / "b")
    assert set(straight) == {"rank 0", "rank 1"}
    assert len(set(straight.values())) == 1, "every rank holds the same weights"
    assert resumed == straight
    # Rank 0 wrote every checkpoint: the last at step 120 // 2.
    assert (tmp_path / "b" / "model.ckpt-60.json").exists()
    assert not (tmp_path / "b" / "model.ckpt-61.json").exists()


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("batches", [12, 13])
def test_a_sharded_evaluation_gives_every_rank_the_results_over_all_shards(
    run_mpi: Any, n: int, batches: int
) -> None:
    # 13 batches make uneven shards: the ranks whose shard is done sit steps out
    # (voting only) until every shard is, and no batch is left out of the results.
    proc, results = run_mpi(n, "evaluate.py", env={"NUM_BATCHES": str(batches)})
    _ok(proc)
    values = np.arange(4.0 * batches)  # the batches of 4, all ranks together
    count = 2.0 * batches  # even values
    assert sorted(r["shard"] for r in results.values()) == sorted(
        len(range(rank, batches, n)) for rank in range(n)
    )
    for result in results.values():
        # Evaluated after steps 1 and 3 (w = 2 and 4), and alone on the final w = 4.
        assert result["in_training"] == [
            [1, {"mean": pytest.approx(2 * values.mean()), "count": count}],
            [3, {"mean": pytest.approx(4 * values.mean()), "count": count}],
        ]
        assert result["alone"] == {"mean": pytest.approx(4 * values.mean()), "count": count}
        assert result["steps"] == result["shard"], "a rank counts its own eval steps"
    assert (
        len({json.dumps(r["in_training"]) + json.dumps(r["alone"]) for r in results.values()}) == 1
    )


@pytest.mark.parametrize("how", ["feed", "iterate"])
def test_an_empty_shard_stops_every_rank_before_the_first_step(run_mpi: Any, how: str) -> None:
    # 2 batches over 3 ranks: rank 2 has nothing to read, so no rank takes a step.
    proc, results = run_mpi(3, "uneven.py", how, env={"NUM_BATCHES": "2"})
    _ok(proc)
    assert [r["step"] for r in results.values()] == [0, 0, 0]
    assert "stop requested by the end of input pipeline 'list'" in proc.stderr


@pytest.mark.parametrize("how", ["feed", "iterate"])
def test_input_ending_on_one_rank_first_stops_every_rank_after_the_same_step(
    run_mpi: Any, how: str
) -> None:
    # 20 batches sharded over 3 ranks: 7, 7 and 6; the step holds a collective (the
    # gradient allreduce). Rank 2 finds no 7th batch at the end of step 6: every
    # rank agrees to stop there, no rank waits in a step rank 2 never runs.
    proc, results = run_mpi(3, "uneven.py", how)
    _ok(proc)
    assert "CollectiveTimeoutError" not in proc.stderr
    assert [r["step"] for r in results.values()] == [6, 6, 6]
    assert [r["next"] for r in results.values()] == [6, 6, 6]
    assert results[0]["w"] == results[1]["w"] == results[2]["w"]


def test_train_and_evaluate_with_checkpoints_evaluates_on_every_rank_together(
    run_mpi: Any, tmp_path: Path
) -> None:
    # Evaluations follow the chief's checkpoints alone; under mpiexec every rank
    # evaluates every min_eval_frequency steps instead (this crashed MPICH before).
    model_dir = tmp_path / "model"
    proc, results = run_mpi(2, "train_and_evaluate.py", str(model_dir))
    _ok(proc)
    expected = [[2, {"mean": 3.0}], [4, {"mean": 5.0}], [6, {"mean": 7.0}]]
    assert [r["heard"] for r in results.values()] == [expected, expected]
    assert [r["final"] for r in results.values()] == [[6, {"mean": 7.0}]] * 2
    assert sorted(p.name for p in model_dir.glob("model.ckpt-*.json")) == [
        f"model.ckpt-{step}.json" for step in (0, 2, 4, 6)
    ]


def test_a_finished_job_started_again_takes_no_step(run_mpi: Any, tmp_path: Path) -> None:
    # StopAtStepHook asks to stop while the session is created (the checkpoint is at
    # its last step): every rank agrees before the first step, none trains step 7.
    env = {"CKPT_DIR": str(tmp_path / "ckpt"), "SAVE_STEPS": "3"}
    first, _ = run_mpi(2, "train.py", "plain", "6", env=env)
    _ok(first)
    again, results = run_mpi(2, "train.py", "plain", "6", env=env)
    _ok(again)
    assert [r["step"] for r in results.values()] == [6, 6]
    assert not list((tmp_path / "ckpt").glob("model.ckpt-7*"))


@pytest.mark.parametrize("mode", ["once", "repeatedly"])
def test_a_sharded_evaluator_beside_a_live_trainer_evaluates_one_checkpoint_on_every_rank(
    run_mpi: Any, tmp_path: Path, mode: str
) -> None:
    # The trainer saves every few milliseconds and keeps its newest two: the
    # checkpoint the chief picks may be gone a moment later, and rank 1 would
    # list another one. Every rank must evaluate the chief's pick, together.
    ckpt_dir = tmp_path / "ckpt"
    ckpt_dir.mkdir()
    script = Path(__file__).parent / "scripts" / "evaluate_beside_trainer.py"
    trainer = subprocess.Popen(
        [sys.executable, str(script), "trainer", str(ckpt_dir), "4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        proc, results = run_mpi(2, script.name, mode, str(ckpt_dir), env={"EVALUATIONS": "40"})
    finally:
        if mode == "once":
            trainer.kill()
        trainer_output = trainer.communicate(timeout=60)[0]
    _ok(proc)
    assert sorted(results) == [0, 1]
    assert results[0] == results[1], "the ranks evaluated different checkpoints"
    evaluated = [r for r in results[0] if r[0] != "none"]
    assert evaluated, trainer_output
    for path, step, mean in evaluated:
        assert path.endswith(f"model.ckpt-{step}")
        assert mean == step, f"rank states differ: {path} evaluated as {mean}"
    if mode == "repeatedly":
        assert trainer.returncode == 0, trainer_output
        assert evaluated[-1][1] == 1_000_000


def test_a_checkpoint_damaged_on_the_chief_is_skipped_by_every_rank(
    run_mpi: Any, tmp_path: Path
) -> None:
    import monitored
    from monitored_checkpoint import Saver

    ckpt_dir = tmp_path / "ckpt"
    for step in (1, 2):
        state = monitored.TrainState({"w": np.full(1000, float(step))}, global_step=step)
        Saver().save(state, str(ckpt_dir / "model.ckpt"))
    data = ckpt_dir / "model.ckpt-2.safetensors"
    data.write_bytes(data.read_bytes()[:-1] + b"x")
    proc, results = run_mpi(
        2, "evaluate_beside_trainer.py", "once", str(ckpt_dir), env={"EVALUATIONS": "2"}
    )
    _ok(proc)
    evaluated = [[str(ckpt_dir / "model.ckpt-1"), 1, 1.0]] * 2  # fresh and template states
    assert results == {0: evaluated, 1: evaluated}
    # One warning per evaluation: the chief's, which alone reads the checkpoints.
    assert proc.stderr.count("skipping checkpoint") == 2, proc.stderr


def test_no_checkpoint_to_evaluate_is_the_same_error_on_every_rank(
    run_mpi: Any, tmp_path: Path
) -> None:
    ckpt_dir = tmp_path / "ckpt"
    ckpt_dir.mkdir()
    (ckpt_dir / "model.ckpt-3.json").write_text("{not json")  # unusable, and the only one
    proc, results = run_mpi(
        2, "evaluate_beside_trainer.py", "once", str(ckpt_dir), env={"EVALUATIONS": "1"}
    )
    _ok(proc)
    assert results[0] == results[1]
    [[kind, message]] = results[0]
    assert kind == "none"
    assert f"checkpoint directory {ckpt_dir} holds no checkpoint to evaluate" in message
