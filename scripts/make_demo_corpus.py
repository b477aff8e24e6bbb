"""Write the embedded demo corpus (synthetic Korean/English texts with dirty rows) as JSONL.

Usage: python scripts/make_demo_corpus.py [--out data/01_raw/demo_corpus.jsonl] [--n 24000] [--seed 0]

The output depends only on --n and --seed (byte for byte, on any machine).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

try:
    from fastlm.corpus.synthetic import write_demo_corpus
except ImportError:  # not installed: use the source tree
    sys.path.insert(0, str(ROOT / "src"))
    from fastlm.corpus.synthetic import write_demo_corpus


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        default=str(ROOT / "data" / "01_raw" / "demo_corpus.jsonl"),
        help="output JSONL path (default: data/01_raw/demo_corpus.jsonl)",
    )
    parser.add_argument("--n", type=int, default=24_000, help="rows in the file, dirty rows included")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    args = parser.parse_args(argv)
    counts = write_demo_corpus(args.out, n=args.n, seed=args.seed)
    print(json.dumps(counts, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
