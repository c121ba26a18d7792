#!/usr/bin/env bash
# Every GPU measurement of issue 46 in one run, for the few minutes a GPU machine is lent:
#
#   bash scripts/gpu_measure.sh OUT_DIR [STAGE ...]
#
# Stages (default: all, in this order): env, tests, overhead, front, groups, audits, hf, leafcheck,
# profile, logs, graphs. All of them take longer than one 10-minute command of a lease: name the ones a
# lease has time for (`env` first: it builds the front). Each writes into OUT_DIR as it goes (JSON,
# one object a line in the .jsonl files), so a run cut short still leaves what it finished. Each
# stage has its own time limit; a failed stage is logged and the next runs.
# Runs from the repository root with the machine's python3 (torch with CUDA, Triton). What such an
# image lacks for the CLI (eth-utils and its kin) comes as wheels made by scripts/gpu_wheels.sh,
# installed into a directory of this run's own from WHEELS (default .whl), if it is there; nothing
# else is installed. The env stage builds the C++ dispatch front (half a minute; ninja and a compiler are
# there): every later stage runs through it, on the GPU as on CPU, unless it says VGAME_FRONT=0.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: gpu_measure.sh OUT_DIR [STAGE ...]}
shift
mkdir -p "$out"
all=(env tests overhead front groups audits hf leafcheck profile logs graphs)
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=("${all[@]}")
py=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
vgame=("$py" -m game.cli)
log=$out/run.log
GPT2=n_layer=12,n_head=12,n_embd=768,block_size=64
RESNET=arch=resnet50

wheels=${WHEELS:-.whl}
if compgen -G "$wheels/*.whl" >/dev/null; then
    site=$(mktemp -d)
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$wheels"/*.whl \
        && export PYTHONPATH=$site:$PYTHONPATH
fi
if ! "$py" -c 'import game.cli.node' 2>>"$log"; then
    echo "the CLI does not load here (see $log): make its wheels with scripts/gpu_wheels.sh" | tee -a "$log"
fi

note() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$log"; }
# run LIMIT_S CMD...: time-limited, output to the log; the exit code noted, never fatal
run() {
    local limit=$1
    shift
    note "$*"
    timeout "$limit" "$@" >>"$log" 2>&1
    local rc=$?
    [ $rc -ne 0 ] && note "exit $rc: $*"
    return 0
}
# json LIMIT_S FILE CMD...: a --json command's output appended to FILE as one line
json() {
    local limit=$1 file=$2
    shift 2
    note "$*"
    local tmp
    tmp=$(mktemp)
    timeout "$limit" "$@" >"$tmp" 2>>"$log"
    local rc=$?
    if [ $rc -eq 0 ]; then
        "$py" -c 'import json,sys; d=json.load(open(sys.argv[1])); d["argv"]=sys.argv[2:]; print(json.dumps(d))' \
            "$tmp" "$@" >>"$file"
    else
        note "exit $rc: $*"
        cat "$tmp" >>"$log"
    fi
    rm -f "$tmp"
}

# switched_off NAME=0 FILE: the gpt-shakespeare and GPT-2-shape overhead benches with one switch
# set, into FILE, to set beside the overhead stage's
switched_off() {
    local switch=$1 f=$2
    json 90 "$f" env "$switch" "${vgame[@]}" bench overhead --preset gpt-shakespeare --profile cuda \
        --steps 20 --repeats 2 --json
    json 150 "$f" env "$switch" "${vgame[@]}" bench overhead --preset gpt-shakespeare --profile cuda \
        --model "$GPT2" --batch-size 8 --steps 5 --repeats 3 --warmup 1 --block 5 --json
}

