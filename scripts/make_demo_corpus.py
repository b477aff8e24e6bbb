"""Write the embedded demo data as JSONL: synthetic Korean/English texts, or dialogue -> summary pairs.

Usage:
    python scripts/make_demo_corpus.py [--out data/01_raw/demo_corpus.jsonl] [--n 24000] [--seed 0]
    python scripts/make_demo_corpus.py --dialogues [--out data/01_raw/demo_dialogues.jsonl] [--n 3000]

Both files have a few dirty rows on purpose. The output depends only on --n and --seed (byte for byte).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from demo_data.dialogues import write_demo_dialogues  # scripts/demo_data: this script's folder is on the path
from demo_data.texts import write_demo_corpus

ROOT = Path(__file__).resolve().parents[1]
RAW = ROOT / "data" / "01_raw"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dialogues", action="store_true", help="dialogue -> summary pairs instead of texts")
    parser.add_argument(
        "--out",
        default=None,
        help="output JSONL path (default: data/01_raw/demo_corpus.jsonl, "
        "or demo_dialogues.jsonl with --dialogues)",
    )
    parser.add_argument(
        "--n", type=int, default=None, help="rows, dirty rows included (default 24,000 / 3,000)"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    args = parser.parse_args(argv)
    write, name, rows = (
        (write_demo_dialogues, "demo_dialogues.jsonl", 3_000)
        if args.dialogues
        else (write_demo_corpus, "demo_corpus.jsonl", 24_000)
    )
    counts = write(args.out or str(RAW / name), n=args.n or rows, seed=args.seed)
    print(json.dumps(counts, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
