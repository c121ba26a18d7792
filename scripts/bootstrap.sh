#!/usr/bin/env bash
# Set up everything from nothing, idempotently: Python venv with pinned packages, the npm
# toolchain for contracts (solc, anvil). Safe to run again; does only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
    echo "==> creating .venv with $("$PY" --version)"
    "$PY" -m venv .venv
fi
stamp=.venv/.vgame-installed
want=$(cat requirements.lock pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "==> installing torch==2.13.0 (CPU wheel) and pinned requirements"
    .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
    .venv/bin/python -m pip install -q torch==2.13.0
    .venv/bin/python -m pip install -q -r requirements.lock
    .venv/bin/python -m pip install -q --no-deps -e .
    echo "$want" > "$stamp"
fi

if [ ! -d contracts/node_modules/solc ] || [ contracts/package-lock.json -nt contracts/node_modules/.package-lock.json ]; then
    echo "==> installing contract toolchain (npm ci in contracts/: solc, anvil)"
    (cd contracts && npm ci --no-audit --no-fund --loglevel=error)
fi
