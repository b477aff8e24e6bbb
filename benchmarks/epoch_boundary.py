"""Benchmark: the first fetch of an epoch against the others, DataLoader workers kept or started again.

``train.dataloader.persistent_workers: true`` keeps the stream's loader (``batching.MicroBatches``) and its
worker processes from one epoch to the next; ``false`` builds a new loader, and starts new workers, each
epoch. The stream reads ``--epochs`` epochs of packed micro-batches (``--micro`` rows of ``--row`` tokens)
from ``--samples`` synthetic samples (lognormal lengths, mean about 13 tokens: as many micro-batches as the
reviews profile's texts make), sleeping ``--step`` seconds after each fetch (the training step the workers
prefetch behind); ``--ballast-mb`` of tensors held in the process stand for a model (forking a larger process
costs more). Printed per setting: each later epoch's first fetch and the median fetch, in ms. Nothing is
asserted.

    python benchmarks/epoch_boundary.py                      # 2 workers, 3 epochs, both settings
    python benchmarks/epoch_boundary.py --ballast-mb 2000
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from fastlm.engine.batching import StreamLayout, loader_settings, micro_batches
from fastlm.engine.config import parse_train_params
from fastlm.engine.data.token_dataset import TokenSequences

EOS = 2


def synthetic(samples: int, seed: int = 0) -> TokenSequences:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(2.3, 0.7, samples).astype(np.int64), 4, 320)
    tokens = rng.integers(3, 8000, int(lengths.sum()))
    return TokenSequences(tokens, np.concatenate([[0], np.cumsum(lengths)]))


def fetch_times(data: TokenSequences, args, persistent: bool) -> list[list[float]]:
    """Each epoch's fetch times (seconds), the stream reading ``args.epochs`` epochs."""
    params = parse_train_params(
        {
            "batching": {"mode": "packed", "micro_batch_size": args.micro, "row_length": args.row},
            "dataloader": {
                "num_workers": args.workers,
                "prefetch_factor": args.prefetch,
                "persistent_workers": persistent,
                "pin_memory": False,
            },
            "runtime": {"device": "cpu"},
        }
    )
    layout = StreamLayout(EOS, args.row, None, loader_settings(params, torch.device("cpu")))
    stream = micro_batches(data, params, layout)
    epochs: list[list[float]] = []
    try:
        while True:
            epoch = stream.epoch
            start = time.perf_counter()
            next(stream)
            took = time.perf_counter() - start
            if stream.epoch >= args.epochs:
                break
            if stream.epoch != epoch or not epochs:
                epochs.append([])
            epochs[-1].append(took)
            time.sleep(args.step)
    finally:
        stream.close()
    return epochs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--micro", type=int, default=32)
    parser.add_argument("--row", type=int, default=320)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--prefetch", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--step", type=float, default=0.1)
    parser.add_argument("--ballast-mb", type=int, default=0)
    args = parser.parse_args()
    ballast = torch.ones(args.ballast_mb * 2**18) if args.ballast_mb else None  # float32: 4 bytes each
    data = synthetic(args.samples)
    for persistent in (False, True):
        epochs = fetch_times(data, args, persistent)
        firsts = [round(1000 * times[0], 1) for times in epochs[1:]]
        rest = [took for times in epochs for took in times[1:]]
        print(
            f"persistent_workers {str(persistent).lower()}: {len(epochs[0])} micro-batches an epoch; "
            f"later epochs' first fetch {firsts} ms, median fetch {1000 * statistics.median(rest):.1f} ms"
        )
    del ballast


if __name__ == "__main__":
    main()
