"""Benchmark: what one shape per micro-batch costs (``train.runtime.compile_mode: reduce-overhead``).

A CUDA graph replays one shape, so with ``reduce-overhead`` every packed micro-batch keeps its capacity (the
varlen row padded to ``micro_batch_size`` rows of the row length, ``PackedCollator.fixed_shape`` and
``attention.inputs.without_padding``) where the default mode computes the real tokens rounded up to 8. This
measures, on gpu_speed.py's documents (the demo texts, or one real-length short review per document), the
tokens each set-up computes against the real ones, and how many boundary counts (powers of two: one CUDA
graph recorded per count and layer) an epoch's micro-batches need. Host-side only: the collator and the
varlen view, no model.

    python benchmarks/fixed_shapes.py                                  # 2,000 demo documents, 20,000 reviews
    python benchmarks/fixed_shapes.py --demo-docs 200 --review-docs 1000 --seq-len 512   # a smoke run

Nothing is asserted; ``--json`` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks"))


def measure(texts: str, docs: int, seq_len: int, rows: int) -> dict:
    import gpu_speed
    import numpy as np

    from fastlm.engine.batching import make_batching
    from fastlm.engine.config import parse_train_params
    from fastlm.engine.data.token_dataset import TokenSequences
    from fastlm.engine.model.attention.inputs import without_padding

    with tempfile.TemporaryDirectory() as work:
        gpu_speed.prepare(Path(work), docs, seq_len, texts=texts)
        data = np.load(Path(work) / "tokens.npz")
        dataset = TokenSequences(data["values"], data["offsets"])
    out = {"texts": texts, "documents": docs}
    graphs = {"compile": True, "compile_scope": "layers", "compile_mode": "reduce-overhead"}
    for name, runtime in (("default", {}), ("reduce-overhead", graphs)):
        params = parse_train_params(
            {
                "batching": {"mode": "packed", "micro_batch_size": rows},
                "runtime": {"device": "auto", **runtime},
            }
        )
        sampler, collator = make_batching(params, dataset.lengths, pad_id=0, max_length=seq_len, seed=0)
        sampler.set_epoch(0, start_batch=0)
        real = computed = batches = 0
        shapes, counts = set(), set()
        for indices in sampler:
            batch = without_padding(collator(dataset.__getitems__(indices)))
            real += int(batch["num_real_tokens"])
            computed += int(batch["num_computed_tokens"])
            batches += 1
            shapes.add(tuple(batch["input_ids"].shape))
            counts.add(len(batch["cu_seq_lens"]) - 1)
        out[name] = {
            "micro_batches": batches,
            "real_tokens": real,
            "computed_tokens": computed,
            "padding_share": 1 - real / computed,
            "token_counts": len(shapes),
            "segment_counts": sorted(counts),
        }
    out["computed_ratio"] = out["reduce-overhead"]["computed_tokens"] / out["default"]["computed_tokens"]
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo-docs", type=int, default=2000)
    parser.add_argument("--review-docs", type=int, default=20000)
    parser.add_argument("--seq-len", type=int, default=2048, help="the row length (gpu_speed.py's)")
    parser.add_argument("--rows", type=int, default=4, help="rows per micro-batch (the 3B runs' 4)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    results = [
        measure("demo", args.demo_docs, args.seq_len, args.rows),
        measure("reviews", args.review_docs, args.seq_len, args.rows),
    ]
    print(f"packed micro-batches of {args.rows} rows x {args.seq_len} tokens, one epoch each")
    header = f"{'texts':<9}{'mode':<17}{'batches':>8}{'real tok':>11}{'computed':>11}{'padding':>9}"
    print(header + f"{'token counts':>14}  boundary counts")
    for result in results:
        for mode in ("default", "reduce-overhead"):
            row = result[mode]
            counts = row["segment_counts"]
            shown = ", ".join(map(str, counts[:6])) + (f", ... ({len(counts)})" if len(counts) > 6 else "")
            print(
                f"{result['texts']:<9}{mode:<17}{row['micro_batches']:>8}{row['real_tokens']:>11,}"
                f"{row['computed_tokens']:>11,}{row['padding_share']:>9.2%}{row['token_counts']:>14}  {shown}"
            )
        print(
            f"{result['texts']}: one shape computes {result['computed_ratio']:.4f}x the tokens of the default"
        )
    if args.json:
        args.json.write_text(json.dumps({"seq_len": args.seq_len, "rows": args.rows, "results": results}))


if __name__ == "__main__":
    main()
