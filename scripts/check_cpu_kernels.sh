#!/usr/bin/env bash
# Run tests under several CPU kernel sets, as other machines would dispatch them.
#
#   bash scripts/check_cpu_kernels.sh                       every set, tests/engine
#   bash scripts/check_cpu_kernels.sh --sets avx2,default -m kernels     (what CI runs after the suite)
#   bash scripts/check_cpu_kernels.sh --list                the sets, and the kernels torch picks under each
#   --jobs N   run N sets at once (default: one per CPU core, at most one per set); each set's pytest output
#              is printed whole when it ends, in the order of --sets
#
# PyTorch picks its CPU kernels by the CPU it runs on: ATen's vectorised kernels (AVX512 on most Intel Xeons,
# AVX2 on many AMD EPYCs and older Intel), MKL's GEMM and oneDNN's bf16 matmuls each dispatch their own code
# path. A test comparing two different computations with == can pass on one CPU and fail on another; this
# script runs the tests under the sets below on *this* machine, so the developer sees it before a user does.
#   native   what this CPU dispatches by itself
#   avx2     ATEN_CPU_CAPABILITY=avx2, MKL and oneDNN capped at AVX2 (e.g. an AMD EPYC of Zen 2/3)
#   default  ATEN_CPU_CAPABILITY=default (no vector extension), MKL capped at SSE4.2, oneDNN at SSE4.1
# Sets above the CPU's own are capped by PyTorch at what the CPU has. Extra arguments go to pytest.
# Each set compiles with inductor into a cache of its own (TORCHINDUCTOR_CACHE_DIR, removed at the end):
# inductor's on-disk cache is not keyed on ATEN_CPU_CAPABILITY, and a kernel built under avx2 then fails to
# build under default ("'at::vec' has not been declared", torch 2.13).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
sets="native,avx2,default"
list=0
jobs=auto
args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --sets) sets="$2"; shift 2 ;;
        --sets=*) sets="${1#--sets=}"; shift ;;
        --list) list=1; shift ;;
        -h|--help) sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
        --jobs) jobs="$2"; shift 2 ;;
        --jobs=*) jobs="${1#--jobs=}"; shift ;;
        *) args+=("$1"); shift ;;
    esac
done
[ ${#args[@]} -eq 0 ] && args=(tests/engine)

kernel_env() {  # the environment of one set, as NAME=VALUE words
    case "$1" in
        native) echo "" ;;
        avx2) echo "ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2" ;;
        default) echo "ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 ONEDNN_MAX_CPU_ISA=SSE41" ;;
        *) echo "check_cpu_kernels: unknown kernel set '$1' (use native, avx2 or default)" >&2; return 2 ;;
    esac
}

status=0
caches=$(mktemp -d)
pids=()
stop_sets() {
    for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null; done
}
trap 'stop_sets; rm -rf "$caches"' EXIT
trap 'stop_sets; exit 130' INT TERM
IFS=',' read -r -a names <<< "$sets"
if [ "$jobs" = "auto" ]; then
    jobs=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
fi
if ! [[ "$jobs" =~ ^[1-9][0-9]*$ ]]; then
    echo "check_cpu_kernels: --jobs must be a whole number of at least 1 or auto, not '$jobs'" >&2
    exit 2
fi
[ "$jobs" -gt "${#names[@]}" ] && jobs=${#names[@]}

check_set() {  # one set's pytest, between a line naming the set and one with its exit status (returned)
    local name=$1 words=${words_of[$1]} start=$SECONDS code
    echo "== check_cpu_kernels: $name (${words:-nothing set}; ATen picks ${capability_of[$name]}): pytest ${args[*]}"
    env $words TORCHINDUCTOR_CACHE_DIR="$caches/$name" "$PYTHON" -m pytest -q -p no:cacheprovider "${args[@]}"
    code=$?
    echo "== check_cpu_kernels: $name: exit $code in $((SECONDS - start)) s"
    return "$code"
}

run_set() {  # check_set's lines into $caches/<set>.log, its exit status into $caches/<set>.status
    check_set "$1" > "$caches/$1.log" 2>&1
    echo "$?" > "$caches/$1.status"
}

report_set() {  # print a finished set's lines; a set without a status (killed) counts as failed
    local name=$1
    cat "$caches/$name.log"
    [ "$(cat "$caches/$name.status" 2>/dev/null)" = "0" ] || status=1
}

declare -A words_of capability_of
for name in "${names[@]}"; do
    words_of[$name]=$(kernel_env "$name") || exit 2
    capability_of[$name]=$(env ${words_of[$name]} "$PYTHON" -c 'import torch; print(torch.backends.cpu.get_cpu_capability())' 2>&1)
    if [ "$list" -eq 1 ]; then
        echo "$name: ${words_of[$name]:-(nothing set)} -> ATen ${capability_of[$name]}"
    fi
done
[ "$list" -eq 1 ] && exit 0

if [ "$jobs" -eq 1 ]; then
    for name in "${names[@]}"; do  # one at a time, its output as it comes
        check_set "$name" || status=1
    done
    exit "$status"
fi

echo "== check_cpu_kernels: ${#names[@]} sets, $jobs at a time (--jobs); each set's output follows when it ends"
start=$SECONDS
next=0
running=()
while [ "$next" -lt "${#names[@]}" ] || [ ${#running[@]} -gt 0 ]; do
    while [ "$next" -lt "${#names[@]}" ] && [ ${#running[@]} -lt "$jobs" ]; do
        name=${names[$next]}
        set -m  # each set in a process group of its own, stopped whole on Ctrl-C
        run_set "$name" &
        set +m
        pids+=("$!")
        running+=("$next")
        next=$((next + 1))
    done
    wait -n 2>/dev/null || true
    still=()
    for index in "${running[@]}"; do
        if kill -0 "${pids[$index]}" 2>/dev/null; then still+=("$index"); fi
    done
    running=("${still[@]}")
done
for name in "${names[@]}"; do report_set "$name"; done
echo "== check_cpu_kernels: every set done in $((SECONDS - start)) s"
exit "$status"
