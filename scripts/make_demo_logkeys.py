r"""Write the demo log-key sequences (pre-tokenized integer ids with planted anomalies) as JSONL.

Usage:
    python scripts/make_demo_logkeys.py [--out data/01_raw/demo_logkeys.jsonl] [--n 2000] [--seed 0]

Each line is {"ids": [...], "anomaly": true|false}; the output depends only on --n and --seed (byte for byte).
Split it with:

    kedro run --pipeline=split \
        --params raw_path=data/01_raw/demo_logkeys.jsonl,split.pretokenized=true,split.vocab_size=64
"""

from __future__ import annotations

import argparse
from pathlib import Path

from demo_data.logkeys import write_demo_logkeys  # scripts/demo_data: this script's folder is on the path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", default=str(ROOT / "data" / "01_raw" / "demo_logkeys.jsonl"), help="output JSONL"
    )
    parser.add_argument("--n", type=int, default=2000, help="sessions")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    args = parser.parse_args(argv)
    print(write_demo_logkeys(args.out, n=args.n, seed=args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
