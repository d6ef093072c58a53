#!/usr/bin/env bash
# The worker image built and run, with no registry: a Debian base made here (mmdebstrap), the
# repository's Dockerfile built on it (podman), a Dask scheduler here and two workers in
# containers, one carrying CPU=1 and one GPU=1 (`kind: address`). A small sweep runs three
# times: (a) locally on the default LocalCluster, (b) through the containers into a folder
# mounted into them at the same path, (c) through the containers (the image's own user, no
# volume, credentials in the environment) into s3:// on the SeaweedFS of .ci/s3-up.sh. Every
# array of (b) and of (c) must equal (a)'s, value for value; exit 1 otherwise.
#
#   bash .ci/image-check.sh            # as root; 18-31 min here (docs/storage.md)
#   PYTHON=/path/to/venv/bin/python bash .ci/image-check.sh
#   bash .ci/image-check.sh --no-build # the check again with the image already built
#   bash .ci/image-check.sh --prune    # then remove the image, the base and podman's caches
#
# Run by hand, not by .ci/run: the build downloads 3.3 GB (PyPI's torch is a CUDA build)
# and takes minutes that CI's time does not have. The driver is PYTHON (default .venv, as
# .ci/run makes it) with this checkout on PYTHONPATH: the image holds the same checkout and
# the same pins (constraints.txt), so Dask finds the same package versions on both sides
# (Python's patch version aside: Debian's 3.11.2 in the image, a warning and no more).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
prune=false build=true
for arg in "$@"; do
    case $arg in
        --prune) prune=true ;;
        --no-build) build=false ;;
        *) echo "image-check: unknown argument $arg (--no-build, --prune)" >&2; exit 2 ;;
    esac
done

work=${IMAGE_CHECK_DIR:-/tmp/dobrushin-image-check}
image=${IMAGE_CHECK_IMAGE:-localhost/dobrushin-sweep:dev}
base=localhost/debian-py:bookworm
port=${IMAGE_CHECK_PORT:-8797}       # the scheduler, on 127.0.0.1
python=${PYTHON:-$repo/.venv/bin/python}
s3_port=${DOBRUSHIN_S3_PORT:-8333}
endpoint=http://127.0.0.1:$s3_port
export AWS_ACCESS_KEY_ID=${DOBRUSHIN_S3_KEY:-sweep-test}
export AWS_SECRET_ACCESS_KEY=${DOBRUSHIN_S3_SECRET:-sweep-test-secret}
export AWS_REGION=us-east-1 PYTHONPATH=$repo HF_HUB_OFFLINE=1

log() { echo "image-check: $*" >&2; }
now() { date +%s; }
declare -A took=()
if [[ $(id -u) -ne 0 ]]; then log "must run as root (it installs packages and runs podman)"; exit 3; fi
if [[ ! -x $python ]]; then
    log "no driver python at $python: make the venv as the README says, or set PYTHON"; exit 3
fi

# 1. Debian's container tools. crun (podman's default) refuses this kernel's hybrid cgroups and
#    the default ulimits: runc, cgroupfs, no default ulimits (shared/CONTAINERS.md).
if ! command -v podman >/dev/null || ! command -v runc >/dev/null \
    || ! command -v mmdebstrap >/dev/null; then
    log "installing podman runc mmdebstrap uidmap fuse-overlayfs"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq podman runc mmdebstrap uidmap fuse-overlayfs >/dev/null
fi
mkdir -p "$work"
printf '[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "cgroupfs"\nruntime = "runc"\n' \
    > "$work/containers.conf"
export CONTAINERS_CONF=$work/containers.conf

# 2. The base: Debian bookworm's minbase with Python 3.11, from Debian's packages.
if ! podman image exists "$base"; then
    t=$(now)
    log "making $base with mmdebstrap"
    mmdebstrap --quiet --variant=minbase --include=python3,python3-venv bookworm "$work/rootfs.tar"
    podman import -q "$work/rootfs.tar" "$base" >/dev/null
    rm -f "$work/rootfs.tar"
    took[base]=$(( $(now) - t ))
fi

# 3. The image, from this checkout. PyTorch's own index is out of reach here: PyPI's torch (the
#    CUDA build, as in the driver's venv). The host's certificate authorities let pip through
#    the registry proxy; they are mounted for the build only.
t=$(now)
if $build || ! podman image exists "$image"; then
    log "building $image (build log: $work/build.log)"
    if ! podman build --network host -v /etc/ssl/certs:/etc/ssl/certs:ro \
            --build-arg BASE="$base" --build-arg TORCH_INDEX=https://pypi.org/simple \
            -t "$image" . > "$work/build.log" 2>&1; then
        tail -30 "$work/build.log" >&2
        log "the build failed (above)"; exit 1
    fi
    took[build]=$(( $(now) - t ))
fi
size=$(podman image inspect --format '{{.Size}}' "$image")

# 4. Services: SeaweedFS (idempotent) and a bucket of our own; the scheduler here.
bash .ci/s3-up.sh >&2
bucket=dobrushin-image-check-$(date +%s)
s3fs_do() {  # s3fs_do mkdir|rm BUCKET
    "$python" -c "import s3fs, sys; fs = s3fs.S3FileSystem(client_kwargs={'endpoint_url': \
'$endpoint'}, skip_instance_cache=True); fs.mkdir(sys.argv[2]) if sys.argv[1] == 'mkdir' \
else fs.rm(sys.argv[2], recursive=True)" "$@"
}
scheduler_pid=
cleanup() {
    podman rm -f -t 5 dobrushin-image-check-cpu dobrushin-image-check-gpu >/dev/null 2>&1 || true
    [[ -n $scheduler_pid ]] && kill "$scheduler_pid" 2>/dev/null || true
    s3fs_do rm "$bucket" >/dev/null 2>&1 || true
}
trap cleanup EXIT
s3fs_do mkdir "$bucket"

