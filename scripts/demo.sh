#!/usr/bin/env bash
# The README's main job: train a small char-GPT on one hardware profile, then audit it on another.
# Usage: make demo [DEMO_ARGS="--preset cnn-digits --steps 30"]
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=gpt-shakespeare
STEPS=20
while [ $# -gt 0 ]; do
    case "$1" in
        --preset) PRESET=$2; shift 2 ;;
        --steps) STEPS=$2; shift 2 ;;
        *) echo "unknown option $1 (use --preset P, --steps N)" >&2; exit 2 ;;
    esac
done
V=.venv/bin/vgame
OUT=runs/demo-$PRESET
rm -rf "$OUT"
echo "==> trainer: $PRESET for $STEPS steps on profile cpu-1t"
$V train --preset "$PRESET" --steps "$STEPS" --profile cpu-1t --out "$OUT"
echo "==> auditor: replay on profile noisy (perturbed float64 results) WITH the trainer's rounding log"
$V audit --transcript "$OUT" --profile noisy
echo "==> auditor: the same replay WITHOUT the log (expected to diverge)"
$V audit --transcript "$OUT" --profile noisy --no-log || true
echo "==> judge's primitive: re-run step $STEPS alone from the checkpoint before it, on profile splitk-16"
$V replay-step --transcript "$OUT" --step "$STEPS" --profile splitk-16
