"""The FT-Transformer the project trains on a table (family `ft-transformer`).

`options` (pure: defaults and rules), `data` (the preprocessing, the model's inputs, the seeded
initial model), `training` (the recipe of Gorishniy et al. 2021), `adapter` (the family module of
`workers.models.registry.FAMILY_MODULES`: checkpoints, inputs, extraction). See
docs/ft-transformer.md and docs/training.md.
"""
