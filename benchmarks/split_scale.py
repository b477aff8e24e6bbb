"""Benchmark: does the split scale to millions of short Korean and English texts?

Builds a synthetic corpus with the statistics of real review-style corpora, runs the split pipeline's
nodes on it stage by stage in a fresh process (the default parameters of ``conf/base/parameters_split.yml``:
the byte-level BPE trained on the train split), and prints the wall seconds, rows/s and peak RSS of each
stage, then checks the result against an independent count. Nothing is asserted about speed: the script
prints the figures (docs/benchmarks.md records them), not PASS/FAIL.

    OMP_NUM_THREADS=1 python benchmarks/split_scale.py --rows 200000 --workdir /tmp/splitscale
    OMP_NUM_THREADS=1 python benchmarks/split_scale.py --rows 1000000 --workdir /tmp/splitscale --format csv

The corpus (``make_corpus``, seeded, built once per workdir and row count):

* lengths: log-normal, median about 90 characters, a long tail (1 % of the rows 300-3,000 characters,
  0.05 % 3,000-30,000);
* script: 45 % Korean (Hangul words), 35 % English, 20 % both mixed in one text;
* 4 % exact repeats of an earlier row; 1 % repeats with the ends padded with white space (the split's
  cleaning strips them: also duplicates); 1 % near-duplicates that differ in case or inner white space
  (distinct texts: kept); 0.1 % empty or blank rows.

Stages, each timed in the child process: ``read`` (the catalog's ``TextCorpusDataset``), ``clean+dedup``
(``clean_corpus``), ``split`` (``split_corpus``), ``train_bpe`` (``build_tokenizer``), ``tokenize``
(``tokenize_corpus``), ``report`` (``report_split``) and ``write`` (the catalog's datasets of the tokenized
corpus, splits parquet, tokenizer and reports). "peak RSS" is ``VmHWM`` after the stage (the process's peak
so far), "RSS now" its resident set when the stage ends, "workers" the largest forked tokenizer worker's
``ru_maxrss``; "CPU s" counts this process and its workers.

Checks (after the run, not timed): the split report's dropped duplicates and blanks equal an independent
count of the corpus (NFC + strip, then Python's ``set``), the report's raw rows are the corpus's rows
("unread" counts rows the reader never returned: a one-column CSV line of spaces alone, once skipped by
pandas), every kept text appears once, and with ``--append`` a second run on the corpus plus 10 % new rows
puts every earlier text in the same split.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
import unicodedata
from importlib import metadata
from pathlib import Path

from cpu_usage import own_and_children_cpu_s  # sibling module: scripts run from benchmarks/

REPO = Path(__file__).resolve().parents[1]
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "true",
}
os.environ.update(OFFLINE)

EXACT_SHARE = 0.04
PADDED_SHARE = 0.01
NEAR_SHARE = 0.01
BLANK_SHARE = 0.001
SYLLABLES = [chr(code) for code in range(0xAC00, 0xD7A4, 7)]  # 1,600 Hangul syllables
ENGLISH = (
    "the a good great bad product delivery fast slow quality price size color fit love like would buy again "
    "not really very too small large cheap works broke after days week month recommend return refund box "
    "packaging sound battery screen phone case cable charger shoes shirt bag coffee taste smell fresh "
    "service seller customer happy disappointed okay perfect exactly as described arrived late early "
    "wife husband kid gift worth money star stars five one two three love-it meh wow thanks"
).split()


# --------------------------------------------------------------------------------------------------
# Corpus (not timed)
# --------------------------------------------------------------------------------------------------


def make_corpus(rows: int, seed: int = 0) -> list[str]:
    """``rows`` texts with the statistics of the module docstring (deterministic for a seed)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    korean_words = ["".join(rng.choice(SYLLABLES, size=k)) for k in rng.integers(1, 5, size=6000)]
    english_words = ENGLISH + [
        "".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), size=k))
        for k in rng.integers(3, 10, size=4000)
    ]
    lengths = np.exp(rng.normal(np.log(90), 0.55, size=rows)).astype(np.int64)
    tail = rng.random(rows)
    lengths[tail < 0.01] = rng.integers(300, 3000, size=int((tail < 0.01).sum()))
    lengths[tail < 0.0005] = rng.integers(3000, 30000, size=int((tail < 0.0005).sum()))
    lengths = np.maximum(lengths, 4)
    script = rng.random(rows)
    word_pick = rng.random(int(lengths.sum() // 2) + 64)
    texts: list[str] = []
    cursor = 0
    for length, kind in zip(lengths.tolist(), script.tolist(), strict=True):
        pool = korean_words if kind < 0.45 else english_words if kind < 0.80 else None
        parts, size = [], 0
        while size < length:
            pick = word_pick[cursor % len(word_pick)]
            cursor += 1
            words = pool if pool is not None else (korean_words if pick * 7 % 1 < 0.5 else english_words)
            word = words[int(pick**3 * len(words))]  # skewed: a few words are common (Zipf-like)
            parts.append(word)
            size += len(word) + 1
        text = " ".join(parts)
        if kind >= 0.45 and kind < 0.80:
            text = text[:1].upper() + text[1:] + "."
        texts.append(text)
    # Repeats of earlier rows: exact, padded at the ends (stripped: duplicates), or near (kept)
    kind = rng.random(rows)
    source = (rng.random(rows) * np.arange(rows)).astype(np.int64)
    for index in np.flatnonzero((kind < EXACT_SHARE) & (np.arange(rows) > 0)).tolist():
        texts[index] = texts[source[index]]
    padded = (kind >= EXACT_SHARE) & (kind < EXACT_SHARE + PADDED_SHARE) & (np.arange(rows) > 0)
    for index in np.flatnonzero(padded).tolist():
        texts[index] = ("  " if index % 2 else "\t") + texts[source[index]] + (" \n" if index % 3 else "")
    near = (kind >= EXACT_SHARE + PADDED_SHARE) & (kind < EXACT_SHARE + PADDED_SHARE + NEAR_SHARE)
    for index in np.flatnonzero(near & (np.arange(rows) > 0)).tolist():
        text = texts[source[index]]
        texts[index] = text.upper() if index % 2 else text.replace(" ", "  ", 1)
    blank = kind >= 1 - BLANK_SHARE
    for index in np.flatnonzero(blank).tolist():
        texts[index] = "" if index % 2 else "   "
    return texts


def write_corpus(texts: list[str], path: Path) -> None:
    if path.suffix == ".jsonl":
        with path.open("w", encoding="utf-8") as handle:
            for text in texts:
                handle.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    else:
        import pandas as pd

        pd.DataFrame({"text": texts}).to_csv(path, index=False)


def independent_counts(texts: list[str]) -> dict:
    """What the split's cleaning should drop, counted apart from it: blank rows, and repeats of a text after
    NFC and strip."""
    normalized = [unicodedata.normalize("NFC", text).strip() for text in texts]
    usable = [text for text in normalized if text]
    return {
        "unread": 0,
        "blank": len(texts) - len(usable),
        "duplicate": len(usable) - len(set(usable)),
        "kept": len(set(usable)),
    }


# --------------------------------------------------------------------------------------------------
# Child (timed)
# --------------------------------------------------------------------------------------------------


def _memory(field: str) -> int:
    """``VmRSS`` (resident now) or ``VmHWM`` (its peak: unlike ``ru_maxrss``, not inherited across exec)."""
    with open("/proc/self/status") as handle:
        line = next(line for line in handle if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024


def child(corpus: Path, out: Path, result: Path, profile: Path | None) -> None:
    stages: list[dict] = []
    last = [time.perf_counter(), own_and_children_cpu_s()]

    def mark(name: str, rows: int) -> None:
        now, cpu = time.perf_counter(), own_and_children_cpu_s()
        stages.append(
            {
                "stage": name,
                "seconds": now - last[0],
                "cpu": cpu - last[1],
                "rows": rows,
                "peak_rss": _memory("VmHWM"),
                "rss_now": _memory("VmRSS"),
                "workers_peak_rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
            }
        )
        last[0], last[1] = now, cpu

    import yaml
    from kedro_datasets.pandas import CSVDataset, ParquetDataset

    from fastlm.datasets import AtomicArrowDataset, PretrainedTokenizerDataset, TextCorpusDataset
    from fastlm.datasets.atomic_file import AtomicJSONDataset
    from fastlm.pipelines.split import nodes

    params = yaml.safe_load((REPO / "conf" / "base" / "parameters_split.yml").read_text())["split"]
    mark("import", 0)
    profiler = None
    if profile is not None:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    raw = TextCorpusDataset(filepath=str(corpus)).load()
    rows = len(raw)
    mark("read", rows)
    clean, cleaning = nodes.clean_corpus(raw, params)
    del raw
    mark("clean+dedup", rows)
    splits, counts = nodes.split_corpus(clean, cleaning, params)
    del clean
    mark("split", len(splits))
    tokenizer = nodes.build_tokenizer(splits, params, counts)
    mark("train_bpe", min(len(splits), params["tokenizer"]["training_samples"]))
    tokenized, fingerprint, stats = nodes.tokenize_corpus(splits, tokenizer, params, counts)
    mark("tokenize", len(splits))
    report, summary = nodes.report_split(counts, stats, fingerprint)
    mark("report", len(splits))
    json_args = {"save_args": {"indent": 2, "ensure_ascii": False}}
    AtomicArrowDataset(path=str(out / "tokenized_corpus")).save(tokenized)
    ParquetDataset(filepath=str(out / "corpus_splits.parquet")).save(splits)
    PretrainedTokenizerDataset(filepath=str(out / "tokenizer")).save(tokenizer)
    AtomicJSONDataset(filepath=str(out / "tokenized_corpus_fingerprint.json"), **json_args).save(fingerprint)
    AtomicJSONDataset(filepath=str(out / "split_report.json"), **json_args).save(report)
    CSVDataset(filepath=str(out / "split_summary.csv"), save_args={"index": False}).save(summary)
    mark("write", len(splits))
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(str(profile))
    result.write_text(json.dumps({"stages": stages, "dropped": cleaning["dropped"]}))


# --------------------------------------------------------------------------------------------------
# Parent
# --------------------------------------------------------------------------------------------------


def run_child(corpus: Path, out: Path, profile: Path | None) -> dict:
    result = out.parent / f"{out.name}.result.json"
    command = [sys.executable, __file__, "--child", str(corpus), "--out", str(out), "--result", str(result)]
    if profile is not None:
        command += ["--profile-path", str(profile)]
    # the fastlm of this checkout, wherever the script is run from
    path = os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, "FASTLM_SRC": str(REPO / "src")}
    load = Path("/proc/loadavg").read_text().split()[0]
    start = time.perf_counter()
    subprocess.run(command, check=True, env=env)
    info = json.loads(result.read_text())
    info["wall"] = time.perf_counter() - start
    info["load"] = (load, Path("/proc/loadavg").read_text().split()[0])
    return info


def machine() -> str:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    cores = len(os.sched_getaffinity(0))
    versions = ", ".join(
        f"{name} {metadata.version(name)}"
        for name in ("tokenizers", "transformers", "datasets", "pandas", "pyarrow", "numpy", "kedro")
    )
    return f"{cores} cores ({model}), Python {platform.python_version()}; {versions}"


def print_run(info: dict) -> None:
    print(
        f"  {'stage':<12} {'wall s':>8} {'CPU s':>7} {'rows/s':>10} {'peak RSS':>9} "
        f"{'RSS now':>8} {'workers':>8}"
    )
    for stage in info["stages"]:
        rate = f"{stage['rows'] / stage['seconds']:,.0f}" if stage["rows"] and stage["seconds"] else "-"
        print(
            f"  {stage['stage']:<12} {stage['seconds']:8.2f} {stage['cpu']:7.2f} {rate:>10} "
            f"{stage['peak_rss'] / 1e9:8.2f}G "
            f"{stage['rss_now'] / 1e9:7.2f}G {stage['workers_peak_rss'] / 1e9:7.2f}G"
        )
    print(
        f"  process wall {info['wall']:.1f} s (interpreter start and exit included); load average "
        f"{info['load'][0]} before, {info['load'][1]} after (2 cores: above 2, others shared them)"
    )


def check(texts: list[str], info: dict, out: Path) -> dict:
    """The report's drops against the independent count; every kept text once."""
    import pyarrow.parquet as pq

    expected = independent_counts(texts)
    report = json.loads((out / "split_report.json").read_text(encoding="utf-8"))
    dropped = report["dropped"]
    kept = pq.read_table(out / "corpus_splits.parquet", columns=["text"]).column("text").to_pylist()
    found = {
        "unread": len(texts) - report["raw_rows"],  # rows the reader never returned (counted nowhere)
        "blank": dropped["missing"] + dropped["empty"] + dropped["whitespace_only"],
        "duplicate": dropped["duplicate"],
        "kept": report["kept_rows"],
    }
    ok = found == expected and len(set(kept)) == len(kept) == report["kept_rows"]
    print(
        f"  dedup check {'OK' if ok else 'MISMATCH'}: split report {found}, independent count {expected}, "
        f"{len(set(kept)):,} distinct of {len(kept):,} kept texts"
    )
    return {"ok": ok, **expected}


def same_splits(before: Path, after: Path) -> tuple[int, int]:
    """(earlier texts, of them in another split) between two runs' corpus_splits.parquet."""
    import pyarrow.parquet as pq

    first = pq.read_table(before / "corpus_splits.parquet", columns=["text", "split"]).to_pandas()
    second = pq.read_table(after / "corpus_splits.parquet", columns=["text", "split"]).to_pandas()
    merged = first.merge(second, on="text", how="left", suffixes=("_before", "_after"))
    moved = int((merged["split_before"].astype(str) != merged["split_after"].astype(str)).sum())
    return len(first), moved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/splitscale"))
    parser.add_argument("--format", choices=("jsonl", "csv"), default="jsonl")
    parser.add_argument("--profile", action="store_true", help="write a cProfile of the run to the workdir")
    parser.add_argument("--append", action="store_true", help="rerun on the corpus + 10 %% new rows")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--profile-path", dest="profile_path", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.out, args.result, args.profile_path)
        return

    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"machine: {machine()}")
    start = time.perf_counter()
    texts = make_corpus(args.rows)
    corpus = workdir / f"corpus_{args.rows}.{args.format}"
    if not corpus.exists():
        write_corpus(texts, corpus)
    lengths = sorted(map(len, texts))
    print(
        f"corpus: {len(texts):,} rows, {corpus.stat().st_size / 1e6:.0f} MB {args.format}; characters "
        f"median {lengths[len(lengths) // 2]}, p90 {lengths[len(lengths) * 9 // 10]}, "
        f"p99 {lengths[len(lengths) * 99 // 100]}, max {lengths[-1]} "
        f"(built in {time.perf_counter() - start:.0f} s)"
    )
    out = workdir / f"out_{args.rows}_{args.format}"
    info = run_child(corpus, out, workdir / f"profile_{args.rows}.prof" if args.profile else None)
    print_run(info)
    check(texts, info, out)
    if args.append:
        more = texts + make_corpus(args.rows // 10, seed=1)
        appended = workdir / f"corpus_{args.rows}_appended.{args.format}"
        write_corpus(more, appended)
        out_more = workdir / f"out_{args.rows}_{args.format}_appended"
        info_more = run_child(appended, out_more, None)
        print("appended run (+10 % rows):")
        print_run(info_more)
        check(more, info_more, out_more)
        earlier, moved = same_splits(out, out_more)
        print(f"  stability: {moved} of {earlier:,} earlier texts changed split after appending")


if __name__ == "__main__":
    main()
