"""The sweep config: YAML parsed once, at the edge, into frozen pydantic models.

`schema` holds the models (`SweepConfig`, key by key, with the checks that need no other key),
`seeds` and `controls` the two expansions of a model entry, `yaml_io` the one YAML reader, and
`load` applies them in order: file -> schema -> seed replicates -> controls. `default.yaml` (the
bundled offline sweep) and `study.yaml` (the paper's models) live here too.
"""

from importlib import import_module

_EXPORTS = {
    "load_config": "load",
    "parse_config": "load",
    "default_config_path": "load",
    "SweepConfig": "schema",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    """The public names, each imported from its module on first use."""
    if name in _EXPORTS:
        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
