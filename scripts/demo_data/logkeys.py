"""Deterministic log-key sequences (integer ids, as a log parser gives them) with planted anomalies.

Normal sessions follow a few fixed workflows (open -> a loop of work keys -> close), with the loop count and
the form of each pass (plain, with a branch, or cut short) drawn per session; only keys
``0 .. NORMAL_KEYS - 1`` occur in them. An anomaly is a normal session with a few keys it never contains
(``NORMAL_KEYS .. vocab_size - 2``) inserted at random places. ``vocab_size - 1`` is left free for EOS
(split.eos_id's default).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

VOCAB_SIZE = 64
NORMAL_KEYS = 40
WORKFLOWS = (  # (opening keys, loop body, optional branch, closing keys)
    ((0, 1, 2), (3, 4, 5), (6,), (7, 8)),
    ((9, 10), (11, 12), (13, 14), (15,)),
    ((16, 17, 18), (19, 20, 21, 22), (23,), (24, 25)),
    ((26, 27), (28, 29), (30, 31), (32, 33)),
    ((34, 35), (36, 37), (38,), (39,)),
)


def logkey_sessions(n: int, *, seed: int = 0, anomaly_rate: float = 0.03) -> list[dict]:
    """``n`` sessions ``{"ids": [...], "anomaly": bool}``; the output depends only on the arguments."""
    rng = np.random.default_rng(seed)
    sessions = []
    for _ in range(n):
        opening, body, branch, closing = WORKFLOWS[int(rng.integers(len(WORKFLOWS)))]
        ids = list(opening)
        for _ in range(int(rng.integers(2, 9))):  # each pass: the body, the body + branch, or a short body
            kind = rng.random()
            ids += body[:-1] if kind < 0.2 else body
            if kind > 0.7:
                ids += branch
        ids += closing
        anomaly = bool(rng.random() < anomaly_rate)
        if anomaly:
            for _ in range(int(rng.integers(2, 4))):
                position = int(rng.integers(1, len(ids)))
                ids.insert(position, int(rng.integers(NORMAL_KEYS, VOCAB_SIZE - 1)))
        sessions.append({"ids": ids, "anomaly": anomaly})
    return sessions


def write_demo_logkeys(path: str | Path, *, n: int = 2000, seed: int = 0) -> Path:
    """The demo file (JSON Lines, one session per line): ``kedro run --pipeline=split --params
    raw_path=data/01_raw/demo_logkeys.jsonl,split.pretokenized=true,split.vocab_size=64``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in logkey_sessions(n, seed=seed)),
        encoding="utf-8",
    )
    return path
