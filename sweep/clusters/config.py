"""The cluster file (`cluster.yaml`): frozen pydantic specs, parsed once, errors naming the key.

One file documents every kind; `kind:` selects the block that runs. Workers carry Dask
resources: `GPU` (extraction tasks take one) and `CPU` (test and baseline tasks take one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from dask.utils import parse_bytes
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from storage.errors import InputError
from storage.location import check_no_userinfo, has_credentials
from sweep.config.yaml_io import load_yaml, read_text

Kind = Literal["local", "address", "slurm", "kubernetes"]
Gpus = Literal["auto"] | tuple[int, ...]
TASK_RESOURCES = ("GPU", "CPU")

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")
"""Set to a worker's thread count in its environment: torch, BLAS and numba (whose default is
every core of the machine, not of the job) then keep to the cores the worker was given."""


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LocalPool(_Spec):
    """A group of identical local worker processes."""

    workers: int = Field(ge=0)
    threads: int = Field(1, ge=1)
    resources: dict[str, float]
    env: dict[str, str] = Field(default_factory=dict)


class LocalConfig(_Spec):
    """A `distributed` cluster on this machine, sized to it unless `pools` says otherwise."""

    threads: int = Field(1, ge=1, description="threads per machine-sized worker")
    gpu_threads: int = Field(
        2, ge=1, description="threads of each GPU worker of the machine-sized default (its "
        "extraction reads, decodes and writes on them beside the device), at most half the "
        "cores per GPU; the CPU workers take the other cores")
    memory_limit: str = Field("auto", description="per worker, e.g. '4GB'; auto shares the RAM")

    @field_validator("memory_limit")
    @classmethod
    def _bytes(cls, value: str) -> str:
        """'auto' or a size dask can parse ('4GB', '512 MiB', a byte count), above zero."""
        if value == "auto":
            return value
        try:
            size = parse_bytes(value)
        except (ValueError, TypeError):
            raise ValueError(f"not a size: use auto or a size such as 4GB ({value!r})") from None
        if size <= 0:
            raise ValueError(f"must be above zero: use auto or a size such as 4GB ({value!r})")
        return value
    gpus: Gpus = Field(
        "auto", description="auto (every CUDA device torch sees) or a list of indices: [0, 1]"
    )
    pools: dict[str, LocalPool] | None = Field(
        None, description="explicit pools replacing the machine-sized default"
    )
    host: str = Field(
        "127.0.0.1", min_length=1,
        description="the address every listener binds (scheduler, workers, nannies, "
        "dashboards); another than loopback lets the network run code in the sweep: secure "
        "it with TLS (docs/faults.md, 'Who can reach the local cluster')",
    )
    processes: Literal["auto"] | bool = Field(
        "auto",
        description="workers as processes (true) or as threads of the sweep's own process "
        "(false); auto: processes, or threads where there is one worker only (a process's "
        "test tasks take turns at its locks)",
    )


class AddressConfig(_Spec):
    """An existing scheduler, by address or scheduler file (exactly one)."""

    scheduler: str | None = None
    scheduler_file: str | None = None
    timeout: str = Field("30s", description="how long to try reaching the scheduler")

    @model_validator(mode="after")
    def _exactly_one(self) -> AddressConfig:
        if (self.scheduler is None) == (self.scheduler_file is None):
            raise ValueError("give exactly one of scheduler or scheduler_file")
        return self

    @field_validator("scheduler")
    @classmethod
    def _no_credentials(cls, scheduler: str | None) -> str | None:
        try:
            check_no_userinfo(scheduler or "", "the address",
                              "secure the scheduler with TLS (distributed's security settings)")
        except InputError as error:
            raise ValueError(str(error)) from None
        return scheduler


class SlurmPool(_Spec):
    """A pool of SLURM jobs. A GPU job runs one worker process of `cores` threads; a CPU job
    runs `cores` single-threaded worker processes (`worker_processes`). `resources` are each
    worker process's: by default GPU: 1, or CPU: 1."""

    jobs: int = Field(1, ge=0)
    cores: int = Field(ge=1)
    memory: str
    walltime: str | None = "01:00:00"
    queue: str | None = None
    account: str | None = None
    job_extra_directives: tuple[str, ...] = ()
    job_script_prologue: tuple[str, ...] = ()
    resources: dict[str, float] | None = None


