"""fastlm: fast, measured fine-tuning of causal language models.

Importing the package sets safe process defaults before any library reads them: telemetry off
(Kedro, MLflow, Hugging Face) and no hub downloads unless the user opted in by setting the
variables themselves. Nothing here imports Kedro, so the engine stays usable on its own.

At exit, the objects still alive are frozen out of the interpreter's last cyclic collection: with torch and
transformers loaded it scans hundreds of thousands of objects, seconds at the end of every `kedro run` and
every training worker, to free memory the process is handing back anyway.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import sys
import warnings

__version__ = "0.1.0"

_OFFLINE_DEFAULTS = {
    "DO_NOT_TRACK": "true",  # the word true: Kedro and MLflow telemetry both read it
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
}


# Warnings third-party code raises whatever the user does (kedro-mlflow importing MLflow's pyfunc, OmegaConf's
# resolver API, peft reading a property transformers 5 deprecated, kedro-viz importing a response class
# FastAPI deprecated): filtered before any plugin is imported.
_THIRD_PARTY_NOISE = (
    (r".*Add type hints to the `predict` method", UserWarning),
    (r"register_new_resolver\(\) is deprecated", UserWarning),
    (r"`is_gradient_checkpointing` is deprecated", FutureWarning),
    (r"ORJSONResponse is deprecated", UserWarning),
)


# Log lines third-party code writes at import: bitsandbytes' CPU backend (on CPUs with AVX-512 bf16) says it
# could not load an inference kernel from the hub and advises installing ``kernels``, which would download it;
# fastlm runs offline and turns that kernel off (engine/model/lora.py, prepare_quantized). MLflow shows its
# pyfunc warning above whatever the filters say (it sets its own while it checks a model class), which Kedro's
# logging passes on as a py.warnings record when Kedro's CLI loads kedro-mlflow's commands.
_THIRD_PARTY_LOG_NOISE = (
    ("bitsandbytes.backends.cpu.ops", "from kernels-community"),
    ("py.warnings", "Add type hints to the `predict` method"),
)


class _DropMessage(logging.Filter):
    """Drops a logger's records whose message (its arguments filled in) holds ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def apply_process_defaults() -> None:
    """Set the defaults above where the user has not set the variable (also a ``kedro.init`` hook)."""
    for key, value in _OFFLINE_DEFAULTS.items():
        os.environ.setdefault(key, value)
    if (
        not sys.stderr.isatty()
    ):  # redirected output: no tqdm redraws ("Loading weights", "Writing model shards")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    for message, category in _THIRD_PARTY_NOISE:
        warnings.filterwarnings("ignore", message=message, category=category)
    for name, text in _THIRD_PARTY_LOG_NOISE:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessage) and f.text == text for f in logger.filters):
            logger.addFilter(_DropMessage(text))


apply_process_defaults()
# Registered at import, so it runs after the exit handlers of the libraries imported later (last in, first
# out): their own clean-up (logging's flush, MLflow's run end) still happens first.
atexit.register(gc.freeze)
