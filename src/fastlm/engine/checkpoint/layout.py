"""A training checkpoint's folder layout: ``checkpoint-<step>/`` holds these files, and the ``COMPLETE`` marker
written last says the folder is whole (a folder without it is an interrupted save)."""

FORMAT_VERSION = 1
MARKER = "COMPLETE"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
GRAD_SCALER_FILE = "grad_scaler.pt"
RNG_FILE = "rng.pt"
STATE_FILE = "trainer_state.json"
TMP_PREFIX = ".tmp-"
LOCK_FILE = ".lock"
SUPERSEDED_PREFIX = "superseded-"
