"""Generators of the committed demo data (data/01_raw/demo_*.jsonl), used by scripts, tests and benchmarks.

Not part of the fastlm package: the product reads only the committed files (or the user's data). Import it as
``demo_data`` with ``scripts/`` on the path (pytest's ``pythonpath`` setting, the benchmarks and the scripts
themselves put it there):

* ``demo_data.texts``: Korean/English texts (``make_texts``, ``write_demo_corpus``),
* ``demo_data.dialogues``: dialogue -> summary pairs (``make_dialogues``, ``write_demo_dialogues``),
* ``demo_data.logkeys``: pre-tokenized log-key sessions with planted anomalies (``write_demo_logkeys``).
"""
