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

TEXT_TYPES = ("pandas.CSVDataset", "text.TextDataset", "yaml.YAMLDataset", "json.JSONDataset")
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
}
loaded = {}
for name, kind in kinds.items():
    dataset = catalog_dataset(name, folder / name)
    dataset.save(values[kind])
    value = dataset.load()
    loaded[name] = value.to_dict("list") if kind == "pandas.CSVDataset" else value
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
        if kind == "json.JSONDataset":  # ASCII escapes (ensure_ascii, allow_unicode) are as good as UTF-8
            written = json.loads(written)["text"]
        elif kind == "yaml.YAMLDataset":
            written = yaml.safe_load(written)["text"]
        assert SAMPLE in written, name
        value = loaded[name]
        shown = value["text"][0] if kind == "pandas.CSVDataset" else value
        shown = shown["text"] if isinstance(shown, dict) else shown
        assert shown == SAMPLE, name
