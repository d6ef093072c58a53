"""dobrushin-sweep: when is the layerwise Dobrushin bound on attention rollout tight?

`sweep` owns configuration, the Dask graph, the cluster, the command line and reports.
"""
