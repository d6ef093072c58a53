"""Every ```python block of README.md and docs/*.md runs on a small default-like store and shows
something: no exception, no warning, and no displayed xarray/pandas result that is all zeros or
empty. Blocks run REPL-style (an expression statement's value is displayed), in order within
a file, from the folder that holds `runs/default.zarr`. README.md is read at test time.

Every `sweep show`, `sweep extract` and `sweep precision` command of those files that names a
model or an input (in a shell block or inline) runs too, against the store it names: the model
and the input are the real sweep's (`sweep/config/default.yaml`, `sweep/config/vit-digits.yaml`,
checked by name) and the command exits 0 on this folder's small stores, which carry the same
names. A command with placeholders (STORE, MODEL, `...`) is a pattern, not run.

Plain xarray on that store gives no warning either (`xr.open_datatree(store, engine="zarr")`):
a finished run consolidates the metadata.
"""

from __future__ import annotations

import ast
import re
import shlex
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from storage.query import cells, holding_rates, open_results
from sweep.config.load import load_config
from sweep.driver.runner import InProcessExecutor, run_sweep

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)

CONFIG = """store: runs/default.zarr
shard_size: 4
token_sets: [all, content]
retries: 0
cache_dir: cache
datasets:
  topics: {source: 'pydoc:topics', limit: 6}
  photos: {source: 'sklearn:sample_images', limit: 4}
  cancer: {kind: tabular, source: 'sklearn:breast_cancer', limit: 8}
models:
  minilm-l6: {source: tiny-distilbert, dataset: topics, batch_size: 3}
  tiny-roberta: {source: tiny-roberta, dataset: topics, batch_size: 3}
  tiny-dinov2-reg: {source: tiny-dinov2-reg, dataset: photos}
  ft-cancer: {source: ft-transformer, dataset: cancer, seeds: [0],
              options: {n_blocks: 2, d_block: 8, max_epochs: 2}}
baseline: {sizes: [2, 4], trials: 1000, seed: 0, chunk_trials: 1000}
"""
"""The default sweep's names (its models, datasets and input ids) on tiny models and few inputs."""
TRAINING = """store: runs/vit-digits.zarr
shard_size: 4
baseline: null
retries: 0
cache_dir: cache
datasets:
  digits: {kind: image, source: 'sklearn:digits', limit: 4}
models:
  vit: {source: vit-digits, dataset: digits, seeds: [0], checkpoints: [0, 1, best],
        control: random-init, options: {epochs: 2, depth: 2, embed_dim: 16, num_heads: 2}}
"""
"""docs/training.md's store: the digits ViT over its checkpoints, a tiny recipe."""


