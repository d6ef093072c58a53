"""Do the models trained here come out bit-identical under each CPU dispatch level?

Each setting (an environment for torch's kernels: ATen's `ATEN_CPU_CAPABILITY`, MKL's
`MKL_ENABLE_INSTRUCTIONS` and `MKL_CBWR`, oneDNN's `ONEDNN_MAX_CPU_ISA`) trains the same models
in a fresh process (the variables are read once, at the first kernel call), into a cache of its
own: the digits ViT (default recipe, seed 0) and the FT-Transformer on wine (seed 0). Per setting
and model, one JSON line: the capability torch reports, a digest of the kept weights, whether the
weights and the record (less its timings) equal the first setting's, the first epoch whose
history differs, the test score, the CPU seconds of the training, and the holding rate of the
kept weights on their test inputs (all tokens and content tokens, tol 1e-12, every input and
measured layer: the store's verdicts, computed here without a store).

    PYTHONPATH=. python benchmarks/dispatch_bench.py            # every setting, both models
    PYTHONPATH=. python benchmarks/dispatch_bench.py --models vit --settings native,pinned
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

SETTINGS: dict[str, dict[str, str]] = {
    "native": {},
    "aten-avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "aten-default": {"ATEN_CPU_CAPABILITY": "default"},
    "mkl-avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "onednn-avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    "avx2-machine": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                     "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "mkl-cbwr": {"MKL_CBWR": "COMPATIBLE"},
    "pinned": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"},
    "pinned-avx2-machine": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE",
                            "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
}
MODELS = {
    "vit": ("vit-digits", {}, ("image", "sklearn:digits")),
    "ft-wine": ("ft-transformer", {}, ("tabular", "sklearn:wine")),
}


def child(model: str, folder: str) -> dict:
    """Train `model` into `folder` in this process; its digests, record and rates."""
    import numpy as np
    import torch

    from workers.exact.equality import check, restrict
    from workers.exact.token_kinds import keep_mask
    from workers.inputs import DatasetSpec, open_dataset
    from workers.models.extraction import load_extractor, model_dataset, prepare_model
    from workers.models.registry import resolve_model

    source, options, (kind, data) = MODELS[model]
    spec = resolve_model(source, seed=0, **options)
    dataset = open_dataset(DatasetSpec(kind=kind, source=data))
    cpu = time.process_time()
    record = prepare_model(spec, dataset, folder)
    cpu = time.process_time() - cpu
    weights = next(p for p in os.listdir(folder) if p.endswith(".safetensors"))
    with open(os.path.join(folder, weights), "rb") as handle:
        digest = hashlib.sha256(handle.read()).hexdigest()[:16]
    measured = model_dataset(spec, dataset)
    extractor = load_extractor(spec, dataset=measured, cache_dir=folder, device="cpu")
    holds = {"all": [], "content": []}
    for start in range(0, len(measured), 64):
        rows = list(range(start, min(start + 64, len(measured))))
        for item in extractor.extract(measured.load(rows), [measured.ids[i] for i in rows]):
            content = keep_mask(item.token_kind, "content")
            for layer in item.attention.reshape(-1, *item.attention.shape[-2:]):
                a = np.asarray(layer, dtype=np.float64)
                holds["all"].append(bool(np.all(check(a).holds)))
                holds["content"].append(bool(np.all(check(restrict(a, content).matrix).holds)))
    timeless = {k: v for k, v in record.items() if k not in ("wall_s", "cpu_s")}
    return {"capability": torch.backends.cpu.get_cpu_capability(), "weights": digest,
            "record": timeless, "test_score": record["test_score"], "cpu_s": round(cpu, 1),
            "rates": {k: round(float(np.mean(v)), 4) for k, v in holds.items()},
            "verdicts": {k: int(np.sum(v)) for k, v in holds.items()}}


def first_difference(a: dict, b: dict) -> int | None:
    """The first epoch (from 1) whose history entries differ, None if none does."""
    for key in a["history"]:
        for epoch, (x, y) in enumerate(zip(a["history"][key], b["history"].get(key, []),
                                           strict=False), start=1):
            if x != y:
                return epoch
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    for model in args.models.split(","):
        first = None
        for name in args.settings.split(","):
            with tempfile.TemporaryDirectory() as folder:
                env = {**os.environ, **SETTINGS[name]}
                out = subprocess.run([sys.executable, __file__, "--child", model, folder],
                                     env=env, capture_output=True, text=True, check=True)
            result = json.loads(out.stdout.strip().splitlines()[-1])
            first = first or result
            print(json.dumps({
                "model": model, "setting": name, "env": SETTINGS[name],
                "capability": result["capability"], "weights": result["weights"],
                "same_weights": result["weights"] == first["weights"],
                "same_record": result["record"] == first["record"],
                "first_different_epoch": first_difference(first["record"], result["record"]),
                "test_score": result["test_score"], "best_epoch": result["record"]["best_epoch"],
                "cpu_s": result["cpu_s"], "rates": result["rates"],
                "verdicts": result["verdicts"]}), flush=True)


if __name__ == "__main__":
    main()
