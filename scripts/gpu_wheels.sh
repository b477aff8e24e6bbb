#!/usr/bin/env bash
# Download the wheels a GPU session needs and the GPU machine lacks into .whl/ (ignored by git), small
# enough to travel with the repository (the device tool carries at most 64 MiB: the tree plus `carry`).
#
#   bash scripts/gpu_wheels.sh                          the default pins below
#   bash scripts/gpu_wheels.sh peft==0.22.0 trl==1.16.0 another pin for peft, one more package
#   bash scripts/gpu_wheels.sh --no-download            slim and size what .whl/ already holds
#   bash scripts/gpu_wheels.sh --limit-mib 50           a tighter limit (default 60)
#
# Each NAME==VERSION (the defaults: DEFAULT_PINS below) is downloaded for the GPU machine (CPython 3.12,
# manylinux x86_64 or pure Python, no dependencies: that machine has torch and the rest), replacing any other
# version of NAME in .whl/.
# bitsandbytes' wheel bundles a library per CUDA / ROCm / XPU toolkit (41 MB); it is slimmed to the CUDA 13.x
# and CPU ones (scripts/slim_wheel.py; the GPU machine runs torch built for CUDA 13.0). The script prints each
# wheel's size and the total, and fails when the wheels plus the files the tool copies (tracked and untracked
# files git does not ignore) pass the limit. On the GPU machine (benchmarks/gpu_session.sh does this):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
#       .whl/*.whl && export PYTHONPATH=/tmp/site
set -euo pipefail
ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
cd "$ROOT"
PYTHON=${PYTHON:-python3}
# the GPU levers and benchmarks (the image has transformers 5.17, no bitsandbytes, liger-kernel or torchao)
DEFAULT_PINS=(bitsandbytes==0.50.0 liger-kernel==0.8.0 cut-cross-entropy==25.1.1 torchao==0.18.0 peft==0.21.0
              transformers==5.24.0 trl==1.16.0)
# what the engine (pydantic parameters) and the Trainer contenders (datasets) import and the image's package
# list lacks; pydantic-core is pinned by pydantic, multiprocess is built per Python (py312)
DEFAULT_PINS+=(pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
               typing-extensions==4.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19)
BNB_KEEP='libbitsandbytes_(cpu|cuda13[0-9]*)\.so$'
limit_mib=60
download=1
pins=("${DEFAULT_PINS[@]}")

normalized() {  # a distribution name as wheel files spell it: lower case, runs of -_. as one underscore
    echo "$1" | tr '[:upper:]' '[:lower:]' | sed -E 's/[-_.]+/_/g'
}

slim() {  # bitsandbytes' wheels in folder $1, down to the CUDA 13.x and CPU libraries
    for wheel in "$1"/bitsandbytes-*.whl; do
        [ -e "$wheel" ] || continue
        "$PYTHON" "$ROOT/scripts/slim_wheel.py" "$wheel" --keep "$BNB_KEEP"
    done
}

while [ $# -gt 0 ]; do
    case "$1" in
        --limit-mib) limit_mib="$2"; shift 2 ;;
        --no-download) download=0; shift ;;
        -h|--help) sed -n '2,/^set /p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *==*)
            name=$(normalized "${1%%==*}")
            kept=()
            for pin in "${pins[@]}"; do
                [ "$(normalized "${pin%%==*}")" = "$name" ] || kept+=("$pin")
            done
            pins=("${kept[@]}" "$1")
            shift ;;
        *)
            echo "gpu_wheels.sh: argument '$1' is not NAME==VERSION; pin each package, e.g. peft==0.21.0" >&2
            exit 2 ;;
    esac
done
case "$limit_mib" in
    ''|*[!0-9]*)
        echo "gpu_wheels.sh: --limit-mib '$limit_mib' is not a whole number of MiB; e.g. --limit-mib 60" >&2
        exit 2 ;;
esac

# .whl/ stays out of git (and so out of what the device tool copies unless named in carry)
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
touch "$exclude"
grep -qxF '/.whl/' "$exclude" || echo '/.whl/' >> "$exclude"
mkdir -p .whl

if [ "$download" = 1 ]; then
    staging=$(mktemp -d)
    trap 'rm -rf "$staging"' EXIT
    for pin in "${pins[@]}"; do
        if ! "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
            --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
            -d "$staging/$pin" "$pin" >"$staging/pip.log" 2>&1; then
            tail -n 3 "$staging/pip.log" >&2
            echo "gpu_wheels.sh: pip could not download $pin for CPython 3.12 manylinux x86_64;" \
                "check the pin and that the package index is reachable" >&2
            exit 1
        fi
        slim "$staging/$pin"
        rm -f .whl/"$(normalized "${pin%%==*}")"-*.whl
        mv "$staging/$pin"/*.whl .whl/
    done
fi
slim .whl  # a wheel put there by hand (--no-download); a slimmed one is left as it is

"$PYTHON" - "$limit_mib" <<'EOF'
import subprocess
import sys
from pathlib import Path

limit = int(sys.argv[1]) * 2**20
wheels = sorted(Path(".whl").glob("*.whl"))
total = 0
for wheel in wheels:
    size = wheel.stat().st_size
    total += size
    print(f"{size / 2**20:8.1f} MiB  {wheel.name}")
listed = subprocess.run(
    ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
    capture_output=True, check=True,
).stdout.decode().split("\0")
tree = sum(Path(p).stat().st_size for p in listed if p and Path(p).is_file())
print(f"{total / 2**20:8.1f} MiB  wheels in all ({len(wheels)})")
print(f"{tree / 2**20:8.1f} MiB  repository files the device tool copies")
print(f"{(total + tree) / 2**20:8.1f} MiB  together (limit {limit / 2**20:.0f} MiB; the tool's is 64 MiB)")
if total + tree > limit:
    print(
        f"gpu_wheels.sh: the wheels and the repository come to {(total + tree) / 2**20:.1f} MiB, over the "
        f"{limit / 2**20:.0f} MiB limit; drop a wheel from .whl/ or pin a smaller version",
        file=sys.stderr,
    )
    sys.exit(1)
EOF
