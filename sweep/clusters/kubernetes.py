"""The kubernetes kind: dask-kubernetes operator resources, one worker group per pool.

`kubernetes_specs` builds the manifests (a `DaskCluster` whose default worker group is the GPU
pool, and a `DaskWorkerGroup` for the CPU pool) with the operator's own `make_cluster_spec` /
`make_worker_spec`; `start_kubernetes` creates them through `KubeCluster`. The same dicts feed
dry runs, so what `sweep plan` shows is what gets applied. Pods carry no volume: the store is an
object store URL (`storage.location`) that every pod reaches with the credentials of the Secret
named by `credentials_secret` (`envFrom`); a worker's only files are its own scratch.
"""

from __future__ import annotations

import copy
from typing import Any

from storage.errors import InputError
from sweep.clusters.config import (
    THREAD_VARIABLES,
    ClusterConfig,
    KubernetesConfig,
    KubernetesPool,
    kubernetes_resources,
)

GPU_LIMIT = "nvidia.com/gpu"


def _operator() -> Any:
    """dask_kubernetes.operator, imported on first use (an optional dependency)."""
    try:
        import dask_kubernetes.operator as operator
    except ImportError:
        raise InputError(
            "kind: kubernetes needs dask-kubernetes: pip install 'dobrushin-sweep[kubernetes]'"
        ) from None
    return operator


def _worker_command(pool_name: str, pool: KubernetesPool) -> str:
    resources = ",".join(f"{k}={v:g}" for k, v in kubernetes_resources(pool_name, pool).items())
    return (
        f"dask-worker --nthreads {pool.threads} --memory-limit {pool.memory}"
        f" --resources {resources}"
    )


def _container_resources(pool: KubernetesPool) -> dict[str, dict[str, Any]]:
    limits: dict[str, Any] = {"cpu": pool.cpu, "memory": pool.memory}
    if pool.gpus:
        limits[GPU_LIMIT] = pool.gpus
    return {"requests": {"cpu": pool.cpu, "memory": pool.memory}, "limits": limits}


def _worker_spec(k8s: KubernetesConfig, pool_name: str, env: dict[str, str]) -> dict[str, Any]:
    make_worker_spec = _operator().make_worker_spec
    pool: KubernetesPool = getattr(k8s, pool_name)
    spec = make_worker_spec(
        image=k8s.image,
        n_workers=pool.workers,
        resources=_container_resources(pool),
        env={**{name: str(pool.threads) for name in THREAD_VARIABLES}, **env},
        worker_command=_worker_command(pool_name, pool),
    )
    _with_secret(spec, k8s.credentials_secret)
    if pool.node_selector:
        spec["spec"]["nodeSelector"] = dict(pool.node_selector)
    if pool.gpus:  # GPU nodes are commonly tainted so only GPU pods land there
        spec["spec"]["tolerations"] = [
            {"key": GPU_LIMIT, "operator": "Exists", "effect": "NoSchedule"}
        ]
    return spec


def _with_secret(pod: dict[str, Any], secret: str | None) -> None:
    """Every container of the pod spec gets the Secret's keys as environment variables."""
    if secret is None:
        return
    for container in pod["spec"]["containers"]:
        container.setdefault("envFrom", []).append({"secretRef": {"name": secret}})


def kubernetes_specs(cfg: ClusterConfig) -> list[dict[str, Any]]:
    """Operator manifests: a DaskCluster (GPU pool as default group), a DaskWorkerGroup (CPU)."""
    make_cluster_spec = _operator().make_cluster_spec
    k8s = cfg.kubernetes
    if k8s is None:
        raise ValueError("kubernetes_specs needs a config with a kubernetes: block")
    env = {"DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": str(cfg.allowed_failures), **k8s.env}
    cluster = make_cluster_spec(
        name=k8s.name,
        image=k8s.image,
        env=env,
        scheduler_service_type=k8s.scheduler_service_type,
    )
    cluster["spec"]["worker"] = _worker_spec(k8s, "gpu", env)
    group = {
        "apiVersion": "kubernetes.dask.org/v1",
        "kind": "DaskWorkerGroup",
        "metadata": {"name": f"{k8s.name}-cpu"},
        "spec": {"cluster": k8s.name, "worker": _worker_spec(k8s, "cpu", env)},
    }
    if k8s.namespace is not None:
        for manifest in (cluster, group):
            manifest["metadata"]["namespace"] = k8s.namespace
    return [cluster, group]


def start_kubernetes(cfg: ClusterConfig) -> Any:
    """Create the DaskCluster and the CPU worker group (needs a reachable cluster and operator)."""
    cluster_spec, group = kubernetes_specs(cfg)
    cluster = _operator().KubeCluster(
        custom_cluster_spec=copy.deepcopy(cluster_spec),
        namespace=cfg.kubernetes.namespace if cfg.kubernetes else None,
        shutdown_on_close=True,
    )
    cluster.add_worker_group("cpu", custom_spec=copy.deepcopy(group["spec"]["worker"]))
    return cluster
