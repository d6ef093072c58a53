"""The sweep config: YAML parsed once, at the edge, into frozen pydantic models.

`schema` holds the models (`SweepConfig`, key by key, with the checks that need no other key),
`seeds` and `controls` the two expansions of a model entry, `yaml_io` the one YAML reader, and
`load` applies them in order: file -> schema -> seed replicates -> controls. `default.yaml` (the
bundled offline sweep) and `study.yaml` (the paper's models) live here too.
"""

import lazy_loader

# The public names, each imported from its module on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "load": ["load_config", "parse_config", "default_config_path"],
    "schema": ["SweepConfig"],
})
