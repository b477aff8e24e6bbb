"""Data-parallel scaling, measured with CPU processes (gloo), and the multi-GPU communication volume on paper.

    python benchmarks/ddp_scaling.py [--steps 30] [--world 2] [--rows 6000]
    python benchmarks/ddp_scaling.py --weights-ab [--steps 30]     bf16 weights against fp32 ones under DDP
    python benchmarks/ddp_scaling.py --start-ab [--launches 4] [--steps 5]   spawn against forkserver workers

Same model, data and effective batch for every contender, each in the same run:

* ``1 process``: all the cores in one process, accumulation = world x a;
* ``N processes``: ``train.distributed.nproc_per_node = N`` (the launcher the train node uses), cores / N
  threads each, accumulation a, DDP with ``no_sync`` on the non-final micro-batches.

Printed: real tokens/s of the timed steps (the first log window, holding warm-up, is excluded), the ratio of
N processes to 1 process, the launch overhead (start to first step), and whether the loss trajectories agree.
On a CPU the cores are shared, so N processes cannot be faster than one process using every core: the figure
shows what data parallelism costs (gloo all-reduce, per-step host sums), not a speed-up. GPUs add devices.

``--weights-ab``: instead, two N-process runs at ``precision: bf16`` in the same run, one with bf16 weights
and fp32 masters (``param_dtype: bf16``; DDP's reduction adds the bf16 gradients into the masters in fp32)
and one with autocast over fp32 weights (``param_dtype: fp32``): their real tokens/s, ratio and loss curves.

``--start-ab``: instead, ``--launches`` short N-process runs in this one process by each of the launcher's
start methods (``train.distributed.start_method``), alternating spawn and forkserver, as a sweep or k-fold
launches its runs: each launch's start-up (its wall time before the training loop), the median of each
method's launches after its first (the forkserver's first starts the server), their ratio, and whether the
two methods' losses are the same (the same computation: they must be equal).

``--paper`` also prints, for the 0.73 B GPU benchmark config (benchmarks/gpu_speed.py) and a 7 B model, the
gradient bytes each GPU sends per optimizer step with a ring all-reduce (2 (N-1)/N x gradient bytes) and the
time it takes at a given bus bandwidth, beside the step's compute time at a given MFU.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
# demo_data: the demo-data generators
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from demo_data.texts import make_texts  # noqa: E402

from fastlm.corpus.tokenizer_source import train_bpe_tokenizer  # noqa: E402
from fastlm.engine.config import parse_train_params  # noqa: E402
from fastlm.engine.launch.job import TrainJob, run_job  # noqa: E402
from fastlm.engine.launch.workers import launch_workers  # noqa: E402
from fastlm.engine.model.build import build_model  # noqa: E402
from fastlm.engine.runtime.environment import usable_cpu_count  # noqa: E402

MAX_LENGTH = 256


def prepare(rows: int):
    import datasets

    texts = make_texts(rows, seed=5, profile="reviews")
    tokenizer = train_bpe_tokenizer(texts[:4000], vocab_size=4000, min_frequency=2, model_max_length=10**6)
    eos = tokenizer.eos_token_id
    ids = [row[: MAX_LENGTH - 1] + [eos] for row in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    return tokenizer, datasets.Dataset.from_dict({"input_ids": ids})


def params(
    workdir: Path,
    *,
    steps: int,
    accum: int,
    nproc: int,
    threads: int,
    precision="fp32",
    param_dtype="auto",
    start_method="auto",
):
    return parse_train_params(
        {
            "max_steps": steps,
            "log_every": 5,
            "eval_every": None,
            "save_every": None,
            "quiet": True,
            "resume": "never",
            "checkpoint_dir": str(workdir / f"checkpoints-{nproc}"),
            "optimizer": {"warmup_steps": 5},
            # both alike (auto measures bf16 in one process only)
            "runtime": {"num_threads": threads, "precision": precision, "param_dtype": param_dtype},
            "model": {
                "hidden_size": 256,
                "intermediate_size": 688,
                "num_hidden_layers": 4,
                "num_attention_heads": 4,
            },
            "batching": {"mode": "packed", "micro_batch_size": 8, "gradient_accumulation_steps": accum},
            "distributed": {"nproc_per_node": nproc, "monitor_interval_s": 0.2, "start_method": start_method},
        }
    )


def timed(result) -> float:
    windows = result.history[1:] or result.history
    return statistics.median(record["real_tokens_per_s"] for record in windows)


def paper(world: int, bandwidth_gb_s: float, mfu: float, peak_tflops: float) -> None:
    """Gradient all-reduce bytes per GPU per step (ring) vs compute time, for two model sizes."""
    print(
        f"\nOn paper: {world} GPUs, ring all-reduce of fp32 gradients at {bandwidth_gb_s:.0f} GB/s bus "
        f"bandwidth, compute at {mfu:.0%} MFU of {peak_tflops:.0f} TFLOP/s"
    )
    print(
        "| model | parameters | tokens / GPU / step | bytes sent / GPU / step | all-reduce time | compute "
        "time | communication / compute |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, n_params, tokens in (("0.73 B (gpu_speed.py)", 0.73e9, 16 * 2048), ("7 B", 7.0e9, 8 * 4096)):
        grad_bytes = 4 * n_params  # fp32: fp32 weights' gradients, or bf16 ones reduced in fp32 into masters
        sent = 2 * (world - 1) / world * grad_bytes
        comm_s = sent / (bandwidth_gb_s * 1e9)
        compute_s = 6 * n_params * tokens / (mfu * peak_tflops * 1e12)
        print(
            f"| {name} | {n_params / 1e9:.2f} B | {tokens:,} | {sent / 1e9:.2f} GB | {comm_s * 1e3:.1f} ms | "
            f"{compute_s * 1e3:.0f} ms | {comm_s / compute_s:.1%} |"
        )
    print(
        "DDP overlaps the bucketed all-reduce with the backward pass, so while communication / compute stays "
        "well under 1 the expected speed-up is close to the number of GPUs."
    )


def launch(job_params, tokenizer, data, workdir: Path, world: int):
    build = functools.partial(
        build_model, job_params.model, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa"
    )
    job = TrainJob(job_params, MAX_LENGTH, data, None, tokenizer, str(workdir / "model"))
    return launch_workers(
        job,
        world,
        build_model=build,
        monitor_interval_s=0.2,
        start_method=job_params.distributed.start_method,
    )


def start_ab(args, tokenizer, data, cores: int) -> None:
    """``--launches`` N-process runs by each start method in this process, alternating: their start-ups."""
    threads = max(1, cores // args.world)
    start_ups: dict[str, list[float]] = {"spawn": [], "forkserver": []}
    losses: dict[str, list[float]] = {"spawn": [], "forkserver": []}
    with tempfile.TemporaryDirectory() as tmp:
        for launch_index in range(args.launches):
            for method in start_ups:
                workdir = Path(tmp) / f"{method}-{launch_index}"
                job_params = params(
                    workdir, steps=args.steps, accum=args.accum, nproc=args.world, threads=threads,
                    start_method=method,
                )  # fmt: skip
                start = time.perf_counter()
                run = launch(job_params, tokenizer, data, workdir, args.world)
                start_ups[method].append(time.perf_counter() - start - run.summary["wall_time_s"])
                losses[method].append(run.history[-1]["loss"])
    print(
        f"{args.launches} launches of {args.world} processes by each start method in one process, "
        f"alternating; {args.steps} steps each, {threads} threads a worker"
    )
    print("| start method | start-up of each launch | median after the first |")
    print("| --- | --- | ---: |")
    medians = {}
    for method, times in start_ups.items():
        medians[method] = statistics.median(times[1:] or times)
        print(f"| {method} | {' / '.join(f'{t:.2f} s' for t in times)} | {medians[method]:.2f} s |")
    print(
        f"ratio spawn / forkserver start-up after the first launch: "
        f"{medians['spawn'] / medians['forkserver']:.1f}x; the same final losses: "
        f"{losses['spawn'] == losses['forkserver']}"
    )


def weights_ab(args, tokenizer, data, cores: int) -> None:
    """N processes at bf16 precision, bf16 weights with fp32 masters against fp32 weights under autocast."""
    threads = max(1, cores // args.world)
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for param_dtype in ("bf16", "fp32"):
            workdir = Path(tmp) / param_dtype
            job_params = params(
                workdir,
                steps=args.steps,
                accum=args.accum,
                nproc=args.world,
                threads=threads,
                precision="bf16",
                param_dtype=param_dtype,
            )
            runs[param_dtype] = launch(job_params, tokenizer, data, workdir, args.world)
    print(f"{args.world} processes (DDP, gloo), {threads} threads each, accumulation {args.accum}, bf16")
    print("| weights | real tokens/s (timed steps) | param_dtype (summary) |")
    print("| --- | ---: | --- |")
    for name, run in runs.items():
        print(f"| {name} | {timed(run):,.0f} | {run.summary['param_dtype']} |")
    curves = [np.array([r["loss"] for r in run.history]) for run in runs.values()]
    apart = float(np.max(np.abs(curves[0] - curves[1]) / curves[1]))
    print(
        f"ratio bf16 / fp32 weights: {timed(runs['bf16']) / timed(runs['fp32']):.2f}x; largest relative "
        f"loss difference {apart:.1e} (two bf16 computations)"
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--accum", type=int, default=1, help="accumulation per process in the N-process run")
    parser.add_argument("--rows", type=int, default=6000)
    parser.add_argument("--paper", action="store_true")
    parser.add_argument("--weights-ab", action="store_true", help="bf16 against fp32 weights, N processes")
    parser.add_argument("--start-ab", action="store_true", help="spawn against forkserver launches")
    parser.add_argument("--launches", type=int, default=4, help="launches by each start method (--start-ab)")
    parser.add_argument(
        "--bandwidth", type=float, default=150.0, help="GB/s bus bandwidth per GPU (all-reduce)"
    )
    parser.add_argument("--mfu", type=float, default=0.4)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    args = parser.parse_args(argv)
    cores = usable_cpu_count()
    tokenizer, data = prepare(args.rows)
    print(f"machine: {cores} usable cores; {len(data):,} samples, packed rows of {MAX_LENGTH}")
    if args.weights_ab:
        weights_ab(args, tokenizer, data, cores)
        return
    if args.start_ab:
        start_ab(args, tokenizer, data, cores)
        return
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        one_params = params(workdir, steps=args.steps, accum=args.accum * args.world, nproc=1, threads=cores)
        start = time.perf_counter()
        one = run_job(TrainJob(one_params, MAX_LENGTH, data, None, tokenizer, str(workdir / "model")))
        one_wall = time.perf_counter() - start
        many_params = params(
            workdir, steps=args.steps, accum=args.accum, nproc=args.world, threads=max(1, cores // args.world)
        )
        build = functools.partial(
            build_model, many_params.model, tokenizer, max_length=MAX_LENGTH, attn_implementation="sdpa"
        )
        start = time.perf_counter()
        many = launch_workers(
            TrainJob(many_params, MAX_LENGTH, data, None, tokenizer, str(workdir / "model")),
            args.world,
            build_model=build,
            monitor_interval_s=0.2,
            start_method=many_params.distributed.start_method,
        )
        many_wall = time.perf_counter() - start
    losses_one = [r["loss"] for r in one.history]
    losses_many = [r["loss"] for r in many.history]
    agree = float(np.max(np.abs(np.array(losses_one) - np.array(losses_many)) / np.array(losses_one)))
    one_tps, many_tps = timed(one), timed(many)
    print(f"effective batch {one.summary['effective_batch']} packed rows, {args.steps} steps")
    print("| contender | real tokens/s (timed steps) | wall incl. start-up | start-up |")
    print("| --- | --- | --- | --- |")
    print(
        f"| 1 process, {cores} threads, accumulation {args.accum * args.world} | {one_tps:,.0f} | "
        f"{one_wall:.1f} s | {one_wall - one.summary['wall_time_s']:.1f} s |"
    )
    print(
        f"| {args.world} processes (DDP, gloo), {max(1, cores // args.world)} threads each, accumulation "
        f"{args.accum} | {many_tps:,.0f} | {many_wall:.1f} s | "
        f"{many_wall - many.summary['wall_time_s']:.1f} s |"
    )
    print(
        f"ratio {args.world} processes / 1 process: {many_tps / one_tps:.2f}x; largest relative loss "
        f"difference {agree:.1e}"
    )
    if args.paper:
        paper(4, args.bandwidth, args.mfu, args.peak_tflops)


if __name__ == "__main__":
    main()