rm -rf "$work/local" "$work/folder" "$work/s3"
mkdir -p "$work/local" "$work/folder" "$work/s3"
config() {  # config STORE OPTIONS: the config of tests/test_s3_store.py (three tiny models)
    cat <<YAML
store: $1
storage_options: $2
shard_size: 2
datasets:
  photos: {source: 'sklearn:sample_images', limit: 6}
  wine: {source: 'sklearn:wine', limit: 6}
  topics: {source: 'pydoc:topics', limit: 4}
models:
  vit: {source: tiny-deit-distilled, dataset: photos}
  ft: {source: ft-transformer, dataset: wine, options: {max_epochs: 2, n_blocks: 2}}
  rob: {source: tiny-roberta, dataset: topics, batch_size: 2, control: random-init}
baseline: {sizes: [2, 5], trials: 2000, seed: 3, chunk_trials: 1000, nulls: [uniform]}
matched_nulls: {trials: 1000, chunk_trials: 1000, nulls: [uniform, softmax-b1]}
YAML
}
config sweep.zarr '{}' > "$work/local/sweep.yaml"
config sweep.zarr '{}' > "$work/folder/sweep.yaml"
config "s3://$bucket/sweep.zarr" "{endpoint_url: '$endpoint'}" > "$work/s3/sweep.yaml"
printf 'kind: address\naddress: {scheduler: "tcp://127.0.0.1:%s"}\n' "$port" > "$work/cluster.yaml"

"$python" -m distributed.cli.dask_scheduler --host 127.0.0.1 --port "$port" \
    --dashboard-address 127.0.0.1:0 > "$work/scheduler.log" 2>&1 &
scheduler_pid=$!

# workers ARGS...: one CPU=1 and one GPU=1 worker container, the ARGS given to `podman run`;
# returns once the scheduler has both.
workers() {
    podman rm -f -t 5 dobrushin-image-check-cpu dobrushin-image-check-gpu >/dev/null 2>&1 || true
    for pool in cpu:CPU gpu:GPU; do
        podman run -d --name "dobrushin-image-check-${pool%:*}" --network host \
            -e AWS_ACCESS_KEY_ID -e AWS_SECRET_ACCESS_KEY -e AWS_REGION "$@" "$image" \
            dask worker "tcp://127.0.0.1:$port" --name "${pool%:*}" --nthreads 1 \
            --resources "${pool#*:}=1" --host 127.0.0.1 --no-dashboard >/dev/null
    done
    "$python" -c "from distributed import Client; \
Client('tcp://127.0.0.1:$port', timeout=60).wait_for_workers(2, timeout=120)"
}
# tasks: what each container worker ran (both must have run tasks); keeps their logs.
tasks() {
    for name in cpu gpu; do podman logs "dobrushin-image-check-$name" > "$work/$1-$name.log" 2>&1; done
    "$python" -c "
from distributed import Client
with Client('tcp://127.0.0.1:$port', timeout=60) as c:
    ran = c.run(lambda dask_worker: (dask_worker.name, dask_worker.state.executed_count))
print('image-check: tasks run per worker:', dict(ran.values()))
assert len(ran) == 2 and all(n > 0 for _, n in ran.values()), ran"
}
run_sweep() {  # run_sweep NAME ARGS...: time `sweep run`, its output in $work/NAME.log
    local t; t=$(now)
    if ! "$python" -m sweep run "${@:2}" --no-progress > "$work/$1.log" 2>&1; then
        tail -30 "$work/$1.log" >&2; log "sweep $1 failed (above)"; exit 1
    fi
    took[$1]=$(( $(now) - t ))
}

# 5. (a) locally, the default LocalCluster.
log "(a) a local run"
run_sweep local "$work/local/sweep.yaml"

# 6. (b) the containers, the store a folder mounted at the same path, the workers as this user
#    (they write into the folder the driver made).
log "(b) through the image's workers into $work/folder/sweep.zarr"
workers --user "$(id -u):$(id -g)" -v "$work/folder:$work/folder"
run_sweep folder "$work/folder/sweep.yaml" --cluster "$work/cluster.yaml"
tasks folder
"$python" .ci/stores_equal.py "$work/local/sweep.zarr" "$work/folder/sweep.zarr"

# 7. (c) fresh containers as the image's user, no volume (as pods), the store on SeaweedFS.
log "(c) through the image's workers into s3://$bucket/sweep.zarr"
workers
run_sweep s3 "$work/s3/sweep.yaml" --cluster "$work/cluster.yaml"
tasks s3
"$python" .ci/stores_equal.py --endpoint-url "$endpoint" "$work/local/sweep.zarr" \
    "s3://$bucket/sweep.zarr"

summary="image $image $(( size / 1000000 )) MB"
[[ -n ${took[build]:-} ]] && summary+=", build ${took[build]} s"
[[ -n ${took[base]:-} ]] && summary+=", base ${took[base]} s"
log "$summary; sweeps: local ${took[local]} s, folder ${took[folder]} s, s3 ${took[s3]} s"
if $prune; then
    cleanup
    podman rmi -f "$image" "$base" >/dev/null
    podman system prune -f >/dev/null
    log "pruned the image, the base and podman's build cache"
fi
log "ok: both stores made through the image equal the local run's"
