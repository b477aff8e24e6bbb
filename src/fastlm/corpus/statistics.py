"""The split report: rows per split, drops per reason, token length percentiles, share truncated."""

from __future__ import annotations

from typing import Any

import numpy as np

PERCENTILES = (50, 90, 95, 99)


def length_summary(lengths: np.ndarray, truncated: np.ndarray) -> dict[str, Any]:
    """Token-length statistics of one split (EOS included)."""
    if len(lengths) == 0:
        return {"rows": 0, "tokens": 0, "mean_length": 0.0, "max_length": 0, "truncated_share": 0.0}
    points = np.percentile(lengths, PERCENTILES)
    return {
        "rows": int(len(lengths)),
        "tokens": int(lengths.sum()),
        "mean_length": round(float(lengths.mean()), 2),
        **{f"p{p}_length": float(value) for p, value in zip(PERCENTILES, points, strict=True)},
        "max_length": int(lengths.max()),
        "truncated_rows": int(truncated.sum()),
        "truncated_share": round(float(truncated.mean()), 6),
    }


def build_report(
    raw_rows: int, drops: dict[str, int], capped: int, splits: dict[str, dict], extra: dict
) -> dict:
    kept = sum(split["rows"] for split in splits.values())
    return {
        "raw_rows": int(raw_rows),
        "dropped": {**drops, "total": int(sum(drops.values()))},
        "capped_by_max_samples": int(capped),
        "kept_rows": int(kept),
        "splits": splits,
        **extra,
    }
