"""The catalog's text files (CSV, JSON, YAML, Markdown and HTML) are written and read as UTF-8 whatever the
locale's encoding: Kedro's datasets open them in text mode with the locale's encoding unless the entry names
one (an EUC-KR locale wrote the report in EUC-KR under its UTF-8 charset; an ASCII one crashed on Korean)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml

from tests.support.project import PROJECT_ROOT

TEXT_TYPES = (
    "pandas.CSVDataset",
    "text.TextDataset",
    "yaml.YAMLDataset",
    "json.JSONDataset",
    "fastlm.datasets.atomic_file.AtomicJSONDataset",
    "fastlm.datasets.atomic_file.AtomicCSVDataset",
    "fastlm.datasets.atomic_file.AtomicTextDataset",
)
SAMPLE = "배송 빨라요 Ġ€ 가격 대비"

# Run in a process whose locale encoding is ASCII: every text entry saves a value holding SAMPLE, then the
# file's bytes are decoded as UTF-8 here and the entry's own load is compared with what was saved.
SCRIPT = """
import json, sys
from pathlib import Path
import pandas as pd
from tests.support.project import catalog_dataset

folder = Path(sys.argv[1])
sample = json.loads(sys.argv[2])
kinds = json.loads(sys.argv[3])
values = {
    "pandas.CSVDataset": pd.DataFrame({"text": [sample, "b"], "n": [1, 2]}),
    "text.TextDataset": sample,
    "yaml.YAMLDataset": {"text": sample},
    "json.JSONDataset": {"text": sample},
    "fastlm.datasets.atomic_file.AtomicJSONDataset": {"text": sample},
    "fastlm.datasets.atomic_file.AtomicCSVDataset": pd.DataFrame({"text": [sample, "b"], "n": [1, 2]}),
    "fastlm.datasets.atomic_file.AtomicTextDataset": sample,
}
loaded = {}
for name, kind in kinds.items():
    dataset = catalog_dataset(name, folder / name)
    dataset.save(values[kind])
    value = dataset.load()
    loaded[name] = value.to_dict("list") if kind.endswith("CSVDataset") else value
print(json.dumps(loaded, ensure_ascii=True))
"""


def text_entries() -> dict[str, str]:
    catalog = yaml.safe_load((PROJECT_ROOT / "conf/base/catalog.yml").read_text(encoding="utf-8"))
    return {
        name: entry["type"]
        for name, entry in catalog.items()
        if isinstance(entry, dict) and entry.get("type") in TEXT_TYPES and "{" not in name
    }


def test_every_text_entry_is_utf8_in_an_ascii_locale(tmp_path):
    kinds = text_entries()
    assert "report_html" in kinds and "split_summary" in kinds
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": "utf-8"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), json.dumps(SAMPLE), json.dumps(kinds)],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode("utf-8", "replace")[-3000:]
    loaded = json.loads(done.stdout.decode("ascii").strip().splitlines()[-1])
    for name, kind in kinds.items():
        written = (tmp_path / name).read_bytes().decode("utf-8")
        if kind.endswith("JSONDataset"):  # ASCII escapes (ensure_ascii, allow_unicode) are as good as UTF-8
            written = json.loads(written)["text"]
        elif kind == "yaml.YAMLDataset":
            written = yaml.safe_load(written)["text"]
        assert SAMPLE in written, name
        value = loaded[name]
        shown = value["text"][0] if kind.endswith("CSVDataset") else value
        shown = shown["text"] if isinstance(shown, dict) else shown
        assert shown == SAMPLE, name


# Every JSON entry saves a run's figures, some non-finite (an inf perplexity, a NaN loss): the file must parse
# with a strict parser (jq, JavaScript's JSON.parse) and the entry's own load must give the figures back.
NON_FINITE_SCRIPT = """
import json, math, sys
from pathlib import Path
from tests.support.project import catalog_dataset

def refuse(name):
    raise ValueError(name)

folder = Path(sys.argv[1])
out = {}
for name in json.loads(sys.argv[2]):
    dataset = catalog_dataset(name, folder / f"{name}.json")
    dataset.save({"steps": 2, "test_loss": float("nan"), "test_perplexity": float("inf"),
                  "rows": [{"tokens_per_s": float("-inf")}, {"tokens_per_s": 3.5}]})
    try:
        json.loads((folder / f"{name}.json").read_text(encoding="utf-8"), parse_constant=refuse)
        strict = "ok"
    except ValueError as error:
        strict = f"invalid JSON: {error}"
    back = dataset.load()
    out[name] = [strict, repr(back["test_loss"]), repr(back["test_perplexity"]),
                 repr(back["rows"][0]["tokens_per_s"]), back["rows"][1]["tokens_per_s"], back["steps"]]
print(json.dumps(out))
"""


def json_entries() -> list[str]:
    catalog = yaml.safe_load((PROJECT_ROOT / "conf/base/catalog.yml").read_text(encoding="utf-8"))
    return [
        name
        for name, entry in catalog.items()
        if isinstance(entry, dict)
        and ("JSON" in entry["type"] or entry["type"].endswith("TrainSummaryDataset"))
    ]


def test_every_json_entry_writes_non_finite_figures_as_strict_json_and_reads_them_back(tmp_path):
    names = json_entries()
    assert {"train_summary", "test_metrics", "predict_summary", "split_report", "tune_choice"} <= set(names)
    done = subprocess.run(
        [sys.executable, "-c", NON_FINITE_SCRIPT, str(tmp_path), json.dumps(names)],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    expected = ["ok", "nan", "inf", "-inf", 3.5, 2]
    assert json.loads(done.stdout) == {name: expected for name in names}
