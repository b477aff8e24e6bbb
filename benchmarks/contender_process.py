"""Run one benchmark contender in a fresh Python process and collect its JSON result (shared by the
scripts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from cpu_usage import busy_cpu_s, children_cpu_s

# Set by every benchmark script before it imports a Hugging Face library: nothing is downloaded or reported.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "true",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
}


def partial_path(result: str | Path) -> Path:
    """Where a child writes what it has measured so far (e.g. its timed steps), next to its ``--result``
    file: a child stopped at its cap hands that back (``run_contender``'s ``partial``)."""
    return Path(result).with_suffix(".partial.json")


def timeout_output(expired: subprocess.TimeoutExpired) -> str:
    """What a stopped child had printed: ``TimeoutExpired.output`` is bytes even under ``text=True``
    (Python's documented behaviour), None when nothing was read."""
    output = expired.output
    if isinstance(output, bytes):
        return output.decode("utf-8", errors="replace")
    return output or ""


def run_contender(
    script: Path,
    name: str,
    workdir: Path,
    index: int,
    extra_args: list[str],
    *,
    repo: Path,
    extra_env: dict[str, str] | None = None,
    timeout_s: float | None = None,
) -> dict:
    """``python <script> --run <name> --workdir ... --result ... <extra_args>``; its result plus wall and
    load.

    ``process_wall_s`` is the child's wall time from start to exit; ``other_load_cores`` how many cores other
    processes kept busy meanwhile. A failed child gives ``{"contender", "error", "output_tail"}``; one still
    running after ``timeout_s`` is killed and gives ``{"contender", "error": "did not finish in N s",
    "timed_out": True}``, with ``partial``: what it had written to ``partial_path`` (if anything).
    """
    result_path = workdir / f"result_{index}_{name}.json"
    command = [
        sys.executable,
        str(Path(script).resolve()),
        "--run",
        name,
        "--workdir",
        str(workdir),
        "--result",
        str(result_path),
        *extra_args,
    ]
    env = {
        **os.environ,
        "HF_HOME": str(workdir / "hf_home"),
        "HF_DATASETS_CACHE": str(workdir / "hf_cache"),
        **(extra_env or {}),
    }
    cpu_before, busy_before = children_cpu_s(), busy_cpu_s()
    start = time.perf_counter()
    try:
        process = subprocess.run(
            command,
            env=env,
            cwd=str(repo),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired as expired:
        tail = "\n".join(timeout_output(expired).strip().splitlines()[-10:])
        print(f"  {name}: did not finish in {timeout_s:.0f} s (stopped)", flush=True)
        if tail:  # where the time went: the child's last progress lines
            print("\n".join(f"    | {line}" for line in tail.splitlines()), flush=True)
        stopped = {
            "contender": name,
            "error": f"did not finish in {timeout_s:.0f} s",
            "timed_out": True,
            "output_tail": tail,
        }
        partial = partial_path(result_path)
        if partial.is_file():
            try:
                stopped["partial"] = json.loads(partial.read_text())
            except ValueError:  # stopped while writing it: nothing to hand back
                pass
        return stopped
    wall = time.perf_counter() - start
    own, busy = children_cpu_s() - cpu_before, busy_cpu_s() - busy_before
    if process.returncode != 0 or not result_path.exists():
        tail = "\n".join(process.stdout.strip().splitlines()[-30:])
        print(f"  {name}: FAILED (exit {process.returncode})\n{tail}", flush=True)
        return {"contender": name, "error": f"exit {process.returncode}", "output_tail": tail}
    result = json.loads(result_path.read_text())
    result.update(process_wall_s=wall, other_load_cores=max(busy - own, 0.0) / wall)
    return result
