"""Benchmark: split + tokenize 1,000,000 short texts, fastlm against the usual ``datasets.map``.

Target (from the issue): with an existing tokenizer, the split pipeline's work on 1,000,000 short
texts (mean about 40 characters) takes at most 40 s wall end to end on 2 CPU cores (load, clean,
dedup, split, tokenize, write) with a peak RSS of at most 3 GB. The usual Hugging Face approach
(``Dataset.from_parquet`` -> ``.filter`` -> ``.map(tokenizer, batched=True, num_proc=2)`` ->
``save_to_disk``) is measured in the same run, and both figures and their ratio are printed.
Nothing is asserted: the script prints PASS/FAIL, it is not a timed test.

    python benchmarks/split_speed.py                  # 1,000,000 rows, temporary workdir
    python benchmarks/split_speed.py --rows 200000 --workdir /tmp/bench --keep

Steps:

1. Not timed: generate the texts (``make_texts(N, seed=0, profile="short")``), make them mostly
   distinct (see ``make_distinct``), write them to ``input.parquet`` (one column, ``text``); train a
   byte-level BPE (vocab 8000) on the first 200,000 with ``train_bpe_tokenizer`` and
   ``save_pretrained`` it into ``tokenizer/`` ("with an existing tokenizer").
2. Timed, fastlm: a fresh Python process (so that its peak RSS is the split job's alone) runs
   ``read_text_table`` -> ``clean_corpus`` -> ``split_corpus`` -> ``AutoTokenizer.from_pretrained``
   -> ``tokenize_corpus`` -> ``report_split`` and writes the outputs with the dataset classes and
   save arguments of ``conf/base/catalog.yml`` (``AtomicArrowDataset``, ``pandas.ParquetDataset``,
   ``json.JSONDataset``, ``pandas.CSVDataset``). Parameters: ``conf/base/parameters_split.yml``
   with ``tokenizer.source`` set to the saved tokenizer directory.
3. Timed, peer: another fresh process runs the usual ``datasets`` code (see ``run_peer``), with
   its cache in the workdir (emptied before the run, ``load_from_cache_file=False``).

"Wall" is the child process's wall clock as seen by this script: interpreter start, imports, every
stage and exit. Memory: ``ru_maxrss`` of the child itself (RUSAGE_SELF) and of its largest reaped
worker (RUSAGE_CHILDREN), plus the peak PSS (proportional set size: shared pages split between the
processes that share them) of the whole process tree, sampled every 0.2 s from /proc. The memory
target counts as met when both ``ru_maxrss`` (self) and the sampled tree PSS are at most 3 GB.

Network: HF_HUB_OFFLINE=1, HF_DATASETS_OFFLINE=1, TRANSFORMERS_OFFLINE=1, DO_NOT_TRACK=true and
HF_HUB_DISABLE_TELEMETRY=1 are set before anything is imported; everything is read from the workdir.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from importlib import metadata
from pathlib import Path

from contender_process import OFFLINE_ENV  # sibling modules: scripts run from benchmarks/
from cpu_usage import busy_cpu_s, children_cpu_s, own_and_children_cpu_s

# demo_data: the demo-data generators
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

os.environ.update(OFFLINE_ENV)

REPO = Path(__file__).resolve().parents[1]
TARGET_WALL_S = 40.0
TARGET_RSS_BYTES = 3 * 1000**3  # 3 GB
TOKENIZER_TRAIN_ROWS = 200_000
VOCAB_SIZE = 8000
MAX_LENGTH = 320  # conf/base/parameters_split.yml: split.max_length
PEER_NUM_PROC = 2


# --------------------------------------------------------------------------------------------------
# Input (not timed)
# --------------------------------------------------------------------------------------------------


def make_distinct(texts: list[str]) -> tuple[list[str], int]:
    """Make repeated texts distinct, deterministically, keeping the length distribution.

    At 1M rows ``profile="short"`` repeats about 40% of its texts (its word lists run out). Each
    repeat (second or later occurrence of a text) is replaced by a splice of two repeats of the
    same script (Hangul or not): the first ``len(words) // 2`` words of the row, then the last
    ``len(other) - len(other) // 2`` words of another repeat ``shift`` places further on in the list
    of repeats, ``shift`` tried in (1, 7, 31, 127, 509) until the result is new. Splicing two short
    texts keeps the mean length (both halves come from texts of the same kind of length), no
    characters are invented, and Korean and English do not mix. The few rows whose five candidates
    were all taken keep the last candidate, so a small share of duplicates remains for the dedup
    stage to drop. Returns the texts and the number of rows replaced.
    """
    seen: set[str] = set()
    repeats: list[int] = []
    for index, text in enumerate(texts):
        if text in seen:
            repeats.append(index)
        else:
            seen.add(text)
    out = list(texts)
    for korean in (True, False):
        rows = [index for index in repeats if _has_hangul(texts[index]) == korean]
        for position, index in enumerate(rows):
            head = texts[index].split(" ")
            for shift in (1, 7, 31, 127, 509):
                tail = texts[rows[(position + shift) % len(rows)]].split(" ")
                spliced = " ".join(head[: len(head) // 2] + tail[len(tail) // 2 :])
                if spliced not in seen:
                    break
            seen.add(spliced)
            out[index] = spliced
    return out, len(repeats)


def _has_hangul(text: str) -> bool:
    return any("\uac00" <= char <= "\ud7a3" for char in text)


def prepare(workdir: Path, rows: int) -> dict:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from demo_data.texts import make_texts

    from fastlm.corpus.tokenizer_source import train_bpe_tokenizer

    start = time.perf_counter()
    raw = make_texts(rows, seed=0, profile="short")
    texts, replaced = make_distinct(raw)
    generated = time.perf_counter() - start
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    info = {
        "rows": len(texts),
        "unique_before": len(set(raw)) / max(len(raw), 1),
        "unique": len(set(texts)) / max(len(texts), 1),
        "replaced": replaced,
        "mean_chars_before": float(np.mean([len(t) for t in raw])) if raw else 0.0,
        "mean_chars": float(lengths.mean()) if len(texts) else 0.0,
        "median_chars": float(np.median(lengths)) if len(texts) else 0.0,
        "max_chars": int(lengths.max()) if len(texts) else 0,
        "generate_s": generated,
    }
    del raw
    start = time.perf_counter()
    path = workdir / "input.parquet"
    pq.write_table(pa.table({"text": pa.array(texts, type=pa.string())}), path)
    info["parquet_bytes"] = path.stat().st_size
    info["write_s"] = time.perf_counter() - start

    start = time.perf_counter()
    tokenizer = train_bpe_tokenizer(
        texts[:TOKENIZER_TRAIN_ROWS], vocab_size=VOCAB_SIZE, min_frequency=2, model_max_length=MAX_LENGTH
    )
    tokenizer.save_pretrained(str(workdir / "tokenizer"))
    info["tokenizer_s"] = time.perf_counter() - start
    info["vocab"] = len(tokenizer)
    return info


# --------------------------------------------------------------------------------------------------
# Children (timed)
# --------------------------------------------------------------------------------------------------


class Stages:
    """Wall seconds and CPU seconds (this process and its reaped workers) per stage, in order."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self._last = time.perf_counter()
        self._last_cpu = own_and_children_cpu_s()

    def mark(self, name: str) -> None:
        now, cpu = time.perf_counter(), own_and_children_cpu_s()
        self.seconds[name] = now - self._last
        self.cpu[name] = cpu - self._last_cpu
        self._last, self._last_cpu = now, cpu


