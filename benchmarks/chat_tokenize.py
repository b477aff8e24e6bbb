"""Benchmark: the split's tokenize step on multi-turn chats (``split.messages_column``, ``train_turns: all``).

Builds chats from the demo dialogue generator (``scripts/demo_data/dialogues.py``: each dialogue's lines, up
to 12, alternate user / assistant turns after one system turn, so most chats have earlier answers whose
token ranges the split reads from the tokenizer's character map), a byte-level BPE (vocab 8,000) with a
ChatML chat template saved as the split's tokenizer folder, then runs the split nodes in this process:
``clean_corpus`` -> ``split_corpus`` -> ``build_tokenizer`` (not timed) and ``tokenize_corpus`` (timed, under
cProfile with ``--profile``). Prints the step's wall seconds, the texts the Rust tokenizer encoded (calls of
``encode_batch`` / ``encode_batch_fast``, counted by cProfile) with their seconds, and a digest of the
tokenized Arrow data and of the fingerprint (the same digest before and after a change: the same data).

    OMP_NUM_THREADS=1 python benchmarks/chat_tokenize.py --chats 20000 --repeats 3
    OMP_NUM_THREADS=1 python benchmarks/chat_tokenize.py --chats 20000 --profile

Nothing is asserted about speed: the script prints the figures docs/benchmarks.md records.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import platform
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def make_chats(count: int, seed: int = 0) -> list[list[dict]]:
    """``count`` chats: a system turn, then a demo dialogue's lines (at most 12, an even number of at least
    2) as alternating user / assistant turns."""
    from demo_data.dialogues import make_dialogues

    chats = []
    for index, row in enumerate(make_dialogues(count, seed=seed)):
        lines = row["dialogue"].split("\n")[:12]
        lines = lines[: max(2, len(lines) - len(lines) % 2)]
        turns = [
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"{line} ({index})"}
            for i, line in enumerate(lines)
        ]
        chats.append([{"role": "system", "content": "You are a helpful assistant."}, *turns])
    return chats


def save_tokenizer(chats: list[list[dict]], folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=8000,
        special_tokens=special,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator((m["content"] for chat in chats[:5000] for m in chat), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=special[1:],
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHATML
    tokenizer.save_pretrained(folder)


def digest(tokenized, fingerprint: dict) -> str:
    """One sha256 of every split's Arrow columns and of the fingerprint."""
    sha = hashlib.sha256()
    for name in sorted(tokenized):
        for column in tokenized[name].data.column_names:
            sha.update(name.encode() + column.encode())
            sha.update(json.dumps(tokenized[name].data.column(column).to_pylist()).encode())
    sha.update(json.dumps(fingerprint, sort_keys=True, default=str).encode())
    return sha.hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--chats", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--profile", action="store_true", help="run the step under cProfile, print its top")
    args = parser.parse_args()

    import pandas as pd

    from fastlm.pipelines.split import nodes

    chats = make_chats(args.chats)
    with tempfile.TemporaryDirectory() as workdir:
        save_tokenizer(chats, Path(workdir) / "tok")
        params = {
            "messages_column": "messages",
            "max_length": args.max_length,
            "num_proc": 1,
            "tokenizer": {"source": str(Path(workdir) / "tok")},
        }
        clean, counts = nodes.clean_corpus(pd.DataFrame({"messages": chats}), params)
        splits, split_counts = nodes.split_corpus(clean, counts, params)
        tokenizer = nodes.build_tokenizer(splits, params)
        spanned = int(splits["answer_spans"].fillna("").astype(bool).sum())
        print(
            f"{len(splits)} chats ({spanned} with earlier answers), "
            f"{int(splits['prompt'].str.len().sum()):,} prompt characters; "
            f"Python {platform.python_version()}, {platform.processor() or platform.machine()}"
        )
        for _ in range(args.repeats):
            profile = cProfile.Profile() if args.profile else None
            start = time.perf_counter()
            if profile:
                profile.enable()
            tokenized, fingerprint, _ = nodes.tokenize_corpus(splits, tokenizer, params, split_counts)
            if profile:
                profile.disable()
            wall = time.perf_counter() - start
            tokens = sum(
                len(part.data.column("input_ids").combine_chunks().values) for part in tokenized.values()
            )
            check = digest(tokenized, fingerprint)
            print(f"tokenize_corpus: {wall:.2f} s wall, {tokens:,} tokens, digest {check}")
            if profile:
                stats = pstats.Stats(profile)
                for (_, _, name), (_, calls, tottime, _, _) in stats.stats.items():
                    if "encode_batch" in name:
                        print(f"  {name}: {calls} calls, {tottime:.2f} s ({tottime / wall:.0%} of the step)")
                stats.sort_stats("cumulative").print_stats(18)


if __name__ == "__main__":
    main()
