"""Kubernetes cannot run here, so the kind is tested by the operator manifests it generates:
one worker group per pool, pool resources on the dask workers, GPU limits and placement."""

from __future__ import annotations

import re

import pytest
import yaml
from dask.utils import parse_bytes

from sweep.clusters.client import ClusterConfig, kubernetes_specs


def k8s_config(**overrides) -> ClusterConfig:
    block = {
        "name": "dob",
        "image": "registry.example/dob:1",
        "env": {"HF_HUB_OFFLINE": "1"},
        "gpu": {"workers": 2, "cpu": "8", "memory": "32Gi", "gpus": 1,
                "node_selector": {"nvidia.com/gpu.present": "true"}},
        "cpu": {"workers": 5, "cpu": "1", "memory": "4Gi"},
    }
    block.update(overrides)
    return ClusterConfig.model_validate(
        {"kind": "kubernetes", "allowed_failures": 5, "kubernetes": block}
    )


def worker_container(group_spec: dict) -> dict:
    (container,) = group_spec["spec"]["containers"]
    return container


def arg_after(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_one_daskcluster_and_one_workergroup_for_the_cpu_pool():
    cluster, group = kubernetes_specs(k8s_config())
    assert (cluster["apiVersion"], cluster["kind"]) == ("kubernetes.dask.org/v1", "DaskCluster")
    assert (group["apiVersion"], group["kind"]) == ("kubernetes.dask.org/v1", "DaskWorkerGroup")
    assert cluster["metadata"]["name"] == "dob" and group["spec"]["cluster"] == "dob"
    assert group["metadata"]["name"] == "dob-cpu"
    assert cluster["spec"]["worker"]["replicas"] == 2
    assert group["spec"]["worker"]["replicas"] == 5


def test_gpu_pool_workers_carry_the_gpu_resource_and_limits():
    cluster, _ = kubernetes_specs(k8s_config())
    gpu = cluster["spec"]["worker"]
    container = worker_container(gpu)
    assert arg_after(container["args"], "--resources") == "GPU=1"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["resources"]["requests"] == {"cpu": "8", "memory": "32Gi"}
    assert gpu["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in (
        gpu["spec"]["tolerations"]
    )


def test_cpu_pool_pods_run_one_single_threaded_worker_with_one_cpu_slot_and_no_gpu():
    _, group = kubernetes_specs(k8s_config())
    worker = group["spec"]["worker"]
    container = worker_container(worker)
    assert arg_after(container["args"], "--resources") == "CPU=1"
    assert arg_after(container["args"], "--nthreads") == "1"
    assert "--nworkers" not in container["args"]  # the operator runs one worker per pod
    env = {item["name"]: item["value"] for item in container["env"]}
    assert {env[name] for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")} \
        == {"1"}
    assert container["resources"]["requests"] == {"cpu": "1", "memory": "4Gi"}
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    assert "nodeSelector" not in worker["spec"] and "tolerations" not in worker["spec"]


def test_a_cpu_pool_of_threaded_pods_is_refused_naming_the_fix(tmp_path):
    from storage.errors import InputError
    from sweep.clusters.config import load_cluster_config

    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"kind": "kubernetes", "kubernetes": {
        "image": "i", "gpu": {"workers": 1, "gpus": 1},
        "cpu": {"workers": 4, "cpu": "4", "threads": 4}}}))
    with pytest.raises(InputError) as caught:
        load_cluster_config(path)
    message = str(caught.value)
    assert "kubernetes.cpu.threads" in message and "(got 4)" in message
    assert "workers: C" in message and "\n" not in message


def test_worker_memory_limit_is_the_pod_memory_in_a_form_dask_parses():
    cluster, group = kubernetes_specs(k8s_config())
    pools = ((cluster["spec"]["worker"], "32Gi"), (group["spec"]["worker"], "4Gi"))
    for spec, pod_memory in pools:
        limit = arg_after(worker_container(spec)["args"], "--memory-limit")
        assert limit == pod_memory and parse_bytes(limit) == parse_bytes(pod_memory + "B")