def _rusage() -> dict:
    # Linux: ru_maxrss is in KiB. RUSAGE_CHILDREN is the largest reaped child, not a sum.
    return {
        "maxrss_self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "maxrss_children": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
    }


def split_params(tokenizer_dir: Path) -> dict:
    import yaml

    params = yaml.safe_load((REPO / "conf" / "base" / "parameters_split.yml").read_text())["split"]
    params["tokenizer"]["source"] = str(tokenizer_dir)
    return params


def run_fastlm(workdir: Path, stages: Stages) -> dict:
    from fastlm.corpus.readers import read_text_table
    from fastlm.pipelines.split.nodes import clean_corpus, report_split, split_corpus, tokenize_corpus

    stages.mark("import fastlm nodes")
    from transformers import AutoTokenizer

    stages.mark("import transformers")
    from kedro_datasets.json import JSONDataset
    from kedro_datasets.pandas import CSVDataset, ParquetDataset

    from fastlm.datasets import AtomicArrowDataset

    stages.mark("import catalog datasets")
    params = split_params(workdir / "tokenizer")
    out = workdir / "fastlm_out"

    raw = read_text_table(workdir / "input.parquet")
    stages.mark("load")
    clean, cleaning_counts = clean_corpus(raw, params)
    del raw
    stages.mark("clean+dedup")
    splits, split_counts = split_corpus(clean, cleaning_counts, params)
    del clean
    stages.mark("split")
    tokenizer = AutoTokenizer.from_pretrained(params["tokenizer"]["source"])
    stages.mark("load_tokenizer")
    tokenized, fingerprint, length_stats = tokenize_corpus(splits, tokenizer, params)
    stages.mark("tokenize")
    report, summary = report_split(split_counts, length_stats, fingerprint)
    stages.mark("report")
    AtomicArrowDataset(path=str(out / "tokenized_corpus")).save(tokenized)
    stages.mark("write_arrow")
    ParquetDataset(filepath=str(out / "corpus_splits.parquet")).save(splits)
    stages.mark("write_splits_parquet")
    JSONDataset(filepath=str(out / "tokenized_corpus_fingerprint.json"), save_args={"indent": 2}).save(
        fingerprint
    )
    JSONDataset(filepath=str(out / "split_report.json"), save_args={"indent": 2, "ensure_ascii": False}).save(
        report
    )
    CSVDataset(filepath=str(out / "split_summary.csv"), save_args={"index": False}).save(summary)
    stages.mark("write_reports")

    import pyarrow.compute as pc

    return {
        "rows_out": {name: part.num_rows for name, part in tokenized.items()},
        "tokens": int(sum(pc.sum(part.data.column("length")).as_py() for part in tokenized.values())),
        "dropped": cleaning_counts["dropped"],
        "num_proc": params["num_proc"],
    }