for stage in "${stages[@]}"; do
    case $stage in
    env)
        note "env"
        {
            nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
            "$py" -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, torch.version.cuda, triton.__version__, torch.cuda.get_device_name())'
            nproc
        } >"$out/env.txt" 2>&1
        run 150 "$py" -m game.training.native.front  # says where it is built, or that the mode will run
        ;;
    tests)
        # the kernels on the GPU itself (without one these tests run in Triton's interpreter); the
        # front's shared session and the group kernels first: new on a GPU. Each test's name and
        # outcome goes to the log as it ends (-v), so a run cut by the limit still says which failed
        run 240 "$py" -m pytest -v --tb=short -p no:cacheprovider -p no:xdist -o addopts="" \
            tests/training/test_front_shared.py tests/training/test_cuda_groups.py tests/training/test_cuda_kernels.py \
            tests/training/test_cuda_leaf.py tests/training/test_cuda_rng.py tests/training/test_cross_profile.py \
            -k "cuda or Cuda or kernel or Kernel or leaf or Leaf or rng or Rng or roup or hared"
        ;;
    leafcheck)
        run 120 "$py" scripts/gpu_leaf_check.py --gb 1 --reps 5
        ;;
    profile)
        run 150 "$py" scripts/gpu_profile.py --preset gpt-shakespeare --model "$GPT2" --batch-size 8 --steps 2 \
            --out "$out/profile-gpt2.json"
        run 60 "$py" scripts/gpu_profile.py --preset gpt-shakespeare --steps 5 --out "$out/profile-gpt.json"
        ;;
    overhead)
        f=$out/overhead.jsonl
        json 90 "$f" "${vgame[@]}" bench overhead --preset gpt-shakespeare --profile cuda --steps 20 --repeats 2 --json
        json 150 "$f" "${vgame[@]}" bench overhead --preset gpt-shakespeare --profile cuda --model "$GPT2" \
            --batch-size 8 --steps 5 --repeats 3 --warmup 1 --block 5 --json
        json 150 "$f" "${vgame[@]}" bench overhead --preset cnn-digits --profile cuda --model "$RESNET" \
            --batch-size 8 --steps 5 --repeats 3 --warmup 1 --block 5 --json
        json 45 "$f" "${vgame[@]}" bench overhead --preset cnn-digits --profile cuda --steps 20 --repeats 2 --json
        ;;
    front)
        # through the Python dispatch mode: what the C++ front took off a GPU step
        switched_off VGAME_FRONT=0 "$out/front-off.jsonl"
        ;;
    groups)
        # a foreach op's tensors rounded one kernel call each: what the group kernels took off a step
        switched_off VGAME_GROUPS=0 "$out/groups-off.jsonl"
        ;;
    audits)
        # CPU <-> CUDA, both ways: every leaf must match (docs/benchmarks.md, "CPU against a GPU")
        f=$out/audits.jsonl
        runs=$(mktemp -d)
        for preset in gpt-shakespeare cnn-digits; do
            # 120 s where CUDA runs: the first CUDA run of a process compiles the Triton kernels
            run 60 "${vgame[@]}" train --preset "$preset" --steps 20 --profile cpu-1t --out "$runs/cpu-$preset"
            json 120 "$f" "${vgame[@]}" audit --transcript "$runs/cpu-$preset" --profile cuda --json
            run 120 "${vgame[@]}" train --preset "$preset" --steps 20 --profile cuda --out "$runs/gpu-$preset"
            json 60 "$f" "${vgame[@]}" audit --transcript "$runs/gpu-$preset" --profile cpu-1t --json
        done
        rm -rf "$runs"
        ;;
    hf)
        # a task of one's own on real hardware (issue 43): Hugging Face's GPT-2 (stock SDPA and dropout,
        # served), Llama (float32 rotary table and RMSNorm, rounded by way of their float64 twins) and
        # GPT-2 with PEFT's LoRA adapters, each trained on one side and audited on the other, both ways
        f=$out/audits.jsonl
        runs=$(mktemp -d)
        (
            cd examples/hf || exit 1
            export HF_HUB_OFFLINE=1
            for model in gpt2 llama lora; do
                run 120 "${vgame[@]}" train --config "$model.toml" --steps 10 --profile cuda --out "$runs/gpu-$model"
                json 120 "$f" "${vgame[@]}" audit --transcript "$runs/gpu-$model" --profile cpu-1t --json
                run 120 "${vgame[@]}" train --config "$model.toml" --steps 10 --profile cpu-1t --out "$runs/cpu-$model"
                json 120 "$f" "${vgame[@]}" audit --transcript "$runs/cpu-$model" --profile cuda --json
            done
        )
        rm -rf "$runs"
        ;;
    logs)
        # the host's work on a GPT-2-shape step's rounding log (millions of listed values), on this
        # machine's host: set beside the same command's figures on the 2-core CPU machine
        runs=$(mktemp -d)
        run 120 "${vgame[@]}" train --preset gpt-shakespeare --model "$GPT2" --batch-size 8 --steps 3 \
            --profile cuda --out "$runs/g2"
        json 150 "$out/logs.jsonl" "$py" scripts/log_host_ms.py --transcript "$runs/g2" --repeats 3
        rm -rf "$runs"
        ;;
    graphs)
        # what a captured CUDA graph of the forward and backward pass would take off a step (a probe:
        # the step itself is not captured yet)
        run 120 "$py" scripts/gpu_graph_probe.py --preset gpt-shakespeare --out "$out/graph-gpt.json"
        run 150 "$py" scripts/gpu_graph_probe.py --preset gpt-shakespeare --model "$GPT2" --batch-size 8 \
            --steps 5 --out "$out/graph-gpt2.json"
        ;;
    *)
        note "unknown stage $stage (known: ${all[*]})"
        ;;
    esac
done
note "done"