class SlurmConfig(_Spec):
    """dask-jobqueue on SLURM: the scheduler runs here, each pool submits its own worker jobs."""

    scheduler_host: str | None = Field(None, description="bind the scheduler here, e.g. 127.0.0.1")
    interface: str | None = Field(None, description="network interface for scheduler and workers")
    python: str | None = Field(None, description="python on the nodes; default: this one")
    local_directory: str | None = None
    log_directory: str | None = None
    death_timeout: int = Field(60, ge=1)
    replace_lost_jobs: bool = True
    lost_job_timeout: str = "10s"
    gpu: SlurmPool
    cpu: SlurmPool


class KubernetesPool(_Spec):
    """One worker group of the dask-kubernetes operator: `workers` pods of one worker each."""

    workers: int = Field(ge=0)
    cpu: str = "1"
    memory: str = "4Gi"
    gpus: int = Field(0, ge=0)
    threads: int = Field(1, ge=1)
    node_selector: dict[str, str] = Field(default_factory=dict)
    resources: dict[str, float] | None = None


class KubernetesCpuPool(KubernetesPool):
    """The CPU worker group: single-threaded worker pods (the operator runs one worker per pod,
    and a process's test tasks take turns at its locks), so it scales by `workers`."""

    threads: Literal[1] = Field(
        1, description="1: one single-threaded worker per pod (a process's test tasks take "
        "turns at its locks); give each pod cpu: '1' and C cores as workers: C")


class KubernetesConfig(_Spec):
    """dask-kubernetes operator: a DaskCluster (GPU pool as its default group) plus a CPU group.
    `credentials_secret`: a Kubernetes Secret whose keys (AWS_ACCESS_KEY_ID, ...) every pod gets
    as environment variables (`envFrom`): how workers reach the store's bucket."""

    name: str = "dobrushin-sweep"
    namespace: str | None = None
    image: str = Field(min_length=1, description="the worker image you built from the "
                       "repository's Dockerfile and pushed (docs/storage.md)")
    credentials_secret: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    scheduler_service_type: str = "ClusterIP"
    gpu: KubernetesPool
    cpu: KubernetesCpuPool


class ClusterConfig(_Spec):
    """Where the sweep's tasks run: the selected `kind` and the settings of every kind."""

    kind: Kind = "local"
    allowed_failures: int = Field(3, ge=0, description="worker deaths a task may survive")
    dashboard_address: str = ":8787"
    local: LocalConfig = LocalConfig()
    address: AddressConfig | None = None
    slurm: SlurmConfig | None = None
    kubernetes: KubernetesConfig | None = None

    @model_validator(mode="after")
    def _selected_block_runs_every_task(self) -> ClusterConfig:
        block = getattr(self, self.kind)
        if block is None:
            raise ValueError(
                f"kind is {self.kind!r} but there is no {self.kind}: block; add one or change kind"
            )
        if self.kind == "slurm":
            pools = {n: (p.jobs, slurm_resources(n, p)) for n, p in _two(block)}
        elif self.kind == "kubernetes":
            pools = {n: (p.workers, kubernetes_resources(n, p)) for n, p in _two(block)}
        elif self.kind == "local" and block.pools is not None:
            pools = {n: (p.workers, p.resources) for n, p in block.pools.items()}
        else:
            return self
        check_pools_cover_tasks(pools, self.kind)
        return self


def worker_processes(pool_name: str, pool: SlurmPool) -> int:
    """Worker processes per SLURM job: one per core in the CPU pool (each test task then has a
    process to itself: a process's tasks take turns at its kernel and BLAS locks,
    `workers.exact.equality`), one in the GPU pool (one extraction at a time per GPU)."""
    return pool.cores if pool_name == "cpu" else 1


