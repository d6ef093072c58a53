"""One module per cluster kind (local, slurm, kubernetes) and the cluster file spec; the public
surface is `sweep.cluster`."""
