#!/usr/bin/env bash
# Regenerate constraints.txt: every package `pip install -e ".[test,demo]"` brings in, pinned by
# `uv pip compile` to the version installed in VENV (the venv that CI and the README's numbers
# were run with). Usage: bash .ci/constraints.sh [VENV] (default .venv); needs `uv` on PATH
# (e.g. `python3.11 -m venv /tmp/uv && /tmp/uv/bin/pip install uv && PATH=/tmp/uv/bin:$PATH`).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv}
freeze=$(mktemp -d)/installed.txt
"$venv/bin/python" -m pip freeze --exclude-editable > "$freeze"
# The local indexes pip is configured with (pip config list), if this machine has them.
indexes=()
for index in $("$venv/bin/python" -m pip config get global.extra-index-url 2>/dev/null); do
  indexes+=(--extra-index-url "$index")
done
for links in $("$venv/bin/python" -m pip config get global.find-links 2>/dev/null); do
  indexes+=(--find-links "$links")
done
uv pip compile pyproject.toml --extra test --extra demo --python-version 3.11 \
  --python-platform x86_64-manylinux_2_34 --index-strategy unsafe-best-match \
  "${indexes[@]}" -c "$freeze" --annotation-style line --no-emit-index-url --no-emit-find-links \
  --custom-compile-command "bash .ci/constraints.sh" -o constraints.txt
sed -i "s|-c $freeze|the venv|g" constraints.txt
