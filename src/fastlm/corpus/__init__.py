"""Corpus preparation (read, clean, split, tokenizer, tokenize, fingerprint). Kedro-free."""
