"""Write the embedded prompt/response demo data (synthetic Korean/English dialogue -> summary pairs) as JSONL.

Usage: python scripts/make_demo_dialogues.py [--out data/01_raw/demo_dialogues.jsonl] [--n 3000] [--seed 0]

The output depends only on --n and --seed (byte for byte, on any machine).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

try:
    from fastlm.corpus.synthetic_dialogues import write_demo_dialogues
except ImportError:  # not installed: use the source tree
    sys.path.insert(0, str(ROOT / "src"))
    from fastlm.corpus.synthetic_dialogues import write_demo_dialogues


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "data" / "01_raw" / "demo_dialogues.jsonl"),
                        help="output JSONL path (default: data/01_raw/demo_dialogues.jsonl)")
    parser.add_argument("--n", type=int, default=3_000, help="rows in the file, dirty rows included")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    args = parser.parse_args(argv)
    print(json.dumps(write_demo_dialogues(args.out, n=args.n, seed=args.seed), indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
