#!/usr/bin/env bash
# Set up everything from nothing, idempotently: Python venv with pinned packages, Slither's venv, the
# npm toolchain for contracts (solc, anvil). Safe to run again; does only what is missing.
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
    pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
    "${pip[@]}" torch==2.13.0 2> >(grep -v "^WARNING: Location" >&2)
    "${pip[@]}" -r requirements.lock 2> >(grep -v "^WARNING: Location" >&2)
    "${pip[@]}" --no-deps -e . 2> >(grep -v "^WARNING: Location" >&2)
    # The C++ dispatch front (game/training/native/front.cpp) takes about a minute to compile: build
    # it now, not in the first training step. Without a C++ toolchain the Python mode runs instead.
    echo "==> building the C++ dispatch front"
    .venv/bin/python -m game.training.native.front
    echo "$want" > "$stamp"
fi

# Slither (`make slither`) in a venv of its own: every slither-analyzer 0.11.x needs web3<8, the
# project pins web3 8 (requirements-slither.lock says more).
if [ ! -x .venv-slither/bin/python ]; then
    echo "==> creating .venv-slither with $("$PY" --version)"
    "$PY" -m venv .venv-slither
fi
sstamp=.venv-slither/.vgame-installed
swant=$(sha256sum < requirements-slither.lock | cut -d' ' -f1)
if [ ! -f "$sstamp" ] || [ "$(cat "$sstamp")" != "$swant" ]; then
    echo "==> installing Slither and its pinned requirements into .venv-slither"
    .venv-slither/bin/python -m pip install -q --disable-pip-version-check -r requirements-slither.lock \
        2> >(grep -v "^WARNING: Location" >&2)
    echo "$swant" > "$sstamp"
fi

if [ ! -d contracts/node_modules/solc ] || [ contracts/package-lock.json -nt contracts/node_modules/.package-lock.json ]; then
    # `npm ci`: exactly the lock's versions and hashes, and it never rewrites the lock. The lock
    # records anvil's optional binary for every platform, so the same file installs on each.
    node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
    if [ "$node_major" -lt 20 ]; then
        echo "error: the contract toolchain needs Node.js 20 or later (anvil's npm package asks for" \
            "it); found $(node --version 2>/dev/null || echo 'no node')" >&2
        exit 1
    fi
    echo "==> installing contract toolchain in contracts/ (solc, anvil) from package-lock.json"
    (cd contracts && npm ci --no-audit --no-fund --loglevel=error)
fi
