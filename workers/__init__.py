"""What runs inside tasks: the pure math (kappa, the equality test, baselines) and the model
adapters with the datasets they read. No Dask in here."""
