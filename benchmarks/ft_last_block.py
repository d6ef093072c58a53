"""Holding rates per layer of FT-Transformers with their last block recomputed in full.

For each FT model of a sweep config: the trained model (its cached checkpoint; trained first if
absent) and its random-init control, both with `last_block: full`, on the model's measured rows;
per layer and token set, how many inputs the bound is tight on (the sweep's own verdict,
`workers.tasks.verdicts.evaluate_input`). The last layer is the block the library runs with the
CLS query only. The numbers behind docs/ft-transformer.md were measured on the earlier default sweep
(ft-cancer, ft-digits at d_block 64, standardisation, batch 64); on the current one:

    PYTHONPATH=. python benchmarks/ft_last_block.py ft-cancer@seed0 ft-wine@seed0
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np

from sweep.config.load import default_config_path, load_config
from workers.exact.equality import DEFAULT_TOL
from workers.inputs import open_dataset
from workers.models.extraction import load_extractor, model_dataset, prepare_model
from workers.models.registry import resolve_model
from workers.tasks.verdicts import evaluate_input


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="FT-Transformer model names of the config")
    parser.add_argument("--config", type=Path, default=default_config_path())
    args = parser.parse_args()
    config = load_config(args.config, base=Path.cwd())
    print("| model | weights | token set | per layer: holding/inputs (last: the CLS-only block) "
          "| all layers | without the last |")
    print("|---|---|---|---|---|---|")
    for name in args.models:
        entry = config.models[name]
        spec = resolve_model(entry.source, **{**entry.options, "last_block": "full"})
        dataset = open_dataset(config.datasets[entry.dataset].to_spec())
        prepare_model(spec, dataset, config.checkpoint_dir)
        inputs = model_dataset(spec, dataset)
        for label, weights in (("trained", spec), ("random-init", replace(spec, random_init=True))):
            extractor = load_extractor(weights, dataset=dataset, cache_dir=config.checkpoint_dir,
                                       device="cpu")
            outs = extractor.extract(inputs.load(range(len(inputs))), inputs.ids)
            for token_set in ("all", "content"):
                holds = np.array([evaluate_input(out.attention, out.token_kind, token_set,
                                                 DEFAULT_TOL)["holds"] for out in outs])
                n = len(outs)  # holds: (input, layer)
                per_layer = ", ".join(f"{k}/{n}" for k in holds.sum(0))
                every, kept = holds.mean(), holds[:, :-1].mean()
                print(f"| {name} | {label} | {token_set} | {per_layer} | {every:.1%} | "
                      f"{kept:.1%} |", flush=True)


if __name__ == "__main__":
    main()
