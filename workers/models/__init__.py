"""The models: frozen specs naming a family, its source and token layout, and their adapters.

`registry` holds `ModelSpec`, the presets and `resolve_model`; one module per family (`hf`,
`timm_`, and the models trained here in `trained/`, named in `registry.FAMILY_MODULES`) holds
its `Extractor`, its
`build_extractor` and its `token_layout`; `extraction` captures the attention of a built model;
`token_layout` sizes a model from its spec alone, for the driver.
"""

import lazy_loader

# The public names, each imported from its module on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "registry": ["ModelSpec", "PRESETS", "FAMILY_MODULES", "resolve_model"],
    "extraction": ["load_extractor", "prepare_model", "model_dataset"],
})
