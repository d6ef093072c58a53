"""Are the models trained here bit-identical under each CPU dispatch level, and at what cost?

Each setting is an environment for torch's CPU kernels, given to a fresh process (the variables
are read once, at the first kernel call): ATen's `ATEN_CPU_CAPABILITY` (default, avx2, avx512),
MKL's `MKL_CBWR` (its conditional-numerical-reproducibility branch: COMPATIBLE, AVX2, ...) and
`MKL_ENABLE_INSTRUCTIONS` (the highest ISA it may dispatch to), oneDNN's `ONEDNN_MAX_CPU_ISA`,
and `torch.mkldnn=0` (oneDNN off, `torch.backends.mkldnn.enabled`, set in the child before
training). A setting is a name of SETTINGS or `VAR=value+VAR=value`. The child trains one model
with the project's entry point (`prepare_model`, one torch thread) into a cache of its own, and
prints the sha256 of the kept weights (the safetensors file's bytes), the training record less
its timings, the ATen capability and MKL CNR branch it ran with, and the CPU seconds of
`prepare_model` (its imports done before the clock starts) and the record's own `cpu_s` (the
digits ViT's); with `--rates`, also the holding rates of the kept weights on their test inputs
(all tokens and content tokens, tol 1e-12, every input and layer: the store's verdicts without a
store; extracted in the child, so under the same setting). The settings run in turn, `--rounds`
times (alternating, so a change in the machine's load hits them alike); a summary line per
setting gives the median CPU seconds and the ratio to the first setting's.

    PYTHONPATH=. python benchmarks/dispatch_bench.py --model vit --set epochs=5
    PYTHONPATH=. python benchmarks/dispatch_bench.py --model ft-wine \
        --settings native,portable --rounds 3
    PYTHONPATH=. python benchmarks/dispatch_bench.py --model vit --seed 1 \
        --settings native,ATEN_CPU_CAPABILITY=avx2+MKL_ENABLE_INSTRUCTIONS=AVX2
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

SETTINGS: dict[str, dict[str, str]] = {
    "native": {},
    "aten-avx512": {"ATEN_CPU_CAPABILITY": "avx512"},
    "aten-avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "aten-default": {"ATEN_CPU_CAPABILITY": "default"},
    "mkl-avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "mkl-cbwr": {"MKL_CBWR": "COMPATIBLE"},
    "onednn-avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    "onednn-off": {"torch.mkldnn": "0"},
    "avx2-machine": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                     "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "onednn-sse41": {"ONEDNN_MAX_CPU_ISA": "SSE41"},
    "portable": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "torch.mkldnn": "0"},
    "portable-avx2-machine": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE",
                              "torch.mkldnn": "0", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                              "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "portable-onednn-sse41": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE",
                              "ONEDNN_MAX_CPU_ISA": "SSE41"},
    "portable-aten-avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE",
                           "torch.mkldnn": "0"},
}
MODELS = {  # name: (source, dataset kind, dataset source)
    "vit": ("vit-digits", "image", "sklearn:digits"),
    "ft-wine": ("ft-transformer", "tabular", "sklearn:wine"),
    "ft-cancer": ("ft-transformer", "tabular", "sklearn:breast_cancer"),
}
TIMINGS = ("wall_s", "cpu_s")
RECIPES = ("workers.models.trained.vit.training", "workers.models.trained.ft.training")


def setting_env(name: str) -> dict[str, str]:
    """The variables of setting `name` (a SETTINGS key or `VAR=value+VAR=value`)."""
    if name in SETTINGS:
        return SETTINGS[name]
    pairs = [part.split("=", 1) for part in name.split("+")]
    if not all(len(pair) == 2 for pair in pairs):
        raise SystemExit(f"setting {name!r}: neither one of {list(SETTINGS)} nor VAR=value+...")
    return dict(pairs)


def child(model: str, seed: int, options: dict, folder: str, rates: bool) -> dict:
    """Train `model` into `folder` in this process: its digest, record and cost (and, with
    `rates`, the holding rates of the kept weights, extracted in this process too)."""
    import ctypes
    import importlib

    import torch

    from workers.inputs import DatasetSpec, open_dataset
    from workers.models.extraction import prepare_model
    from workers.models.registry import resolve_model

    if os.environ.get("torch.mkldnn") == "0":
        torch.backends.mkldnn.enabled = False
    source, kind, data = MODELS[model]
    spec = resolve_model(source, seed=seed, **options)
    dataset = open_dataset(DatasetSpec(kind=kind, source=data))
    for module in RECIPES:  # imported before the clock starts: the CPU seconds are training's
        importlib.import_module(module)
    cpu = time.process_time()
    record = prepare_model(spec, dataset, folder)
    cpu = time.process_time() - cpu
    weights = [p for p in os.listdir(folder) if p.endswith(".safetensors") and ".epoch-" not in p]
    with open(os.path.join(folder, weights[0]), "rb") as handle:
        digest = hashlib.sha256(handle.read()).hexdigest()
    mkl = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
    return {"rates": holding_rates(spec, dataset, folder) if rates else None,
            "capability": torch.backends.cpu.get_cpu_capability(),
            "mkl_cbwr": mkl.mkl_serv_cbwr_get(1),  # 1: CNR off; 3: COMPATIBLE (mkl.h)
            "sha256": digest, "record": {k: v for k, v in record.items() if k not in TIMINGS},
            "cpu_s": round(cpu, 2), "record_cpu_s": record.get("cpu_s")}


def holding_rates(spec, dataset, folder: str) -> dict[str, list[int]]:
    """Per token set (all, content): [holding, measured] input-layer pairs of the kept weights on
    the inputs the model is measured on (tol 1e-12): the store's verdicts, without a store."""
    import numpy as np

    from workers.exact.equality import check, restrict
    from workers.exact.token_kinds import keep_mask
    from workers.models.extraction import load_extractor, model_dataset

    measured = model_dataset(spec, dataset)
    extractor = load_extractor(spec, dataset=measured, cache_dir=folder, device="cpu")
    holds: dict[str, list[bool]] = {"all": [], "content": []}
    for start in range(0, len(measured), 64):
        rows = list(range(start, min(start + 64, len(measured))))
        for item in extractor.extract(measured.load(rows), [measured.ids[i] for i in rows]):
            content = keep_mask(item.token_kind, "content")
            for layer in item.attention.reshape(-1, *item.attention.shape[-2:]):
                a = np.asarray(layer, dtype=np.float64)
                holds["all"].append(bool(np.all(check(a).holds)))
                holds["content"].append(bool(np.all(check(restrict(a, content).matrix).holds)))
    return {k: [int(np.sum(v)), len(v)] for k, v in holds.items()}