def snippets() -> list[tuple[str, int, str]]:
    """(file relative to the repo, line, code) of every ```python block."""
    out = []
    for path in DOCS:
        text = path.read_text()
        for match in FENCE.finditer(text):
            out.append((str(path.relative_to(ROOT)), text[:match.start()].count("\n") + 1,
                        match.group(1)))
    return out


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A folder holding `runs/default.zarr` (the default sweep's model names and token sets,
    tiny random models, a few inputs each) and `runs/vit-digits.zarr` (`TRAINING`)."""
    folder = tmp_path_factory.mktemp("docs")
    for name, config in (("sweep.yaml", CONFIG), ("vit-digits.yaml", TRAINING)):
        (folder / name).write_text(config)
        summary = run_sweep(load_config(folder / name), InProcessExecutor(), progress=False)
        assert summary.exit_code == 0
    return folder


def displayed(value) -> list[str]:
    """Why a displayed value says nothing: all zeros, or nothing at all."""
    if isinstance(value, xr.DataArray | pd.Series | pd.DataFrame):
        values = np.asarray(value.values if not isinstance(value, pd.DataFrame)
                            else value.select_dtypes("number").values, dtype=float)
        if values.size == 0:
            return ["an empty result"]
        finite = values[np.isfinite(values)]
        if finite.size == 0 or not finite.any():
            return [f"a result that is all zeros or NaN: {value}"]
    return []


def run_repl(code: str, namespace: dict, where: str) -> list[str]:
    """Run `code` statement by statement, displaying expression values; the complaints."""
    complaints, tree = [], ast.parse(code, where)
    for statement in tree.body:
        if isinstance(statement, ast.Expr):
            value = eval(compile(ast.Expression(statement.value), where, "eval"), namespace)
            if hasattr(value, "compute") and not isinstance(value, pd.DataFrame):
                value = value.compute()
            complaints += displayed(value)
        else:
            exec(compile(ast.Module([statement], []), where, "exec"), namespace)
    return complaints


def test_every_doc_has_its_snippets_found():
    found = {where for where, _, _ in snippets()}
    assert {"docs/results.md", "docs/storage.md", "docs/models.md"} <= found


@pytest.mark.parametrize("document", sorted({where for where, _, _ in snippets()}))
def test_snippets_run_and_show_something(document, folder, monkeypatch):
    monkeypatch.chdir(folder)
    namespace: dict = {"__name__": "__doc_snippet__"}
    shown: list[str] = []
    import builtins

    def printing(*args, **kwargs):  # what a snippet prints is displayed too
        for arg in args:
            shown.extend(displayed(arg))
        builtins.print(*args, **kwargs)

    namespace["print"] = printing
    for where, line, code in snippets():
        if where != document:
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            complaints = run_repl(code, namespace, f"{where}:{line}")
        noisy = [f"{w.category.__name__}: {w.message}" for w in caught
                 if not issubclass(w.category, DeprecationWarning | PendingDeprecationWarning)]
        assert not noisy, f"{where}:{line} warns: {noisy}"
        assert not complaints + shown, f"{where}:{line} shows {complaints + shown}"


def test_plain_xarray_opens_a_finished_store_without_warnings(folder):
    store = folder / "runs" / "default.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tree = xr.open_datatree(store, engine="zarr", chunks={})
    ours = open_results(store)
    for name in ("minilm-l6", "tiny-roberta", "tiny-dinov2-reg", "ft-cancer@seed0"):
        for var in ("margin", "holds", "status"):
            np.testing.assert_array_equal(tree[f"{name}/results"][var].values,
                                          ours[name][var].values, err_msg=f"{name}/{var}")


def test_tidy_view_of_the_sweep_store_equals_the_per_model_rates(folder):
    store = folder / "runs" / "default.zarr"
    ds = cells(store)
    tested = ds.where(ds["status"] == 0)
    rate = tested["holds"].groupby(["model", "token_set"]).mean()
    for r in holding_rates(open_results(store), by=("model", "token_set")).to_dict("records"):
        assert float(rate.sel(model=r["model"], token_set=r["token_set"])) == \
            pytest.approx(r["rate"]), r


def zarr_arrays(store: Path) -> dict[str, str]:
    """Every array of a local store: path -> its zarr v3 data_type (a name, or {name: ...})."""
    import json

    out = {}
    for meta in store.rglob("zarr.json"):
        document = json.loads(meta.read_text())
        if document.get("node_type") == "array":
            kind = document["data_type"]
            out[str(meta.parent.relative_to(store))] = kind if isinstance(kind, str) else \
                kind["name"]
    return out


def test_tensorstore_reads_every_numeric_array_to_the_same_values(folder):
    """Another Zarr v3 implementation (Google's tensorstore) opens every numeric array of the
    store and reads zarr-python's values. The coordinate labels stored with zarr-python's
    variable-length `string` data type (input_id, input_digest, head, null) it refuses: this
    test pins that they are the only ones (issue 35, item 4, still open)."""
    ts = pytest.importorskip("tensorstore")
    import zarr

    store = folder / "runs" / "default.zarr"
    arrays = zarr_arrays(store)
    refused = {}
    for path, kind in sorted(arrays.items()):
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(store / path)}}
        try:
            values = ts.open(spec, read=True).result().read().result()
        except ValueError as error:
            refused[path] = (kind, str(error).splitlines()[0])
            continue
        np.testing.assert_array_equal(values, zarr.open_array(str(store / path), mode="r")[...],
                                      err_msg=path, strict=True)
    assert len(arrays) - len(refused) >= 40  # results, attention, nulls, baseline
    assert {kind for kind, _ in refused.values()} == {"string"}, refused
    assert {path.rsplit("/", 1)[-1] for path in refused} == {"input_id", "input_digest", "head",
                                                             "null"}


INLINE = re.compile(r"`(sweep (?:show|extract|precision) [^`]+)`")
NAMING = ("show", "extract", "precision")
REAL = {"runs/default.zarr": "sweep/config/default.yaml",
        "runs/vit-digits.zarr": "sweep/config/vit-digits.yaml"}
"""The stores the docs' commands name -> the config that makes each (this folder has both)."""


def fenced(text: str) -> tuple[list[tuple[int, str]], str]:
    """The lines of `text`'s shell blocks (```bash, ```sh, ```console or unnamed), with their
    line numbers, and the prose: every fenced line blanked (line numbers kept)."""
    shell, prose, language = [], [], None
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            language = line[3:].strip() if language is None else None
            prose.append("")
        elif language is None:
            prose.append(line)
        else:
            if language in ("", "bash", "sh", "console"):
                shell.append((number, line))
            prose.append("")
    return shell, "\n".join(prose)


def doc_commands() -> list[tuple[str, list[str]]]:
    """(`file:line`, the words after `sweep`) of every `sweep show|extract|precision` command of
    README.md and docs/*.md that names a model or an input: shell-block lines (each part of an
    `a && b` line) and inline code spans."""
    found = []
    for path in DOCS:
        name = str(path.relative_to(ROOT))
        shell, prose = fenced(path.read_text())
        for number, line in shell:
            for part in line.split("&&"):
                if part.strip().startswith("sweep "):
                    found.append((f"{name}:{number}", shlex.split(part, comments=True)[1:]))
        for span in INLINE.finditer(prose):
            found.append((f"{name}:{prose[:span.start()].count(chr(10)) + 1}",
                          shlex.split(" ".join(span.group(1).split()))[1:]))
    return [(where, words) for where, words in found if words and words[0] in NAMING
            and (names_model_or_input(words))]


def names_model_or_input(words: list[str]) -> bool:
    """`sweep show STORE MODEL INPUT`, `sweep extract MODEL INPUTS`, `--model NAME`."""
    positional = [w for w in words[1:] if not w.startswith("-")]
    return "--model" in words or (words[0] != "precision" and len(positional) >= 2)


def is_pattern(words: list[str]) -> bool:
    """A command with placeholders (an upper-case word such as STORE, MODEL, hf:FOLDER,
    LINES.txt; `...`, `[`) shows a form, not a run."""
    parts = [p for w in words for p in re.split(r"[:/=]", w)]
    return any(re.fullmatch(r"[A-Z][A-Z0-9_]*(\.[a-z]+)?", p) for p in parts) or any(
        "..." in w or "…" in w or "[" in w for w in words)


COMMANDS = doc_commands()


def test_the_docs_commands_that_name_models_are_found():
    where = {w.split(":")[0] for w, words in COMMANDS if not is_pattern(words)}
    assert {"README.md", "docs/results.md", "docs/models.md", "docs/training.md"} <= where
    assert any(is_pattern(words) for _, words in COMMANDS)  # and the forms are told apart


def real_names(store: str) -> tuple[set[str], dict[str, set[str]]]:
    """The models of the sweep that writes `store` and, per model, its input ids."""
    from sweep.driver.freshness import measured_datasets

    config = load_config(ROOT / REAL[store], base=ROOT)
    return set(config.models), {name: set(dataset.ids) for name, dataset in
                                measured_datasets(config).items()}


@pytest.mark.parametrize(("where", "words"), [c for c in COMMANDS if not is_pattern(c[1])],
                         ids=[w for w, words in COMMANDS if not is_pattern(words)])
def test_a_doc_command_runs_against_the_store_it_names(where, words, folder, monkeypatch,
                                                       tmp_path):
    from sweep.cli.entry import main

    positional = [w for w in words[1:] if not w.startswith("-")]
    if words[0] in ("show", "precision"):
        store = positional[0]
        assert store in REAL, f"{where}: {store} is none of the stores the docs build"
        models, inputs = real_names(store)
        named = [positional[1]] if words[0] == "show" else \
            [words[i + 1] for i, w in enumerate(words) if w == "--model"]
        assert set(named) <= models, f"{where}: {named} not among {sorted(models)}"
        if words[0] == "show":
            assert positional[2] in inputs[positional[1]], \
                f"{where}: {positional[2]} is not an input of {positional[1]} in {store}"
    monkeypatch.chdir(folder)
    monkeypatch.setenv("DOBRUSHIN_CACHE", str(tmp_path / "cache"))  # `sweep extract` trains
    assert main(words) == 0, f"{where}: sweep {' '.join(words)}"


def test_report_help_names_every_section_of_a_report(folder, capsys, monkeypatch):
    """`sweep report --help` is generated from `SECTIONS`, which lists every heading a report
    has: checked on the digits ViT's store (controls, seeds, checkpoints, training)."""
    from sweep.cli.commands.report import SECTIONS
    from sweep.cli.entry import main

    assert main(["report", str(folder / "runs" / "vit-digits.zarr"), "--no-cache"]) == 0
    headings = [line[3:] for line in capsys.readouterr().out.splitlines()
                if line.startswith("## ")]
    starts = [start for _, start in SECTIONS]
    assert [next(s for s in starts if h.startswith(s)) for h in headings] == starts
    monkeypatch.setenv("COLUMNS", "2000")
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    described = " ".join(capsys.readouterr().out.split())
    assert all(name in described for name, _ in SECTIONS)
