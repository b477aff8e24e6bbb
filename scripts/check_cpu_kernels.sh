#!/usr/bin/env bash
# Run tests under several CPU kernel sets, as other machines would dispatch them.
#
#   bash scripts/check_cpu_kernels.sh                       every set, tests/engine
#   bash scripts/check_cpu_kernels.sh --sets avx2,default -m kernels     (what CI runs after the suite)
#   bash scripts/check_cpu_kernels.sh --list                the sets, and the kernels torch picks under each
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
args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --sets) sets="$2"; shift 2 ;;
        --sets=*) sets="${1#--sets=}"; shift ;;
        --list) list=1; shift ;;
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
trap 'rm -rf "$caches"' EXIT
IFS=',' read -r -a names <<< "$sets"
for name in "${names[@]}"; do
    words=$(kernel_env "$name") || exit 2
    capability=$(env $words "$PYTHON" -c 'import torch; print(torch.backends.cpu.get_cpu_capability())' 2>&1)
    if [ "$list" -eq 1 ]; then
        echo "$name: ${words:-(nothing set)} -> ATen $capability"
        continue
    fi
    echo "== check_cpu_kernels: $name (${words:-nothing set}; ATen picks $capability): pytest ${args[*]}"
    start=$SECONDS
    env $words TORCHINDUCTOR_CACHE_DIR="$caches/$name" "$PYTHON" -m pytest -q -p no:cacheprovider "${args[@]}"
    code=$?
    echo "== check_cpu_kernels: $name: exit $code in $((SECONDS - start)) s"
    [ "$code" -ne 0 ] && status=1
done
exit "$status"
