#!/usr/bin/env bash
# Install fastlm (editable) into the current Python environment.
#   bash scripts/install.sh          runtime dependencies
#   bash scripts/install.sh --dev    plus the test and lint tools
#
# torch: an installed torch >= 2.4 is kept as it is (GPU machines bring their own CUDA build).
# Otherwise torch 2.13.0 is installed: the CUDA build where an NVIDIA driver is present, else the
# CPU build (from a local wheelhouse when pip's find-links has one, else from PyTorch's CPU index:
# set FASTLM_TORCH_CPU_INDEX to use a mirror), never several GB of CUDA packages on a CPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
EXTRAS=""
[[ "${1:-}" == "--dev" ]] && EXTRAS="[dev]"
export DO_NOT_TRACK=true PIP_DISABLE_PIP_VERSION_CHECK=1
pip_install() { "$PYTHON" -m pip install --quiet --root-user-action=ignore "$@"; }

if "$PYTHON" - <<'PY' 2>/dev/null
import sys, torch
major, minor = (int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
sys.exit(0 if (major, minor) >= (2, 4) else 1)
PY
then
    echo "fastlm install: keeping torch $("$PYTHON" -c 'import torch; print(torch.__version__)')"
elif command -v nvidia-smi >/dev/null 2>&1; then
    echo "fastlm install: NVIDIA driver found, installing torch 2.13.0 with CUDA"
    pip_install "torch==2.13.0"
elif wheelhouse=$(mktemp -d) && "$PYTHON" -m pip download --quiet --no-index --no-deps -d "$wheelhouse" "torch==2.13.0" >/dev/null 2>&1 \
        && ls "$wheelhouse" | grep -q '+cpu'; then
    echo "fastlm install: no GPU, installing the CPU build of torch 2.13.0 from the local wheelhouse"
    pip_install "torch==2.13.0"
else
    echo "fastlm install: no GPU, installing the CPU build of torch 2.13.0"
    pip_install "torch==2.13.0+cpu" --extra-index-url "${FASTLM_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
fi

pip_install -e ".${EXTRAS}"
echo "fastlm install: done ($("$PYTHON" -c 'import torch, transformers, kedro; print(f"torch {torch.__version__}, transformers {transformers.__version__}, kedro {kedro.__version__}")'))"