def slurm_resources(pool_name: str, pool: SlurmPool) -> dict[str, float]:
    """Resources each worker process of a SLURM pool carries: configured, else GPU: 1 or CPU: its
    threads (1 in the CPU pool)."""
    if pool.resources is not None:
        return dict(pool.resources)
    if pool_name == "gpu":
        return {"GPU": 1.0}
    return {"CPU": float(pool.cores // worker_processes(pool_name, pool))}


def kubernetes_resources(pool_name: str, pool: KubernetesPool) -> dict[str, float]:
    """Resources each Kubernetes pool worker carries: configured, else GPU: 1 or CPU: threads
    (1 in the CPU pool)."""
    if pool.resources is not None:
        return dict(pool.resources)
    return {"GPU": 1.0} if pool_name == "gpu" else {"CPU": float(pool.threads)}


def check_pools_cover_tasks(pools: dict[str, tuple[int, dict[str, float]]], where: str) -> None:
    """Raise ValueError unless some worker carries GPU and some carries CPU (else tasks hang)."""
    for tag in TASK_RESOURCES:
        if not any(count > 0 and res.get(tag, 0) > 0 for count, res in pools.values()):
            raise ValueError(
                f"{where}: no worker carries the {tag} resource, so tasks tagged {tag} would "
                f"never run; give a pool with workers > 0 the resource {{{tag}: 1}}"
            )


def load_cluster_config(path: str | Path | None) -> ClusterConfig:
    """Parse a cluster file (None: the embedded local default); bad input -> one-line InputError."""
    if path is None:
        return ClusterConfig()
    path = Path(path)
    if not path.is_file():
        raise InputError(f"cluster file {path} does not exist; pass an existing file or none")
    text = read_text(path)
    try:
        raw = load_yaml(text, str(path))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or type(error).__name__
        raise InputError(f"{path}{line}: not valid YAML: {problem}; fix the syntax") from None
    if raw is None:
        return ClusterConfig()
    if not isinstance(raw, dict):
        raise InputError(f"{path}: expected a mapping of settings (kind: local, ...) at the top")
    try:
        cfg = ClusterConfig.model_validate(raw)
    except ValidationError as error:
        raise InputError(_one_line(error, path, text)) from None
    return cfg


def _two(block: SlurmConfig | KubernetesConfig) -> list[tuple[str, Any]]:
    return [("gpu", block.gpu), ("cpu", block.cpu)]


def _one_line(error: ValidationError, path: Path, text: str) -> str:
    """The first validation error as: file line N: key.path: problem (got value); valid keys."""
    first = error.errors()[0]
    # drop union-member tags such as "literal['auto']" or "tuple[int, ...]" from the key path
    loc = tuple(p for p in first["loc"] if not (isinstance(p, str) and "[" in p))
    line = _line_of(text, loc)
    where = f"{path} line {line}" if line else str(path)
    message = first["msg"].removeprefix("Value error, ")
    if not loc:
        return f"{where}: {message}"
    key = ".".join(str(part) for part in loc)
    described = _description(loc)
    hint = f"; expected: {described}" if described else ""
    if first["type"] == "extra_forbidden":
        valid = _valid_keys(loc[:-1])
        hint = f"; valid keys here: {', '.join(valid)}" if valid else ""
        return f"{where}: {key}: unknown key{hint}"
    if first["type"] == "missing":
        return f"{where}: {key}: required key is missing; add it"
    got = first.get("input")
    secret = has_credentials(str(got)) or "env" in loc  # a credential is never echoed
    shown = "" if isinstance(got, dict | list) or got is None or secret \
        else f" (got {got!r})"
    return f"{where}: {key}: {message}{shown}{hint}"


def _line_of(text: str, loc: tuple[Any, ...]) -> int | None:
    """1-based line of the deepest key of `loc` present in the YAML text, or None."""
    node = yaml.compose(text)
    line = None
    for part in loc:
        if not isinstance(node, yaml.MappingNode):
            break
        match = next((v for k, v in node.value if k.value == str(part)), None)
        if match is None:
            break
        key_node = next(k for k, v in node.value if v is match)
        line, node = key_node.start_mark.line + 1, match
    return line


def _walk(loc: tuple[Any, ...]) -> tuple[type[_Spec] | None, Any]:
    """Follow `loc` from ClusterConfig: (the spec model reached, the last field's info)."""
    model: Any = ClusterConfig
    field = None
    parts = list(loc)
    while parts:
        if model is None:
            return None, None
        field = model.model_fields.get(str(parts.pop(0)))
        if field is None:
            return None, None
        model, keyed = _spec_class(field.annotation)
        if keyed and parts:
            parts.pop(0)  # the user's own name, e.g. a pool name under local.pools
    return model, field


def _valid_keys(loc: tuple[Any, ...]) -> list[str]:
    """Field names of the spec model found by following `loc` from ClusterConfig."""
    model, _ = _walk(loc)
    return sorted(model.model_fields) if model is not None else []


def _description(loc: tuple[Any, ...]) -> str | None:
    """The documented meaning of the field at `loc`, if it has one."""
    _, field = _walk(loc)
    return field.description if field is not None else None


def _spec_class(annotation: Any) -> tuple[type[_Spec] | None, bool]:
    """The spec model inside `X`, `X | None` or `dict[str, X]`, and whether it sat in a dict."""
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, _Spec):
            return candidate, False
        values = getattr(candidate, "__args__", ())
        if getattr(candidate, "__origin__", None) is dict and issubclass(values[1], _Spec):
            return values[1], True
    return None, False