def run_peer(workdir: Path, stages: Stages) -> dict:
    import datasets

    stages.mark("import datasets")
    from transformers import AutoTokenizer

    stages.mark("import transformers")
    datasets.disable_progress_bars()
    cache = workdir / "hf_cache"

    # The usual code, as in the Hugging Face course and the run_clm.py examples.
    data = datasets.Dataset.from_parquet(str(workdir / "input.parquet"), cache_dir=str(cache))
    stages.mark("load")
    data = data.filter(
        lambda batch: [bool(text and text.strip()) for text in batch["text"]],
        batched=True,
        load_from_cache_file=False,
    )
    stages.mark("filter")
    tok = AutoTokenizer.from_pretrained(str(workdir / "tokenizer"))
    stages.mark("load_tokenizer")
    data = data.map(
        lambda batch: tok(batch["text"], truncation=True, max_length=MAX_LENGTH),
        batched=True,
        num_proc=PEER_NUM_PROC,
        remove_columns=["text"],
        load_from_cache_file=False,
    )
    stages.mark("tokenize")
    data.save_to_disk(str(workdir / "peer_out"))
    stages.mark("write_arrow")

    import pyarrow.compute as pc

    return {
        "rows_out": {"all": data.num_rows},
        "tokens": int(pc.sum(pc.list_value_length(data.data.column("input_ids"))).as_py()),
        "num_proc": PEER_NUM_PROC,
    }


def child_main(kind: str, workdir: Path, result_path: Path) -> None:
    stages = Stages()
    started = time.perf_counter()
    info = (run_fastlm if kind == "fastlm" else run_peer)(workdir, stages)
    info.update(
        stages=stages.seconds,
        stages_cpu=stages.cpu,
        stages_total_s=time.perf_counter() - started,
        **_rusage(),
    )
    result_path.write_text(json.dumps(info))


# --------------------------------------------------------------------------------------------------
# Parent: run a child, sample its memory
# --------------------------------------------------------------------------------------------------


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as handle:
                    todo.extend(int(child) for child in handle.read().split())
        except OSError:
            continue
    return pids


def _memory(pid: int) -> tuple[int, int]:
    """(PSS, RSS) in bytes of ``pid`` and its descendants."""
    pss = rss = 0
    for member in _tree(pid):
        try:
            with open(f"/proc/{member}/smaps_rollup") as handle:
                for line in handle:
                    if line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
                    elif line.startswith("Rss:"):
                        rss += int(line.split()[1]) * 1024
        except (OSError, ValueError):
            continue
    return pss, rss


