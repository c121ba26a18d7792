#!/usr/bin/env bash
# The wheels a GPU machine's stock image (torch, Triton, transformers, typer, rich) lacks for the
# `vgame` CLI, at the versions of requirements.lock, for a machine that cannot reach a package index:
#
#   bash scripts/gpu_wheels.sh [DIR] [PYTHON_VERSION]      # defaults: .whl, 3.12
#
# Run it where pip can reach an index; take DIR to the GPU machine beside the checkout, and
# scripts/gpu_measure.sh installs it into a directory of its own before its first stage (WHEELS=DIR;
# by default it looks in .whl). `game.chain.types` needs eth-utils, which the CLI loads to register
# its commands, so without these every stage stops at its first import; PEFT (with accelerate and
# psutil) for the `hf` stage's LoRA fine-tune.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.whl}
pyver=${2:-3.12}
names=(eth-utils eth-hash eth-typing cytoolz pydantic pydantic_core annotated-types typing-inspection pycryptodome peft accelerate psutil)
pins=()
for name in "${names[@]}"; do
    pin=$(grep -i "^${name}==" requirements.lock) || { echo "requirements.lock pins no $name" >&2; exit 1; }
    pins+=("$pin")
done
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
    "${platforms[@]}" -d "$dir" "${pins[@]}"
ls "$dir"
