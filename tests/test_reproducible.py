"""The same config gives the same bits on any torch thread count: FT-Transformer's training
(record and checkpoint) and a whole sweep's arrays are identical whether the process runs torch
on 1 thread or on 2 (training and extraction fix their own count: `workers.models.determinism`).
Across CPU dispatch levels they are not (docs/training.md): the record names the levels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numba
import numpy as np
import pytest
import threadpoolctl
import torch
from safetensors.torch import load_file

from sweep.config.load import load_config
from sweep.driver.runner import InProcessExecutor, run_sweep
from tests.test_pruned_kernel import family
from tests.test_sweep_local import arrays, write_config
from workers.inputs import DatasetSpec, open_dataset
from workers.models.determinism import TORCH_THREADS, dispatch, fixed_torch
from workers.models.extraction import prepare_model
from workers.models.registry import resolve_model
from workers.models.trained.ft import adapter as ft_transformer

SPEC = resolve_model("ft-transformer", n_blocks=2, d_block=32, max_epochs=4, patience=4)


@pytest.fixture
def process_threads():
    """Set the process's own torch thread count for one call; restored after the test."""
    saved = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(saved)


def trained(folder: Path, threads: int, set_threads) -> tuple[dict, dict]:
    set_threads(threads)
    wine = open_dataset(DatasetSpec(kind="tabular", source="sklearn:wine"))
    record = prepare_model(SPEC, wine, folder)
    assert torch.get_num_threads() == threads  # the process's own count is given back
    return record, load_file(ft_transformer.checkpoint_path(SPEC, wine.table, folder))


def test_training_on_one_and_on_two_threads_gives_the_same_record_and_weights(
        tmp_path, process_threads):
    one, two = (trained(tmp_path / str(n), n, process_threads) for n in (1, 2))
    drop_wall = ({k: v for k, v in record.items() if k != "wall_s"} for record in (one[0], two[0]))
    assert next(drop_wall) == next(drop_wall)
    assert one[0]["torch_threads"] == TORCH_THREADS
    assert one[1].keys() == two[1].keys()
    assert all(torch.equal(one[1][k], two[1][k]) for k in one[1])


def test_a_sweep_on_one_and_on_two_threads_writes_the_same_arrays(tmp_path, process_threads):
    stores = {}
    for threads in (1, 2):
        process_threads(threads)
        folder = tmp_path / f"threads-{threads}"
        folder.mkdir()
        config = load_config(write_config(folder, models=("vit", "ft", "rob")))
        assert run_sweep(config, InProcessExecutor(), progress=False).exit_code == 0
        stores[threads] = arrays(folder / "sweep.zarr")
    assert stores[1].keys() == stores[2].keys()
    for key in stores[1]:
        np.testing.assert_array_equal(stores[1][key], stores[2][key], err_msg=key, strict=True)


def test_fixed_torch_restores_the_process_settings_when_the_last_user_leaves(process_threads):
    process_threads(2)
    with fixed_torch(1, deterministic=True):
        with fixed_torch(1):
            assert torch.get_num_threads() == 1
            assert torch.are_deterministic_algorithms_enabled()
        assert torch.get_num_threads() == 1
        with pytest.raises(ValueError, match="torch threads: 2 asked"):
            with fixed_torch(2):
                pass
    assert torch.get_num_threads() == 2
    assert not torch.are_deterministic_algorithms_enabled()


def test_threads_of_one_worker_may_enter_together_whatever_count_each_had(process_threads):
    """torch keeps the count per OS thread: a worker thread that last ran torch on 2 threads
    enters beside one already inside on 1, and runs on 1 (a thread-based Dask worker)."""
    import threading

    inside, release, seen, errors = threading.Event(), threading.Event(), [], []

    def first() -> None:
        with fixed_torch(1):
            inside.set()
            release.wait(30)

    def second() -> None:
        torch.set_num_threads(2)  # this thread's own count before it enters
        inside.wait(30)
        try:
            with fixed_torch(1):
                seen.append(torch.get_num_threads())
        except ValueError as error:
            errors.append(error)
        finally:
            release.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == [] and seen == [1]


@pytest.mark.parametrize(("layers", "t"), [(12, 40), (2, 420)])
def test_the_test_stage_on_one_and_on_two_numba_threads_gives_the_same_cells(layers, t):
    """Every result variable, the decision radius included, whichever kernel driver the thread
    count picks (matrices over threads at 12 layers; at 2 layers of n >= PARALLEL_MIN_N, one
    matrix at a time spread over the threads against one thread)."""
    from workers.exact.token_kinds import TokenKind
    from workers.tasks.verdicts import evaluate_input

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba was started with one thread")
    rng = np.random.default_rng(t)
    stack = np.stack([family("sink", t, rng) for _ in range(layers)])  # (layer, q, k)
    kinds = np.full(t, TokenKind.CONTENT, dtype=np.int8)
    kinds[0] = TokenKind.CLS
    saved = numba.get_num_threads()
    cells = {}
    try:
        for threads in (1, 2):
            numba.set_num_threads(threads)
            cells[threads] = {s: evaluate_input(stack, kinds, s, 1e-12) for s in ("all", "content")}
    finally:
        numba.set_num_threads(saved)
    for token_set, one in cells[1].items():
        assert np.isfinite(one["radius"]).all()
        for name, values in one.items():
            np.testing.assert_array_equal(values, cells[2][token_set][name],
                                          err_msg=f"{token_set} {name}", strict=True)


def test_extraction_torch_threads_do_not_reach_numba_or_blas():
    """`fixed_torch(1)`, entered in a worker thread as extraction does, leaves numba's and the
    BLAS libraries' thread counts as they were, inside the block and after it."""
    def counts() -> tuple[int, set[int]]:
        blas = {lib["num_threads"] for lib in threadpoolctl.threadpool_info()
                if lib["user_api"] == "blas"}
        return numba.get_num_threads(), blas

    before, seen = counts(), []

    def extraction() -> None:
        with fixed_torch(1):
            seen.append(counts())
        seen.append(counts())

    worker = threading.Thread(target=extraction)
    worker.start()
    worker.join(30)
    assert seen == [before, before]
    assert counts() == before


TRAIN_IN_CHILD = """
import json, sys
from workers.inputs import DatasetSpec, open_dataset
from workers.models.extraction import prepare_model
from workers.models.registry import resolve_model
spec = resolve_model("ft-transformer", n_blocks=2, d_block=8, max_epochs=1, patience=1)
wine = open_dataset(DatasetSpec(kind="tabular", source="sklearn:wine"))
print(json.dumps(prepare_model(spec, wine, sys.argv[1])["dispatch"]))
"""


def test_the_training_record_names_the_kernels_torch_dispatched_to(tmp_path):
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE",
           "ONEDNN_MAX_CPU_ISA": "AVX2", "PYTHONPATH": str(Path(__file__).parents[1])}
    out = subprocess.run([sys.executable, "-c", TRAIN_IN_CHILD, str(tmp_path)], env=env,
                         capture_output=True, text=True, check=True)
    record = json.loads(out.stdout.strip().splitlines()[-1])
    assert record["aten"] == "DEFAULT"  # read at the first kernel, in the fresh process
    assert record["mkl_cbwr"] == "COMPATIBLE" and record["onednn_max_isa"] == "AVX2"
    assert dispatch()["aten"] == torch.backends.cpu.get_cpu_capability()
    assert set(dispatch()) == {"cpu", "aten", "mkl_isa", "mkl_cbwr", "onednn_max_isa"}