def run_child(kind: str, workdir: Path) -> dict:
    result_path = workdir / f"result_{kind}.json"
    result_path.unlink(missing_ok=True)
    env = {**os.environ, "HF_DATASETS_CACHE": str(workdir / "hf_cache"), "HF_HOME": str(workdir / "hf_home")}
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        kind,
        "--workdir",
        str(workdir),
        "--result",
        str(result_path),
    ]
    peak = {"pss": 0, "rss": 0}
    cpu_before, busy_before, own_before = children_cpu_s(), busy_cpu_s(), time.process_time()
    start = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            pss, rss = _memory(process.pid)
            peak["pss"] = max(peak["pss"], pss)
            peak["rss"] = max(peak["rss"], rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output = process.communicate()[0]
    wall = time.perf_counter() - start
    own_cpu, busy = children_cpu_s() - cpu_before, busy_cpu_s() - busy_before
    busy -= time.process_time() - own_before  # this script's own sampling is not "other processes"
    done.set()
    sampler.join()
    if process.returncode != 0 or not result_path.exists():
        sys.exit(f"{kind} child failed (exit {process.returncode}):\n{output}")
    result = json.loads(result_path.read_text())
    result.update(
        wall_s=wall,
        peak_tree_pss=peak["pss"],
        peak_tree_rss_sum=peak["rss"],
        output=output.strip(),
        cpu_s=own_cpu,
        foreign_cores=max(busy - own_cpu, 0.0) / wall,
    )
    return result


# --------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------


def machine() -> dict:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        memory = next(
            line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal")
        )
        memory_gb = int(memory.split()[1]) * 1024 / 1000**3
    except (OSError, StopIteration):
        memory_gb = float("nan")

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    packages = ("torch", "tokenizers", "transformers", "datasets", "pandas", "pyarrow", "numpy", "kedro")
    return {
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu": model,
        "memory_gb": memory_gb,
        "os": platform.platform(),
        "python": platform.python_version(),
        **{name: version(name) for name in packages},
    }


def _gb(value: int) -> str:
    return f"{value / 1000**3:.2f} GB"


def print_run(title: str, result: dict, rows: int) -> None:
    print(f"\n{title}")
    print(f"  {'stage':<24} {'wall':>8}   {'CPU':>7} (this process + its workers)")
    for name, seconds in result["stages"].items():
        print(f"  {name:<24} {seconds:8.2f} s {result['stages_cpu'][name]:7.2f} s")
    print(f"  {'stages total':<24} {result['stages_total_s']:8.2f} s")
    print(f"  {'interpreter start+exit':<24} {result['wall_s'] - result['stages_total_s']:8.2f} s")
    print(f"  {'process wall':<24} {result['wall_s']:8.2f} s   ({rows / result['wall_s']:,.0f} rows/s)")
    print(
        f"  CPU {result['cpu_s']:.1f} s ({result['cpu_s'] / result['wall_s']:.2f} cores busy on average); "
        f"other processes used {result['foreign_cores']:.2f} cores meanwhile"
    )
    print(f"  rows out {result['rows_out']}, tokens {result['tokens']:,}, num_proc {result['num_proc']}")
    print(
        f"  ru_maxrss self {_gb(result['maxrss_self'])}, largest worker {_gb(result['maxrss_children'])}; "
        f"sampled tree peak PSS {_gb(result['peak_tree_pss'])} (RSS sum {_gb(result['peak_tree_rss_sum'])})"
    )
    if result["output"]:
        lines = result["output"].splitlines()
        print("  child output:" + "".join(f"\n    {line}" for line in lines[-10:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="texts to generate (default 1,000,000)")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="working folder (default: a new temporary one)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the workdir and what was written there")
    parser.add_argument("--child", choices=("fastlm", "peer"), help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        child_main(args.child, args.workdir, args.result)
        return

    created = args.workdir is None or not args.workdir.exists()
    workdir = Path(tempfile.mkdtemp(prefix="fastlm-split-bench-")) if args.workdir is None else args.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    workdir = workdir.resolve()
    try:
        report(workdir, args.rows)
    finally:
        if not args.keep:
            if created:
                shutil.rmtree(workdir, ignore_errors=True)
            else:
                for name in (
                    "input.parquet",
                    "tokenizer",
                    "fastlm_out",
                    "peer_out",
                    "hf_cache",
                    "hf_home",
                    "result_fastlm.json",
                    "result_peer.json",
                ):
                    target = workdir / name
                    shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(
                        missing_ok=True
                    )


def report(workdir: Path, rows: int) -> None:
    host = machine()
    print("split benchmark: fastlm split pipeline vs datasets.map(num_proc=2)")
    print(f"machine: {host['nproc']} cores ({host['cpu']}), {host['memory_gb']:.1f} GB RAM, {host['os']}")
    print(
        "versions: "
        + ", ".join(
            f"{name} {host[name]}"
            for name in (
                "python",
                "torch",
                "tokenizers",
                "transformers",
                "datasets",
                "pandas",
                "pyarrow",
                "numpy",
                "kedro",
            )
        )
    )
    print(f"workdir: {workdir}")

    info = prepare(workdir, rows)
    print(
        f"\ninput (not timed): {info['rows']:,} texts; unique {info['unique']:.2%} "
        f"(make_texts alone {info['unique_before']:.2%}; {info['replaced']:,} repeats spliced); "
        f"mean {info['mean_chars']:.1f} chars (make_texts alone {info['mean_chars_before']:.1f}), "
        f"median {info['median_chars']:.0f}, max {info['max_chars']}; parquet "
        f"{info['parquet_bytes'] / 1e6:.1f} MB"
    )
    print(
        f"  generate {info['generate_s']:.1f} s, write {info['write_s']:.1f} s, "
        f"train+save tokenizer (vocab {info['vocab']}, {TOKENIZER_TRAIN_ROWS:,} texts) "
        f"{info['tokenizer_s']:.1f} s"
    )

    for name in ("fastlm_out", "peer_out", "hf_cache", "hf_home"):
        shutil.rmtree(workdir / name, ignore_errors=True)
    fastlm = run_child("fastlm", workdir)
    print_run(
        "fastlm (fresh process): read_text_table, clean_corpus, split_corpus, tokenize_corpus, "
        "report_split, catalog writes",
        fastlm,
        info["rows"],
    )
    peer = run_child("peer", workdir)
    print_run(
        "peer (fresh process): Dataset.from_parquet, .filter, .map(tok, batched, num_proc=2), save_to_disk",
        peer,
        info["rows"],
    )

    ratio = peer["wall_s"] / fastlm["wall_s"]
    tok_ratio = peer["stages"]["tokenize"] / fastlm["stages"]["tokenize"]
    wall_ok = fastlm["wall_s"] <= TARGET_WALL_S
    rss_ok = max(fastlm["maxrss_self"], fastlm["peak_tree_pss"]) <= TARGET_RSS_BYTES
    print("\nsummary")
    print(f"  rows in                 {info['rows']:,}")
    print(
        f"  fastlm wall             {fastlm['wall_s']:.2f} s  ({info['rows'] / fastlm['wall_s']:,.0f} rows/s)"
    )
    print(f"  peer wall               {peer['wall_s']:.2f} s  ({info['rows'] / peer['wall_s']:,.0f} rows/s)")
    print(
        f"  ratio peer/fastlm       {ratio:.2f}x end to end; {tok_ratio:.2f}x tokenization only "
        f"(peer .map {peer['stages']['tokenize']:.2f} s / fastlm tokenize_corpus "
        f"{fastlm['stages']['tokenize']:.2f} s)"
    )
    print(
        f"  fastlm peak memory      ru_maxrss {_gb(fastlm['maxrss_self'])} (largest worker "
        f"{_gb(fastlm['maxrss_children'])}), tree PSS {_gb(fastlm['peak_tree_pss'])}"
    )
    foreign = max(fastlm["foreign_cores"], peer["foreign_cores"])
    if foreign > 0.1:
        print(
            f"  WARNING                 other processes kept {foreign:.2f} cores busy during a timed run: "
            "the figures are too slow; rerun on a quiet machine"
        )
    print(
        f"  target wall <= {TARGET_WALL_S:.0f} s       {'PASS' if wall_ok else 'FAIL'} "
        f"({fastlm['wall_s']:.2f} s)"
    )
    print(
        f"  target peak <= 3 GB      {'PASS' if rss_ok else 'FAIL'} "
        f"({_gb(max(fastlm['maxrss_self'], fastlm['peak_tree_pss']))})"
    )


if __name__ == "__main__":
    main()
