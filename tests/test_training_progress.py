"""Training you can see: while a model trains, the run's progress names it with its epoch and
validation score, its ETA counts the training left, and `sweep status` shows the preparation
stage; the epochs cross from the worker to the driver through the store (`storage.markers`'
training records), here from worker processes of a real LocalCluster."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import WorkerPlugin

from storage.markers import TrainingProgress, read_progress, write_progress
from sweep.cli.entry import main
from sweep.config.load import load_config
from sweep.driver import training_watch
from sweep.driver.graph import DaskExecutor
from sweep.driver.runner import run_sweep
from sweep.driver.training_watch import TrainingWatch
from sweep.terminal import progress as progress_module
from sweep.terminal.progress import Counts, LineProgress


def record(model: str, epoch: int, elapsed: float, **more) -> TrainingProgress:
    values = dict(model=model, epoch=epoch, epochs=40, early_stopping=False, stop_by=40,
                  score="val_accuracy", value=0.5, elapsed_s=elapsed, cpu_s=elapsed,
                  resumed_from=None, resume_point=None, updated=0.0)
    return TrainingProgress(**{**values, **more})


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_line_names_each_model_in_training_and_the_eta_counts_the_training_left(tmp_path):
    clock = Clock()
    watch = TrainingWatch(tmp_path, ["vit@seed0@epoch5", "vit@seed0", "vit@seed1"], poll_s=0,
                          clock=clock)
    out = io.StringIO()
    bar = LineProgress(20, "sweep", "task", out, interval=30, clock=clock, note=watch.note,
                       training_total=3)
    write_progress(tmp_path, record("vit@seed0@epoch5", 10, 20.0))  # 2 s an epoch, 30 to go
    clock.now = 30.0
    bar.tick()
    # No other task has finished: at least seed 0's 60 s and seed 1's 80 s, one at a time.
    assert out.getvalue() == (
        "sweep: 0/20 tasks done, 20 pending, 0 failed, 0.00 tasks/s, ETA > 2m20s; training "
        "vit@seed0@epoch5 epoch 10 of 40 (val_accuracy 0.5000); 0 of 2 trained\n")
    clock.now = 90.0
    watch.done("vit@seed0@epoch5")  # 20 s at its last record, read 60 s ago: it took 80 s
    bar.update(training=True)  # a line: no model in training now, 60 s of training so far
    bar.update(training=True)  # vit@seed0 found its run in the cache
    write_progress(tmp_path, record("vit@seed1", 20, 40.0, early_stopping=True, stop_by=30))
    bar.update(5)
    clock.now = 120.0
    bar.tick()
    # seed 1: 10 epochs at 2 s; then 12 other tasks at 5 tasks per 60 s without training.
    assert out.getvalue().splitlines()[-1] == (
        "sweep: 7/20 tasks done, 13 pending, 0 failed, 0.06 tasks/s, ETA 2m44s; training "
        "vit@seed1 epoch 20 of at most 40 (val_accuracy 0.5000); 1 of 2 trained (1m20s each)")


def test_without_training_the_line_is_the_rates(tmp_path):
    watch = TrainingWatch(tmp_path, ["ft"], poll_s=0)
    watch.done("ft")
    assert watch.note(Counts(1, 0, 4, 1, 1, 10.0)) == progress_module.Note()


GO = "go"  # the file that lets the worker's training go on after epoch 2


class HoldAtEpoch2(WorkerPlugin):
    """In each worker process: report every epoch, and hold the training after epoch 2's
    record until the driver's log has named it (the test writes GO into `folder`)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def setup(self, worker) -> None:
        import workers.tasks.extract
        from workers.models.trained import run

        run.REPORT_EVERY_S = 0.0
        real, folder = workers.tasks.extract.progress_writer, Path(self.folder)

        def holding_writer(store, model):
            write = real(store, model)

            def report(progress):
                write(progress)
                deadline = time.monotonic() + 120
                while progress.epoch == 2 and not (folder / GO).exists():
                    if time.monotonic() > deadline:
                        raise TimeoutError("the driver never named epoch 2")
                    time.sleep(0.05)

            return report

        workers.tasks.extract.progress_writer = holding_writer


class Log(io.StringIO):
    """The run's stderr off a terminal; at the first line naming epoch 2 of 3, takes `sweep
    status` and writes GO (once: a later line may still name epoch 2 after the training went
    on, and a second status would see it over)."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder, self.lock = folder, threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            if ("vit@seed0 epoch 2 of 3 (val_accuracy" in text
                    and not self.folder.joinpath(GO).exists()):
                self.folder.joinpath("status.txt").write_text(status_now(self.folder))
                self.folder.joinpath(GO).touch()
            return super().write(text)


def status_now(folder: Path) -> str:
    """`sweep status` of the store while the training is held."""
    import contextlib

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["status", str(folder / "sweep.zarr")])
    return out.getvalue()


def test_a_sweep_on_worker_processes_shows_the_epochs_and_status_the_stage(tmp_path,
                                                                           monkeypatch):
    (tmp_path / "sweep.yaml").write_text(
        "store: sweep.zarr\nshard_size: 8\ncache_dir: cache\nbaseline: null\n"
        "matched_nulls: null\ntoken_sets: [all]\ndatasets:\n"
        "  digits: {kind: image, source: 'sklearn:digits', limit: 8}\nmodels:\n"
        "  vit: {source: vit-digits, dataset: digits, seeds: [0], control: random-init,\n"
        "        options: {depth: 1, embed_dim: 8, num_heads: 2, epochs: 3}}\n")
    config = load_config(tmp_path / "sweep.yaml")
    log = Log(tmp_path)
    monkeypatch.setattr("sys.stderr", log)
    monkeypatch.setattr(progress_module, "INTERVAL_S", 0.2)
    monkeypatch.setattr(training_watch, "POLL_S", 0.0)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      resources={"GPU": 1, "CPU": 1}, dashboard_address=":0") as cluster:
        with Client(cluster) as client:
            client.register_plugin(HoldAtEpoch2(str(tmp_path)))
            summary = run_sweep(config, DaskExecutor(client), progress=True)
    assert summary.exit_code == 0
    lines = log.getvalue().splitlines()
    named = [line for line in lines if "training vit@seed0 epoch 2 of 3" in line]
    assert named and "0 of 1 trained" in named[0] and "ETA" in named[0]
    status = (tmp_path / "status.txt").read_text().splitlines()
    assert any(line.split()[:2] == ["vit@seed0", "prepare"] for line in status)
    assert any(line.startswith("training vit@seed0 epoch 2 of 3 (val_accuracy ") for line in
               status)
    assert not any(line.startswith("attention ") for line in status)  # nothing extracted yet
    assert read_progress(tmp_path / "sweep.zarr") == {}  # the record goes with the training


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_bar_gives_the_notes_eta_and_text():
    out = Terminal()
    bar = progress_module.progress(
        10, "sweep", "task", stream=out, training_total=1,
        note=lambda counts: progress_module.Note("training ft epoch 2 of at most 1000 "
                                                 "(val_loss 0.5000)", 30.0))
    bar.update()
    bar.close()
    assert "1/10 [" in out.getvalue()
    assert "ETA 30s, training ft epoch 2 of at most 1000 (val_loss 0.5000)]" in out.getvalue()
