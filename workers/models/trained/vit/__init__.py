"""A vision transformer the project trains itself: a small timm `VisionTransformer` on
scikit-learn's 8 x 8 digits (preset `vit-digits`, family `vit-trained`).

`options` (pure: defaults and rules), `data` (the images, the seeded initial model), `training`
(the recipe; the epochs it keeps), `adapter` (the family module of
`workers.models.registry.FAMILY_MODULES`: checkpoints, inputs, extraction). See
docs/training.md.
"""