def first_difference(a: dict, b: dict) -> int | None:
    """The first epoch (from 1) at which any history entry differs, None if none does."""
    ha, hb = a["history"], b["history"]
    length = max(len(v) for v in (*ha.values(), *hb.values()))
    for epoch in range(length):
        for key in set(ha) | set(hb):
            x, y = ha.get(key, []), hb.get(key, [])
            if (x[epoch] if epoch < len(x) else None) != (y[epoch] if epoch < len(y) else None):
                return epoch + 1
    return None


def run_child(model: str, seed: int, options: dict, env: dict[str, str], rates: bool) -> dict:
    """One training in a fresh process under `env` (added to this process's environment)."""
    with tempfile.TemporaryDirectory() as folder:
        out = subprocess.run(
            [sys.executable, __file__, "--child", model, str(seed), json.dumps(options), folder,
             str(int(rates))],
            env={**os.environ, **env}, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"child under {env} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit", choices=list(MODELS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="OPTION=VALUE",
                        help="a training option (YAML value), e.g. epochs=5; repeatable")
    parser.add_argument("--settings", default="native,aten-avx2,aten-default")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--rates", action="store_true",
                        help="also the holding rates of the kept weights (extracted in the child)")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        model, seed, options, folder, rates = args.child
        print(json.dumps(child(model, int(seed), json.loads(options), folder, rates == "1")))
        return
    options = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)}
    names = list(dict.fromkeys(args.settings.split(",")))  # one summary per setting
    order = args.settings.split(",")
    results: dict[str, list[dict]] = {name: [] for name in names}
    first = None
    for round_ in range(args.rounds):
        for name in order:
            env = setting_env(name)
            result = run_child(args.model, args.seed, options, env, args.rates)
            results[name].append(result)
            first = first or result
            history = result["record"]["history"]
            print(json.dumps({
                "round": round_, "setting": name, "env": env,
                "capability": result["capability"], "mkl_cbwr": result["mkl_cbwr"],
                "sha256": result["sha256"][:16],
                "same_weights": result["sha256"] == first["sha256"],
                "same_record": result["record"] == first["record"],
                "first_different_epoch": first_difference(first["record"], result["record"]),
                "val": history.get("val_accuracy", history.get("val_loss"))[-1],
                "test_score": result["record"]["test_score"],
                "best_epoch": result["record"]["best_epoch"],
                "epochs_run": result["record"]["epochs_run"], "rates": result["rates"],
                "test_accuracy_by_epoch": history.get("test_accuracy"), "cpu_s": result["cpu_s"],
                "record_cpu_s": result["record_cpu_s"]}), flush=True)
    def median(name: str, key: str) -> float | None:
        values = [r[key] for r in results[name] if r[key] is not None]
        return statistics.median(values) if values else None

    base = {key: median(names[0], key) for key in ("cpu_s", "record_cpu_s")}
    for name in names:
        runs = results[name]
        cpu, train = median(name, "cpu_s"), median(name, "record_cpu_s")
        print(json.dumps({
            "summary": name, "model": args.model, "seed": args.seed, "options": options,
            "sha256": sorted({r["sha256"][:16] for r in runs}),
            "same_as_first_setting": all(r["sha256"] == first["sha256"] for r in runs),
            "test_score": runs[0]["record"]["test_score"],
            "cpu_s_median": cpu, "cpu_ratio": round(cpu / base["cpu_s"], 3),
            "train_cpu_s_median": train,
            "train_cpu_ratio": None if train is None else round(train / base["record_cpu_s"], 3),
            }), flush=True)


if __name__ == "__main__":
    main()
