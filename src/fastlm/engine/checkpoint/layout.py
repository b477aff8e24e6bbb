"""A training checkpoint's folder layout: ``checkpoint-<step:08d>/`` holds these files, and the ``COMPLETE``
marker written last says the folder is whole (a folder without it is an interrupted save). ``FINISHED``, added
to a complete checkpoint later, says the run ended there though its state reads unfinished (a run entered
again with nothing to train, ``files.mark_finished``): not in the manifest, never loaded. Also the one error
a checkpoint that cannot be used raises, shared by every checkpoint module (writing, the lock, finding,
loading).
"""

from pathlib import Path

from fastlm.errors import FastlmError

FORMAT_VERSION = 1
MARKER = "COMPLETE"
FINISHED = "FINISHED"  # {"format", "step", "reason"}: the run ended here (discovery.finished_step)
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
GRAD_SCALER_FILE = "grad_scaler.pt"
RNG_FILE = "rng.pt"
STATE_FILE = "trainer_state.json"
TMP_PREFIX = ".tmp-"
LOCK_FILE = ".lock"
SUPERSEDED_PREFIX = "superseded-"


class CheckpointError(FastlmError, ValueError):
    """A checkpoint that cannot be used; the message is one line naming the file and the fix.

    A FastlmError, so the project CLI prints it as one line and exits with status 2 (no traceback).
    """


def checkpoint_dir(root: Path, step: int) -> Path:
    return Path(root) / f"checkpoint-{step:08d}"
