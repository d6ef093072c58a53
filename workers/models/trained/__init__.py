"""The models the project trains itself, and what their families share.

One package per family, each of the same four modules: `ft` (the FT-Transformer on a table,
family `ft-transformer`) and `vit` (the digits ViT, family `vit-trained`), each with `options`
(defaults and rules, pure), `data` (its inputs as the model reads them, the seeded initial
model), `training` (the recipe) and `adapter` (the family module of
`workers.models.registry.FAMILY_MODULES`). What they share: `split` (the seeded
train/validation/test split and the rows measured), `options` (option rules, the epochs kept),
`cache` (the checkpoint cache: keys, safetensors files, training records) and `family` (the
adapter's base: a checkpoint read from the cache or trained and written there, `prepare`,
`model_dataset`). See docs/training.md.
"""
