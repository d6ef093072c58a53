"""Sizes checked at load: trials, trials per task, models and planned tasks are bounded, and each
refusal is one line naming the key and the limit (issue 22, item 10). The study's sweep fits."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage.errors import InputError
from sweep.config.load import default_config_path, load_config, parse_config
from sweep.config.schema import MAX_CHUNK_TRIALS, MAX_MODELS, MAX_TRIALS
from sweep.driver.plan import MAX_PLAN_TASKS, ModelFacts, build_plan, check_plan_size

STORE = "/tmp/never-written.zarr"


def refusal(data: dict) -> str:
    with pytest.raises(InputError) as caught:
        parse_config({"store": STORE, **data})
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("section, values, key, limit", [
    ("matched_nulls", {"trials": 10**12, "chunk_trials": 10**8}, "matched_nulls.trials",
     MAX_TRIALS),  # the case: it planned 10,004 tasks of 1e8 trials each
    ("matched_nulls", {"trials": 10**7, "chunk_trials": 10**7}, "matched_nulls.chunk_trials",
     MAX_CHUNK_TRIALS),
    ("baseline", {"sizes": [2], "trials": MAX_TRIALS + 1}, "baseline.trials", MAX_TRIALS),
    ("baseline", {"sizes": [2], "trials": 10**7, "chunk_trials": 2 * 10**6},
     "baseline.chunk_trials", MAX_CHUNK_TRIALS),
])
def test_trials_and_trials_per_task_are_bounded(section, values, key, limit):
    message = refusal({section: values})
    assert message.startswith(f"{key}: ") and f"at most {limit} " in message, message


def test_the_largest_accepted_trial_settings_load():
    config = parse_config({"store": STORE, "matched_nulls": {
        "trials": MAX_TRIALS, "chunk_trials": MAX_CHUNK_TRIALS, "nulls": ["uniform"]}})
    assert config.matched_nulls.trials == MAX_TRIALS


def models(count: int, entry: dict) -> dict:
    return {"datasets": {"t": {"source": "sklearn:wine"}},
            "models": {f"m{i}": dict(entry) for i in range(count)}}


def test_more_models_than_a_sweep_plans_are_refused_before_any_is_resolved():
    message = refusal(models(MAX_MODELS + 1, {"source": "no-such-preset", "dataset": "t"}))
    assert message == (
        f"models: {MAX_MODELS + 1} models; at most {MAX_MODELS} in one sweep (the driver "
        f"plans them all before any task runs: 1,000 took 18 s, 10,000 took 5 minutes); split "
        f"them over several sweep configs")  # counted before the unknown preset is looked up


def test_seed_replicates_count_towards_the_models():
    entry = {"source": "ft-transformer", "dataset": "t", "seeds": [0, 1, 2]}
    assert len(parse_config({"store": STORE, **models(MAX_MODELS // 3, entry)}).models) \
        == 3 * (MAX_MODELS // 3)
    message = refusal(models(MAX_MODELS // 3 + 1, entry))
    assert message.startswith(f"models: {3 * (MAX_MODELS // 3 + 1)} models (seed replicates "
                              f"and controls included); at most {MAX_MODELS} in one sweep")


def text_sweep(shard_size: int, **extra) -> object:
    return parse_config({"store": STORE, "shard_size": shard_size, "matched_nulls": None,
                         "datasets": {"lines": {"path": "/tmp/lines.txt", "kind": "text"}},
                         "models": {"a": {"source": "tiny-roberta", "dataset": "lines"},
                                    "b": {"source": "tiny-roberta", "dataset": "lines"}},
                         **extra})


def test_a_plan_of_more_tasks_than_the_limit_is_refused_with_a_shard_size_that_fits():
    n = MAX_PLAN_TASKS // 4 + 1  # two models, an extraction and a test per shard of 1
    with pytest.raises(InputError) as caught:
        check_plan_size(text_sweep(1), {"a": n, "b": n})
    message = str(caught.value)
    assert message.startswith(f"the sweep plans {4 * n} tasks ({4 * n} extraction and test "
                              f"tasks of 1 inputs, 0 training and trial-chunk tasks); at most "
                              f"{MAX_PLAN_TASKS} ")
    size = int(message.split("raise shard_size to at least ")[1].split(",")[0])
    assert check_plan_size(text_sweep(size), {"a": n, "b": n}) <= MAX_PLAN_TASKS
    assert size == 1 + 1  # the smallest that fits
    facts = ModelFacts(tuple(f"line-{i}" for i in range(n)), 2, 30, 100)
    with pytest.raises(InputError, match=f"the sweep plans {4 * n} tasks"):
        build_plan(text_sweep(1), {"a": facts, "b": facts})  # before any task spec exists


def test_trial_chunk_tasks_count_towards_the_plan():
    baseline = {"sizes": [2, 3, 4, 8, 16], "trials": 10**8, "chunk_trials": 25_000}
    config = text_sweep(32, baseline=baseline)  # 5 nulls x 5 sizes x 4,000 chunks: 100,000
    assert check_plan_size(config, {"a": 1000, "b": 1000}) == 100_000 + 2 * 2 * 32
    with pytest.raises(InputError, match="or raise chunk_trials, or split the models"):
        check_plan_size(config, {"a": 10**6, "b": 10**6})


def test_the_study_sweep_fits_at_its_datasets_full_sizes():
    config = load_config(default_config_path().with_name("study.yaml"), base=Path("/tmp"))
    full = {"imagenet-val": 50_000, "sst2": 872, "california": 20_640, "adult": 48_842}
    tasks = check_plan_size(config, {name: full[entry.dataset]
                                     for name, entry in config.models.items()})
    assert tasks < MAX_PLAN_TASKS / 5


def test_sweep_plan_refuses_a_too_large_plan_before_tokenizing_any_input(
        tmp_path, monkeypatch, capsys):
    """`sweep plan` counts tasks from the datasets' lengths, as `sweep run` does, before it
    tokenizes 100,002 lines to size each model."""
    import sweep.driver.runner
    from sweep.cli.entry import main

    n = MAX_PLAN_TASKS // 4 + 1
    (tmp_path / "lines.txt").write_text("".join(f"line {i}\n" for i in range(n)))
    path = tmp_path / "sweep.yaml"
    path.write_text("store: s.zarr\nshard_size: 1\nmatched_nulls: null\n"
                    "datasets:\n  lines: {path: lines.txt, kind: text}\n"
                    "models:\n  a: {source: tiny-roberta, dataset: lines}\n"
                    "  b: {source: tiny-roberta, dataset: lines}\n")

    def tokenize(*args, **kwargs):
        raise AssertionError("tokenized before the size check")

    monkeypatch.setattr(sweep.driver.runner, "gather_facts", tokenize)  # sweep run's sizing
    assert main(["plan", str(path)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and f"the sweep plans {4 * n} tasks" in err[0], err
    assert not (tmp_path / "s.zarr").exists()


@pytest.mark.parametrize("data, words", [
    ({"tol": float("inf")}, "tol: Input should be a finite number"),
    ({"tol": 1.0}, "tol: Input should be less than 1"),  # kappa lies in [0, 1]
    ({"device": "bogus"}, "device: Value error, 'bogus': choose auto"),
    ({"datasets": {"d": {"source": "pydoc:topics"}},
      "models": {"m": {"source": "tiny-roberta", "dataset": "d", "device": "cuda:x"}}},
     "models.m.device: Value error, 'cuda:x': choose auto"),
])
def test_a_tolerance_or_device_that_would_be_fingerprinted_wrong_is_refused_at_load(data,
                                                                                   words):
    """Both are fingerprinted: accepted, a typo would tie the store to it (a 1e300 tol also
    crashed the test kernel)."""
    assert words in refusal(data)


def test_check_and_extract_refuse_a_bad_tolerance_or_device_in_one_line(tmp_path, capsys):
    import numpy as np

    from sweep.cli.entry import main

    np.save(tmp_path / "a.npy", np.full((3, 3), 1 / 3))
    assert main(["check", str(tmp_path / "a.npy"), "--tol", "1e15"]) == 2
    assert "must be a finite number in [0, 1)" in capsys.readouterr().err
    (tmp_path / "lines.txt").write_text("one line\n")
    assert main(["extract", "tiny-roberta", str(tmp_path / "lines.txt"), "--device", "gpu",
                 "--out", str(tmp_path / "x.npz")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--device 'gpu': choose auto" in err, err
    assert main(["extract", "tiny-roberta", str(tmp_path / "lines.txt"), "--device", "cuda:7",
                 "--out", str(tmp_path / "x.npz")]) == 3
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--device: cuda:7 is not on this machine" in err, err
