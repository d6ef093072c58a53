"""cluster.yaml: every documented kind parses, defaults are machine-sized, errors are one line
naming the file, line and key."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from distributed import Nanny, Worker

from storage.errors import InputError
from sweep.clusters.client import ClusterConfig, describe_cluster, load_cluster_config
from sweep.clusters.local import local_pools, use_processes, worker_specs
from sweep.clusters.slurm import job_scripts, lost_jobs

REPO_CLUSTER_YAML = Path(__file__).resolve().parents[1] / "cluster.yaml"
KINDS = ("local", "address", "slurm", "kubernetes")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


def with_kind(tmp_path: Path, kind: str) -> Path:
    raw = yaml.safe_load(REPO_CLUSTER_YAML.read_text())
    raw["kind"] = kind
    return write(tmp_path, yaml.safe_dump(raw))


def load_error(path: Path) -> str:
    with pytest.raises(InputError) as caught:
        load_cluster_config(path)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_no_file_means_the_local_default():
    cfg = load_cluster_config(None)
    assert cfg == ClusterConfig()
    assert cfg.kind == "local"
    assert cfg.local.pools is None and cfg.local.gpus == "auto"


def test_the_shipped_cluster_yaml_selects_local():
    assert load_cluster_config(REPO_CLUSTER_YAML).kind == "local"


@pytest.mark.parametrize("kind", KINDS)
def test_every_documented_kind_parses(tmp_path, kind):
    cfg = load_cluster_config(with_kind(tmp_path, kind))
    assert cfg.kind == kind
    assert getattr(cfg, kind) is not None


def test_the_documented_slurm_pools_keep_their_directives(tmp_path):
    slurm = load_cluster_config(with_kind(tmp_path, "slurm")).slurm
    assert slurm.gpu.job_extra_directives == ("--gres=gpu:1",)
    assert slurm.gpu.resources == {"GPU": 1} and slurm.cpu.resources == {"CPU": 1}


def test_an_empty_file_is_the_default(tmp_path):
    assert load_cluster_config(write(tmp_path, "# nothing\n")) == ClusterConfig()


def test_unknown_key_names_file_line_key_and_valid_keys(tmp_path):
    path = write(tmp_path, "kind: slurm\nslurm:\n  gpu: {cores: 1, memory: 1GB}\n"
                 "  cpu:\n    cores: 1\n    memory: 1GB\n    partition: debug\n")
    message = load_error(path)
    assert message.startswith(f"{path} line 7: slurm.cpu.partition: unknown key")
    assert "queue" in message and "job_extra_directives" in message


def test_unknown_key_inside_a_named_local_pool_lists_the_pool_keys(tmp_path):
    path = write(tmp_path, "local:\n  pools:\n    big: {workers: 1, resources: {GPU: 1},"
                 " thread: 2}\n")
    message = load_error(path)
    assert "local.pools.big.thread: unknown key" in message
    assert "threads" in message and "resources" in message


def test_wrong_type_names_key_and_value(tmp_path):
    message = load_error(write(tmp_path, "allowed_failures: lots\n"))
    assert "line 1: allowed_failures:" in message and "'lots'" in message


def test_a_bad_value_is_explained_by_the_fields_documented_meaning(tmp_path):
    message = load_error(write(tmp_path, "local:\n  gpus: all\n"))
    assert message.startswith(f"{tmp_path / 'cluster.yaml'} line 2: local.gpus: ")
    assert "(got 'all')" in message and "a list of indices" in message
    assert "literal" not in message  # pydantic's union-member tags stay out of the key


def test_negative_count_is_refused(tmp_path):
    message = load_error(write(tmp_path, "local:\n  threads: 0\n"))
    assert "line 2: local.threads:" in message and "greater than or equal to 1" in message


def test_unknown_kind_lists_the_kinds(tmp_path):
    message = load_error(write(tmp_path, "kind: yarn\n"))
    assert "kind:" in message and "'slurm'" in message and "'yarn'" in message


def test_selected_kind_needs_its_block(tmp_path):
    message = load_error(write(tmp_path, "kind: slurm\n"))
    assert message.endswith("kind is 'slurm' but there is no slurm: block; add one or change kind")


def test_missing_required_key_is_named(tmp_path):
    message = load_error(write(tmp_path, "kind: slurm\nslurm:\n  gpu: {cores: 1}\n"
                               "  cpu: {cores: 1, memory: 1GB}\n"))
    assert "line 3: slurm.gpu.memory: required key is missing" in message


def test_address_needs_exactly_one_target(tmp_path):
    both = "kind: address\naddress: {scheduler: 'tcp://h:1', scheduler_file: s.json}\n"
    assert "exactly one of scheduler or scheduler_file" in load_error(write(tmp_path, both))


def test_pools_without_a_gpu_carrier_are_refused(tmp_path):
    path = write(tmp_path, "local:\n  pools:\n    cpu: {workers: 2, resources: {CPU: 1}}\n")
    message = load_error(path)
    assert "no worker carries the GPU resource" in message and "local" in message


def test_configs_built_in_code_are_checked_the_same_way():
    with pytest.raises(ValueError, match="no worker carries the CPU resource"):
        ClusterConfig.model_validate(
            {"local": {"pools": {"g": {"workers": 1, "resources": {"GPU": 1}}}}}
        )


def test_a_pool_with_no_jobs_does_not_count(tmp_path):
    path = write(tmp_path, "kind: slurm\nslurm:\n  gpu: {jobs: 0, cores: 1, memory: 1GB}\n"
                 "  cpu: {cores: 1, memory: 1GB}\n")
    assert "no worker carries the GPU resource" in load_error(path)


def test_malformed_yaml_names_the_line(tmp_path):
    message = load_error(write(tmp_path, "kind: local\nlocal: {threads: 1\n"))
    assert f"{tmp_path / 'cluster.yaml'} line" in message and "not valid YAML" in message


def test_top_level_must_be_a_mapping(tmp_path):
    assert "expected a mapping" in load_error(write(tmp_path, "- local\n"))


def test_missing_file_is_an_input_error(tmp_path):
    assert "does not exist" in load_error(tmp_path / "nope.yaml")


def test_configs_are_frozen():
    cfg = ClusterConfig()
    with pytest.raises(ValueError):
        cfg.kind = "slurm"


# Machine-sized local default


def test_no_gpu_gives_one_worker_per_core_carrying_both_labels():
    pools = local_pools(ClusterConfig().local, cpu_count=2, devices=())
    assert list(pools) == ["cpu"]
    assert pools["cpu"].workers == 2 and pools["cpu"].threads == 1
    assert pools["cpu"].resources == {"GPU": 1.0, "CPU": 1.0}


def test_threads_per_worker_divide_the_cores():
    local = ClusterConfig.model_validate({"local": {"threads": 2}}).local
    pools = local_pools(local, cpu_count=8, devices=())
    assert pools["cpu"].workers == 4 and pools["cpu"].resources == {"GPU": 1.0, "CPU": 2.0}


def test_cuda_devices_get_one_pinned_gpu_worker_each_and_cpu_workers_the_rest():
    pools = local_pools(ClusterConfig().local, cpu_count=8, devices=(0, 1))
    assert pools["gpu0"].env == {"CUDA_VISIBLE_DEVICES": "0"}
    assert pools["gpu1"].env == {"CUDA_VISIBLE_DEVICES": "1"}
    assert pools["gpu0"].resources == {"GPU": 1.0} and "CPU" not in pools["gpu1"].resources
    assert pools["gpu0"].threads == 2  # gpu_threads: its extraction pipeline's cores
    assert pools["cpu"].workers == 4 and pools["cpu"].resources == {"CPU": 1.0}
    assert pools["cpu"].env == {"CUDA_VISIBLE_DEVICES": ""}


@pytest.mark.parametrize(("cores", "gpu_threads", "threads", "cpu_workers"),
                         [(2, 2, 1, 1), (16, 2, 2, 14), (16, 4, 4, 12), (16, 12, 8, 8)])
def test_a_gpu_workers_threads_stay_within_half_the_cores(cores, gpu_threads, threads,
                                                           cpu_workers):
    local = ClusterConfig.model_validate({"local": {"gpu_threads": gpu_threads}}).local
    pools = local_pools(local, cpu_count=cores, devices=(0,))
    assert (pools["gpu0"].threads, pools["cpu"].workers) == (threads, cpu_workers)


def test_explicit_pools_replace_the_default():
    local = ClusterConfig.model_validate(
        {"local": {"pools": {"g": {"workers": 1, "resources": {"GPU": 1}},
                             "c": {"workers": 3, "resources": {"CPU": 1}}}}}
    ).local
    assert {n: p.workers for n, p in local_pools(local, 64, (0,)).items()} == {"g": 1, "c": 3}


def test_worker_specs_are_named_by_pool_and_split_the_memory():
    pools = local_pools(ClusterConfig().local, cpu_count=2, devices=(0,))
    specs = worker_specs(pools, "auto")
    assert sorted(specs) == ["cpu-0", "gpu0-0"]
    gpu = specs["gpu0-0"]["options"]
    assert gpu["resources"] == {"GPU": 1.0} and gpu["nthreads"] == 1
    assert gpu["env"]["CUDA_VISIBLE_DEVICES"] == "0" and gpu["env"]["OMP_NUM_THREADS"] == "1"
    assert gpu["env"]["NUMBA_NUM_THREADS"] == "1"  # numba's default is every core
    assert int(gpu["memory_limit"]) > 0
    assert worker_specs(pools, "3GB")["cpu-0"]["options"]["memory_limit"] == "3GB"


# Dry runs: what would be submitted


def slurm_cfg(**pool_overrides) -> ClusterConfig:
    gpu = {"jobs": 1, "cores": 4, "memory": "8GB", "queue": "gpu", "account": "proj",
           "job_extra_directives": ["--gres=gpu:1"], "job_script_prologue": ["module load cuda"]}
    gpu.update(pool_overrides)
    return ClusterConfig.model_validate({
        "kind": "slurm",
        "slurm": {"gpu": gpu, "cpu": {"jobs": 3, "cores": 2, "memory": "4GB"},
                  "local_directory": "/scratch/dask"},
    })


def test_slurm_job_scripts_carry_each_pools_directives_and_resources():
    scripts = job_scripts(slurm_cfg().slurm)
    gpu, cpu = scripts["gpu"], scripts["cpu"]
    for line in ("#SBATCH -p gpu", "#SBATCH -A proj", "#SBATCH --cpus-per-task=4",
                 "#SBATCH --gres=gpu:1", "module load cuda", "--resources GPU=1",
                 "--nthreads 4", "--local-directory /scratch/dask", "-J sweep-gpu",
                 "export NUMBA_NUM_THREADS=4", "export OMP_NUM_THREADS=4"):
        assert line in gpu
    assert gpu.index("export NUMBA_NUM_THREADS=4") < gpu.index("module load cuda")
    assert "export NUMBA_NUM_THREADS=1" in cpu and "export OMP_NUM_THREADS=1" in cpu
    assert "--resources CPU=1" in cpu and "--cpus-per-task=2" in cpu
    assert "--nworkers 2 " in cpu and "--nthreads 1 " in cpu  # a process per core
    assert "--nworkers" not in gpu  # one worker of 4 threads per GPU job
    assert "--gres" not in cpu and "GPU=" not in cpu and "-J sweep-cpu" in cpu
    assert f"{sys.executable} -m distributed.cli.dask_worker" in gpu


def test_slurm_pool_resources_can_be_overridden():
    scripts = job_scripts(slurm_cfg(resources={"GPU": 2, "CPU": 1}).slurm)
    assert "--resources GPU=2,CPU=1" in scripts["gpu"]


@pytest.mark.parametrize("kind", KINDS)
def test_describe_cluster_shows_what_would_start(tmp_path, kind):
    text = describe_cluster(load_cluster_config(with_kind(tmp_path, kind)))
    assert text.startswith(f"cluster kind: {kind}\n")
    expected = {
        "local": "resources {'GPU': 1.0",
        "address": "scheduler: tcp://127.0.0.1:8786",
        "slurm": "#SBATCH --gres=gpu:1",
        "kubernetes": "kind: DaskWorkerGroup",
    }[kind]
    assert expected in text


def test_the_machine_sized_default_without_gpus_runs_a_single_threaded_process_per_core():
    local = ClusterConfig().local
    pools = local_pools(local, cpu_count=2, devices=())
    assert use_processes(local, pools) is True
    specs = worker_specs(pools, "auto", processes=True)
    assert sorted(specs) == ["cpu-0", "cpu-1"]
    assert all(spec["cls"] is Nanny for spec in specs.values())
    assert specs["cpu-0"]["options"]["resources"] == {"GPU": 1.0, "CPU": 1.0}
    assert specs["cpu-0"]["options"]["nthreads"] == 1
    assert specs["cpu-0"]["options"]["env"]["NUMBA_NUM_THREADS"] == "1"


def test_one_worker_alone_runs_as_a_thread_of_the_sweep():
    local = ClusterConfig().local
    one_core = local_pools(local, cpu_count=1, devices=())
    assert use_processes(local, one_core) is False
    assert all(s["cls"] is Worker for s in worker_specs(one_core, "auto", False).values())
    wide = ClusterConfig.model_validate({"local": {"threads": 2}}).local
    assert use_processes(wide, local_pools(wide, cpu_count=2, devices=())) is False


def test_gpu_pools_and_explicit_pools_run_as_processes_unless_told():
    local = ClusterConfig().local
    assert use_processes(local, local_pools(local, cpu_count=8, devices=(0,))) is True
    explicit = ClusterConfig.model_validate(
        {"local": {"pools": {"c": {"workers": 2, "resources": {"GPU": 1, "CPU": 1}}}}}
    ).local
    assert use_processes(explicit, local_pools(explicit, 8, ())) is True
    forced = ClusterConfig.model_validate({"local": {"processes": True}}).local
    assert use_processes(forced, local_pools(forced, 2, ())) is True
    threads = explicit.model_copy(update={"processes": False})
    assert use_processes(threads, local_pools(threads, 8, ())) is False


def test_threads_cannot_pin_cuda_devices():
    local = ClusterConfig.model_validate({"local": {"processes": False}}).local
    with pytest.raises(InputError, match="processes: false"):
        use_processes(local, local_pools(local, cpu_count=8, devices=(0,)))


@pytest.mark.parametrize("kind, lines", [
    ("slurm", ["pool gpu: 2 job(s) x 1 worker process(es) x 8 thread(s) = 16 worker thread(s)",
               "pool cpu: 4 job(s) x 16 worker process(es) x 1 thread(s) = 64 worker thread(s), "
               "resources {'CPU': 1.0} per worker"]),
    ("kubernetes", ["pool cpu: 16 pod(s) x 1 worker process(es) x 1 thread(s) = 16 worker "
                    "thread(s), resources {'CPU': 1.0} per worker"]),
    ("address", ["--nworkers C --nthreads 1"]),
])
def test_describe_cluster_shows_each_pools_worker_processes_and_threads(tmp_path, kind, lines):
    text = describe_cluster(load_cluster_config(with_kind(tmp_path, kind)))
    for line in lines:
        assert line in text


def test_a_job_of_several_workers_is_lost_when_none_is_seen_at_two_checks_in_a_row():
    groups = {"cpu-0": ["-0", "-1"], "cpu-1": ["-0", "-1"]}
    misses: dict[str, int] = {}
    assert lost_jobs(groups, set(), misses) == []  # pending jobs: never connected, never lost
    assert lost_jobs(groups, {"cpu-0-0", "cpu-1-1"}, misses) == []
    assert lost_jobs(groups, {"cpu-0-1"}, misses) == []  # cpu-0 keeps one: not lost; cpu-1 none
    assert lost_jobs(groups, {"cpu-0-1"}, misses) == ["cpu-1"]
    assert lost_jobs(groups, set(), misses) == []  # cpu-0 gone at one check only
    assert lost_jobs(groups, {"cpu-1-0"}, misses) == ["cpu-0"]  # cpu-1 resubmitted, back
    assert lost_jobs(groups, set(), misses) == []
