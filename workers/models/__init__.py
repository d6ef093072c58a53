"""The models: frozen specs naming a family, its source and token layout, and their adapters.

`registry` holds `ModelSpec`, the presets and `resolve_model`; one module per family (`hf`,
`timm_`, `ft_transformer`, named in `registry.FAMILY_MODULES`) holds its `Extractor`, its
`build_extractor` and its `token_layout`; `extraction` captures the attention of a built model;
`token_layout` sizes a model from its spec alone, for the driver.
"""

from importlib import import_module

_EXPORTS = {
    "ModelSpec": "registry",
    "PRESETS": "registry",
    "FAMILY_MODULES": "registry",
    "resolve_model": "registry",
    "load_extractor": "extraction",
    "prepare_model": "extraction",
    "model_dataset": "extraction",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    """The public names, each imported from its module on first use."""
    if name in _EXPORTS:
        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