def test_explicit_resources_override_the_pool_default():
    cfg = k8s_config(cpu={"workers": 1, "resources": {"CPU": 2, "GPU": 1}})
    _, group = kubernetes_specs(cfg)
    assert arg_after(worker_container(group["spec"]["worker"])["args"], "--resources") == (
        "CPU=2,GPU=1"
    )


def test_env_and_allowed_failures_reach_every_container():
    cluster, group = kubernetes_specs(k8s_config())
    containers = [
        worker_container(cluster["spec"]["worker"]),
        cluster["spec"]["scheduler"]["spec"]["containers"][0],
        worker_container(group["spec"]["worker"]),
    ]
    for container in containers:
        env = {item["name"]: item["value"] for item in container["env"]}
        assert env["HF_HUB_OFFLINE"] == "1"
        assert env["DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES"] == "5"
        assert container["image"] == "registry.example/dob:1"


@pytest.mark.parametrize("namespace", [None, "research"])
def test_namespace_is_set_only_when_configured(namespace):
    manifests = kubernetes_specs(k8s_config(namespace=namespace))
    assert [m["metadata"].get("namespace") for m in manifests] == [namespace, namespace]


def test_manifests_round_trip_through_yaml():
    manifests = kubernetes_specs(k8s_config())
    assert list(yaml.safe_load_all(yaml.safe_dump_all(manifests))) == manifests


def test_a_non_kubernetes_config_is_refused():
    with pytest.raises(ValueError, match="kubernetes: block"):
        kubernetes_specs(ClusterConfig())


def all_pod_specs(manifests: list[dict]) -> list[dict]:
    cluster, group = manifests
    return [cluster["spec"]["scheduler"]["spec"], cluster["spec"]["worker"]["spec"],
            group["spec"]["worker"]["spec"]]


def test_workers_get_the_credentials_secret_as_environment_and_no_pod_has_a_volume():
    manifests = kubernetes_specs(k8s_config(credentials_secret="sweep-store"))
    cluster, group = manifests
    for worker in (cluster["spec"]["worker"], group["spec"]["worker"]):
        assert worker_container(worker)["envFrom"] == [{"secretRef": {"name": "sweep-store"}}]
    for pod in all_pod_specs(manifests):
        assert "volumes" not in pod
        assert all("volumeMounts" not in c for c in pod["containers"])
    text = yaml.safe_dump_all(manifests)
    assert "AWS_SECRET_ACCESS_KEY" not in text  # the secret is referenced, never inlined


def test_without_a_secret_no_envfrom():
    cluster, _ = kubernetes_specs(k8s_config())
    assert "envFrom" not in worker_container(cluster["spec"]["worker"])


def test_kubernetes_refuses_a_local_store_and_accepts_an_object_store():
    from storage.errors import InputError
    from storage.location import StoreRef
    from sweep.clusters.client import check_store_fits_cluster

    with pytest.raises(InputError, match="share no folder.*s3://"):
        check_store_fits_cluster(k8s_config(), StoreRef.of("runs/study.zarr"))
    check_store_fits_cluster(k8s_config(), StoreRef.of("s3://bucket/study.zarr"))


def test_the_dry_run_prints_only_the_chosen_kind():
    from sweep.clusters.client import describe_cluster

    config = ClusterConfig.model_validate({
        "kind": "kubernetes", "kubernetes": k8s_config().kubernetes.model_dump(),
        "slurm": None,
    })
    top_level = {line.split(":")[0] for line in describe_cluster(config).splitlines()
                 if line and not line[0].isspace() and ":" in line}
    assert "kubernetes" in top_level and not top_level & {"local", "slurm", "address"}


def test_the_dockerfile_installs_extras_the_package_defines():
    import tomllib
    from pathlib import Path

    root = Path(__file__).parents[1]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    dockerfile = (root / "Dockerfile").read_text()
    installed = re.search(r'pip install (?:-c constraints\.txt )?"\.\[([^\]]*)\]"', dockerfile)
    wanted = installed[1].split(",")
    assert set(wanted) <= set(extras) and {"s3", "kubernetes"} <= set(wanted)
