# The image of a sweep's Dask workers (and scheduler) on Kubernetes or cloud VMs: this package
# with its object-store extras, on a CPU base by default or a CUDA base by build argument.
# A worker needs no shared folder: the store is an object store URL (docs/storage.md).
#
#   docker build -t REGISTRY/dobrushin-sweep:0.1.0 .
#   docker build -t REGISTRY/dobrushin-sweep:0.1.0-cuda \
#       --build-arg BASE=nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04 \
#       --build-arg TORCH_INDEX=https://pypi.org/simple .
#   docker push REGISTRY/dobrushin-sweep:0.1.0
#
# With no registry, on a Debian base made by mmdebstrap (what .ci/image-check.sh builds and checks:
# its workers store what a local run stores; docs/storage.md):
#
#   podman build --network host -v /etc/ssl/certs:/etc/ssl/certs:ro \
#       --build-arg BASE=localhost/debian-py:bookworm \
#       --build-arg TORCH_INDEX=https://pypi.org/simple -t localhost/dobrushin-sweep:dev .
#
# PyPI's torch is the CUDA build: that image is 7.3 GB (torch and its nvidia-* wheels 5.8 GB,
# 3.3 GB downloaded), built in 14-16 min on the project's loaded 2-core machine, and in 8 min
# after a change of the code (torch's layer below is reused).
#
# The driver's torch, dask and distributed versions must match the image's (the pins of
# constraints.txt; Dask warns on a mismatch, Python's patch version included): build the image
# from the same checkout you run `sweep run` from, for a driver of the same Python minor version.
ARG BASE=python:3.11-slim
FROM ${BASE}

# PyTorch's CPU-only wheels by default; a CUDA build takes the PyPI wheels (CUDA included).
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    DOBRUSHIN_CACHE=/tmp/dobrushin-cache \
    PATH=/opt/venv/bin:$PATH

# CUDA bases come without Python: install it (the python:3.11 base already has it).
RUN if ! command -v python3 >/dev/null; then \
        apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && python3 -m venv /opt/venv

WORKDIR /opt/dobrushin-sweep
# torch in a layer of its own, before the code: a rebuild after a change of the code reuses it.
COPY constraints.txt ./
RUN pip install -c constraints.txt --index-url "$TORCH_INDEX" torch torchvision
COPY pyproject.toml README.md ./
COPY sweep ./sweep
COPY workers ./workers
COPY storage ./storage
RUN pip install -c constraints.txt ".[s3,gcs,azure,kubernetes]"

# Workers write nothing but their scratch (numba's cache, Dask's spill) under /tmp.
RUN useradd --create-home --uid 1000 sweep
USER sweep
WORKDIR /home/sweep
