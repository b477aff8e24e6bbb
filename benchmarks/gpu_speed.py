"""Benchmark (issue 8): fastlm ``train`` against the Hugging Face ``Trainer`` on a GPU (H100/H200), one run.

Targets (issues 8, 13 and 31, printed as PASS/FAIL, never asserted): on ``--model 0.5b`` the fastlm engine
reaches MFU >= 55 % and >= 1.3x the real tokens/s of the Trainer in its best set-up (with Liger); LoRA and
QLoRA reach >= 1.5x Trainer + peft's best set-up and >= 2x its usual one, with a lower peak memory than
each (judged on CUDA only: on CPU the ratios are printed as figures); its data-wait share is
<= 1 %; it makes no host synchronisation between log steps; packed and unpacked losses agree within bf16
tolerance on EVERY attention path this machine has, with several rows per batch. When a target is missed,
the top 10 CUDA kernels of a short torch.profiler window of fastlm are printed. The whole script stays within
``--budget-s`` (default 480 s: 8 minutes on an H100): each contender process gets a share of what is left
and is stopped when it runs past it ("did not finish in N s"); a Trainer or TRL peer stopped so hands back
its timed steps so far, and a ratio to it is then a lower bound over those steps ("at least", judged on
``MIN_PARTIAL_STEPS`` steps or more).

    python benchmarks/gpu_speed.py --model 0.5b               # H100/H200: the issue's measurement
    python benchmarks/gpu_speed.py --model tiny               # the project's default tiny Llama
    python benchmarks/gpu_speed.py --device cpu --model tiny --steps 2 --warmup 1 --seq-len 256 \
        --compile off --budget-s 900                          # CPU smoke run
    python benchmarks/gpu_speed.py --model 0.5b --contenders fastlm_compile --fused-linear on --liger on
    python benchmarks/gpu_speed.py --model 0.5b --contenders fastlm_compile --fused-linear on --liger off
                                                              # liger-kernel against fastlm's own kernels
    python benchmarks/gpu_speed.py --model 3b --adapters --contenders fastlm_lora --fused-kernel cce
                                                              # cut-cross-entropy's fused head + loss
    python benchmarks/gpu_speed.py --device cpu --model 3b --layers 2 --batch-size 1 --warmup 1 --steps 2 \
        --compile off --checkpointing full --padding-free on --docs 200 --budget-s 3000 --contenders \
        fastlm_lora fastlm_lora_unfused trainer_lora_usual trainer_lora_best fastlm_qlora
                                                              # LoRA peak memory on a 3B shape, on CPU

Models (random init, ``torch.manual_seed(0)``, built with ``fastlm.engine.model.build.build_model``):
``tiny`` = ``ModelParams()`` (hidden 128, 2 layers, 4 heads, intermediate 344, vocab = len(tokenizer));
``0.5b`` = Llama, hidden 1536, 24 layers, 16 heads, intermediate 4096, vocab 32000, tied embeddings
(about 0.73 B parameters; the embedding rows past the tokenizer's 8000 tokens are simply never used);
``3b`` = the Llama-3.2-3B shape from its config (``memory_cliff.LLAMA_3B``: hidden 3072, 28 layers, 24 heads,
8 KV heads, intermediate 8192, vocab 128256, tied embeddings, rope theta 500000; 3.21 B parameters), built
from its ``LlamaConfig`` (``train.model`` has no rope theta). ``--layers N`` keeps the first N decoder layers
of any of them; every result line says so ("3b shape, 2 of 28 layers"). On CPU the two large models only
print their parameter count unless ``--layers`` or ``--force`` is given.

Data (prepared once, not timed): the seq-len 2048 rows need long samples, so the documents are runs of
consecutive ``make_texts(profile="demo")`` texts joined by newlines, the run lengths geometric with a mean
chosen for about seq_len / 4 tokens per document (a long tail, truncated at seq_len). ``--texts reviews``:
one short text per document instead, with the length profile of 300,000 real reviews
(``length_profile.realistic_texts``: median 27 characters, about 19 tokens), the users' corpora of millions
of short texts; fastlm packs about 100 of them per 2048-token row. Byte-level BPE tokenizer (vocab 8000)
and token ids as in ``train_speed.prepare`` (``tokenize_texts``, EOS appended).

Contenders, each in a fresh process (``--run NAME``), same data, same initial weights, same attention
implementation (``--attn auto``: ``attention.choice.choose_attention``, logged: flash-attention varlen
when installed > PyTorch's torch_varlen > flex_attention > SDPA dense mask on CUDA; SDPA on CPU):

* ``fastlm_compile`` / ``fastlm_eager``: ``fastlm.engine.train.loop.train``, batching ``packed``
  (``--batch-size`` rows of ``--seq-len`` tokens), ``runtime.precision`` = ``--precision``,
  ``runtime.compile`` on / off.
* ``trainer_usual``: ``Trainer`` with ``DataCollatorForLanguageModeling(mlm=False)`` (dynamic padding),
  ``per_device_train_batch_size = --batch-size`` samples, default arguments + ``bf16``.
* ``trainer_best``: ``bf16=True``, ``tf32=True`` (CUDA only), ``torch_compile=True`` with accelerate's
  dynamic shapes and regional compilation (``trainer_compile_env``),
  ``use_liger_kernel=True`` (CUDA with liger-kernel installed, unless ``--trainer-liger off``; the set-up
  line says which, or why not), and
  the same tokens per
  optimizer step as fastlm: ``batch_size * seq_len / mean sample length`` samples. Padding-free
  ``DataCollatorWithFlattening`` (all of them in one flattened row) when the attention is flash-attention,
  else dynamic padding with length grouping (``group_by_length=True`` / ``train_sampling_strategy=
  "group_by_length"``) in micro-batches whose padded tokens at the longest sample stay within fastlm's
  micro-batch (``batch_size`` samples where documents reach ``seq_len``; more of the short reviews:
  ``padded_micro_batches``) with gradient accumulation making up the rest. ``--checkpointing`` and
  ``--optim`` set it and fastlm's full fine-tune alike (the 3B shape's full fine-tune needs checkpointing on
  an 80 GB GPU: about 51 GB of fp32 weights, gradients and AdamW states before any activation).
  torch_compile gets a time cap (its share of ``--budget-s``); when it does not finish or fails, the run is
  reported as "did not finish in N s" or "failed (exit N: the error)" and repeated without torch_compile.

Adapter contenders (``--adapters``, or named in ``--contenders``; the issue's LoRA/QLoRA items). The model
above is saved once with ``save_pretrained`` in the workdir (``base/``) and each contender loads it back as
a user's local checkpoint; LoRA r 16, alpha 32, no dropout, on the attention and MLP projections; the same
tokens per optimizer step everywhere (``batch_size * seq_len``; the Trainer's samples of the mean length
made up with gradient accumulation in micro-batches as ``trainer_best``'s padded one):

* ``fastlm_lora`` / ``fastlm_qlora``: the engine with ``train.model.lora`` (frozen bf16 base / 4-bit NF4
  base with bf16 compute), packed rows, ``train.model.gradient_checkpointing`` = ``--checkpointing``,
  ``train.optimizer.name`` = ``--optim``, the fused linear loss on ``auto``, compiled unless
  ``--compile off``.
* ``trainer_lora_usual`` / ``trainer_qlora_usual``: ``Trainer`` + peft as their docs show it: base loaded
  with ``from_pretrained`` (bf16 / ``BitsAndBytesConfig`` NF4 + ``prepare_model_for_kbit_training`` with
  its default checkpointing), ``get_peft_model``, dynamic padding, default optimizer.
* ``trainer_lora_best`` / ``trainer_qlora_best``: the ``trainer_best`` data set-up (padding-free or length
  grouping, tf32, torch_compile) plus ``--checkpointing`` (off: none) and ``--optim`` (``adamw_torch_fused``,
  ``adamw_bnb_8bit``, ``paged_adamw_8bit``). On CPU they, and the full fine-tune's ``trainer_best``, take
  the padding-free collator with SDPA's dense mask (transformers builds the block-diagonal mask from the
  position ids), measured faster there than length grouping (``trainer_padding_free``). No Liger kernels on
  CPU.
* ``trl_lora_best`` / ``trl_qlora_best`` (named in ``--contenders``; trl from the ``bench`` or ``dev`` extra):
  TRL's ``SFTTrainer`` on the model ``trainer_*_best`` prepares (Trainer + peft, ``--checkpointing`` applied
  to it; TRL's own default would checkpoint every layer), TRL's best data path: ``packing=True`` (best-fit
  decreasing into rows of ``seq_len``, ``--batch-size`` rows per micro-batch: fastlm's tokens per step) with
  its padding-free batches (one flattened row, ``cu_seq_lens`` for the varlen kernel), its chunked LM head
  (Triton on CUDA), Liger's layer kernels, tf32 and torch_compile as ``trainer_best``. Held to the same
  targets as Trainer + peft's best set-up.
* ``fastlm_lora_unfused`` (named in ``--contenders``): ``fastlm_lora`` with ``train.loss.fused_linear: off``,
  the A/B of the fused LM head + loss (``[tokens x vocab]`` logits materialised).
* ``fastlm_lora_own_head`` (named in ``--contenders``): ``fastlm_lora`` with
  ``train.loss.fused_linear_kernel: fastlm``, the A/B of the fused head's kernels (``auto`` picks liger's
  Triton kernel on CUDA, in a loop of fastlm's; fastlm's chunked PyTorch one).
* ``fastlm_lora_liger_function`` (named in ``--contenders``): ``fastlm_lora`` with liger's own
  ``liger_fused_linear_cross_entropy`` for the fused head, as fastlm called it until 2026-11-27 (three host
  syncs per micro-batch: the target count's ``.item()``, ``torch.equal`` of the incoming gradient with 1),
  the A/B of fastlm's sync-free loop over the same Triton kernel (engine/model/liger.py).
* ``fastlm_lora_peft_forward`` / ``fastlm_qlora_peft_forward`` (named in ``--contenders``): ``fastlm_lora``
  / ``fastlm_qlora`` with ``train.model.lora.fused_forward: false``, peft's own LoRA forward (its input cast
  to the fp32 adapters and back, or over a 4-bit base a clone of the base output; a scaling pass, an add),
  the A/B of fastlm's (engine/model/lora_forward.py).
* ``fastlm_lora_own_inputs`` (named in ``--contenders``): ``fastlm_lora`` with
  ``train.model.lora.shared_input: false``, each LoRA layer on its own (q, k and v each multiply the input
  by their adapter's A, autograd sums their input gradients in passes of their own), the A/B of the
  shared-input groups (engine/model/lora_forward.py).
* ``fastlm_lora_fp32_adapters`` (named in ``--contenders``): ``fastlm_lora`` with
  ``train.runtime.param_dtype: fp32``, fp32 adapters under bf16 autocast (each adapter cast to bf16 in every
  micro-batch's forward, its gradient cast back in the backward: 392 casts each way on the 3B shape), the
  A/B of bf16 adapters with fp32 masters (param_dtype auto on a GPU; engine/train/master_weights.py).
* ``fastlm_lora_cudagraphs`` (named in ``--contenders``): ``fastlm_lora`` compiled by layers with
  ``train.runtime.compile_mode: reduce-overhead`` whatever ``--compile`` says: a CUDA graph of each compiled
  layer replayed by one launch, over micro-batches of one shape (the packed row padded to its capacity), the
  A/B of eager's launches one by one (the host left an H200 idle 21-41 % of the eager LoRA step). Needs CUDA
  (the engine refuses it on a CPU run).
* ``fastlm_lora_compiled`` / ``fastlm_qlora_compiled`` (named in ``--contenders``): ``fastlm_lora`` /
  ``fastlm_qlora`` compiled by layers whatever ``--compile`` says: with ``--compile off`` one run holds
  fastlm eager, fastlm compiled and the peers eager with Liger (their best set-up that finishes: with Liger
  the Trainer + peft's torch_compile did not finish its first step in 93 s on an H200, 2026-11-28), the A/B
  of compiling the adapter layers (the eager QLoRA step left an H200 idle 29 % waiting for the host).
* ``fastlm_eager_fp32_weights`` / ``fastlm_compile_fp32_weights`` (named in ``--contenders``): the full
  fine-tune with ``train.runtime.param_dtype: fp32``, bf16 autocast over fp32 weights as the Trainer runs
  (an fp32 residual stream, each projection's input cast to bf16, each input gradient cast back and summed in
  fp32), the A/B of fastlm's bf16 weights with fp32 masters (``--param-dtype``, auto: on a GPU in bf16;
  engine/train/master_weights.py).
* ``fastlm_compile_inductor_layers`` (named in ``--contenders``): ``fastlm_compile`` with
  ``train.model.liger: off``: each compiled layer's RMSNorm, rotary embedding and SwiGLU left to inductor
  instead of liger's Triton kernels (opaque to inductor, their backward in place), the fused head's kernel
  still the one ``--liger`` implies (liger's on a GPU at auto). The A/B of liger inside compiled layers:
  compiled by layers, fastlm's kernels took about 18 ms a step more than eager's on an H200 (2026-11-28).
* ``fastlm_eager_in_backward`` (named in ``--contenders``): ``fastlm_eager`` with
  ``train.optimizer.in_backward`` (each fp32 master updated as soon as its gradient is complete, the
  gradient freed: no step holds every master gradient) and, as it needs, ``grad_clip: null`` (fastlm_eager
  clips at 1.0); needs bf16 weights (``--param-dtype bf16`` on a CPU). The A/B of its peak memory.

The frozen LoRA base is bf16 on both sides with ``--precision bf16`` (CPU included: bf16 autocast there
too), fp32 with ``--precision fp32``. The base is built and saved, in that dtype, by a process of its own
before the adapter contenders, so that no contender's memory holds its construction or a dtype conversion.

The QLoRA contenders need bitsandbytes (on CPU 0.50 or later): without it the QLoRA pairs are skipped with
the reason. The MFU of an adapter run counts 6N FLOPs per token like a full fine-tune, an upper bound of its
work (frozen weights need no weight gradients: about 4N), so compare adapter runs by real tokens/s.

The Trainer needs ``accelerate``: without it the Trainer contenders are skipped with a printed reason.
Figures: real (non-padding) tokens/s over the timed steps (after ``--warmup`` steps); MFU, two labelled
figures: ``mfu`` = (6N + 12·L·H·seq_len) FLOPs per real token (``flops_per_token``, the usual figure) ×
real tokens/s ÷ ``device_peak_flops`` (dense bf16), and ``mfu_docs`` = the same with the attention term over
each document's own length (``metrics.attended_length``: sum(len²)/sum(len)), the attention work a
document-masked path actually needs; each contender's first step (its compile included: the cold start a
user waits through) is shown and not timed;
peak memory = ``torch.cuda.max_memory_allocated``. On CPU, the CPU resident memory of each contender's
process (``process_memory``: ``VmRSS`` / ``VmHWM`` of ``/proc/self/status``; not ``ru_maxrss``, which a child
inherits from the process that started it): with the model (and adapters) loaded and its weights read once
(``make_resident``: a memory-mapped checkpoint), the process's peak, and the
training's peak above the loaded model (the high-water mark restarted once the model is loaded, warm-up
steps included), with the largest micro-batch's token slots; the ratios fastlm / peer of both peaks are
printed (``MEMORY_PAIRS``). fastlm's peak is read before its packed/unpacked loss check. Resident memory
depends on glibc's allocator: freed blocks under its (dynamic, up to 32 MiB) mmap threshold stay resident,
so the ``MALLOC_*`` variables of the environment (inherited by every contender) are printed; with
``MALLOC_MMAP_THRESHOLD_=1048576`` every block of 1 MiB or more is returned on free and the peak comes
closer to the live tensors' (what ``max_memory_allocated`` counts on a GPU). The Trainer window
is closed with a ``torch.cuda.synchronize()`` at both ends; fastlm's windows end with the engine's own flush
(which syncs).
Host syncs: during fastlm's timed steps ``torch.cuda.set_sync_debug_mode("warn")`` is on and every
"synchronizing" warning is counted, split into those raised inside the log-step flush (expected) and the
others (between log steps: target 0).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import os
import re
import resource
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

# Sibling modules (scripts run from benchmarks/); importing train_speed also sets the offline environment.
from contender_process import partial_path, run_contender
from memory_cliff import LLAMA_3B
from train_speed import REPO, TEXT_SEED, VOCAB_SIZE, Context, CountingCollator, _fmt, machine, peer_trainer

# demo_data: the demo-data generators
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

MODELS = {
    "tiny": {},  # ModelParams() defaults: hidden 128, 2 layers, 4 heads, intermediate 344
    "0.5b": {
        "hidden_size": 1536,
        "intermediate_size": 4096,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
    },
    # Llama-3.2-3B from its config (memory_cliff.LLAMA_3B); --layers keeps the first N of its 28 layers
    "3b": {
        key: LLAMA_3B[key]
        for key in (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "tie_word_embeddings",
        )
    },
}
MODEL_VOCAB = {"tiny": None, "0.5b": 32000, "3b": LLAMA_3B["vocab_size"]}  # None: len(tokenizer)
# LlamaConfig fields train.model has no parameter for: such a model is built from its LlamaConfig
MODEL_CONFIG_EXTRA = {"3b": {"rope_theta": LLAMA_3B["rope_theta"]}}
DEFAULT_BATCH = {"tiny": 16, "0.5b": 8, "3b": 4}
# --liger: train.model.liger as given, and the fused head's kernel it implies (train.loss.fused_linear_kernel)
LIGER_KERNEL = {"auto": "auto", "on": "liger", "off": "fastlm"}
FULL_CONTENDERS = ("fastlm_compile", "fastlm_eager", "trainer_usual", "trainer_best")
ADAPTER_CONTENDERS = (
    "fastlm_lora",
    "fastlm_qlora",
    "trainer_lora_usual",
    "trainer_lora_best",
    "trainer_qlora_usual",
    "trainer_qlora_best",
)
# fastlm_lora with train.loss.fused_linear: off, the A/B of the fused LM head + loss, and with fastlm's own
# fused-head kernel (train.loss.fused_linear_kernel: fastlm; auto picks liger's Triton kernel on CUDA), the
# A/B of the two kernels, with liger's own autograd function for the head (its host syncs), and fastlm_lora /
# fastlm_qlora with peft's own LoRA forward (train.model.lora.fused_forward: false), the A/B of fastlm's
# (named in --contenders)
# TRL's SFTTrainer + peft in its best set-up (packing, padding-free, its chunked LM head): the peer LoRA users
# pick instead of the Trainer (named in --contenders; needs trl: pip install -e '.[bench]')
TRL_CONTENDERS = ("trl_lora_best", "trl_qlora_best")
AB_CONTENDERS = (
    "fastlm_lora_unfused",
    "fastlm_lora_own_head",
    "fastlm_lora_liger_function",
    "fastlm_lora_peft_forward",
    "fastlm_qlora_peft_forward",
    "fastlm_lora_own_inputs",
    "fastlm_lora_fp32_adapters",
    "fastlm_lora_cudagraphs",
    "fastlm_lora_compiled",
    "fastlm_qlora_compiled",
)
# fastlm_lora / fastlm_qlora against its own variants: real tokens/s and peak memory, one run
AB_PAIRS = [(f"fastlm_{name.split('_')[1]}", name) for name in AB_CONTENDERS]
# the full fine-tune with train.runtime.param_dtype: fp32 (bf16 autocast over fp32 weights, the Trainer's
# way), the A/B of fastlm's bf16 weights with fp32 masters (param_dtype auto on a GPU; named in --contenders)
# fastlm_eager with train.optimizer.in_backward (each master updated in the backward, grad_clip null), and
# fastlm_compile with the layers' norms, rotary and SwiGLU left to inductor (train.model.liger: off)
FULL_AB_CONTENDERS = (
    "fastlm_eager_fp32_weights",
    "fastlm_compile_fp32_weights",
    "fastlm_eager_in_backward",
    "fastlm_compile_inductor_layers",
)
FULL_AB_PAIRS = [
    (name.removesuffix("_fp32_weights").removesuffix("_in_backward").removesuffix("_inductor_layers"), name)
    for name in FULL_AB_CONTENDERS
]
CONTENDERS = FULL_CONTENDERS + ADAPTER_CONTENDERS + TRL_CONTENDERS + AB_CONTENDERS + FULL_AB_CONTENDERS
LORA = {"r": 16, "alpha": 32, "dropout": 0.0}
ADAPTER_PAIRS = [
    (f"fastlm_{a}", f"{peer}_{a}_{kind}")
    for a in ("lora", "qlora")
    for peer, kind in (("trainer", "best"), ("trainer", "usual"), ("trl", "best"))
]
# peak memory, fastlm first (lower is better)
MEMORY_PAIRS = [
    *ADAPTER_PAIRS,
    *AB_PAIRS,
    *FULL_AB_PAIRS,
    *((a, b) for a in ("fastlm_compile", "fastlm_eager") for b in ("trainer_best", "trainer_usual")),
]
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TRAINER_OPTIM = {
    "adamw": "adamw_torch_fused",
    "adamw_8bit": "adamw_bnb_8bit",
    "paged_adamw_8bit": "paged_adamw_8bit",
}
MODEL_SEED = 0
LOSS_CHECK_ROWS = 4
LOSS_TOL = {"bf16": 2e-2, "fp32": 1e-4}  # |packed - unpacked| mean loss, relative
# the loss check of a fastlm contender whose figures were written before it and whose cap came during it
LOSS_CHECK_CUT = "cut"
# records.Recorder.flush
SYNC_LOG_FRAMES = {"flush", "check_finite", "check", "check_first_loss", "show", "on_record"}

TARGET_MFU = 0.55  # issue 31 (0.5b, bf16)
FLOAT8_MEASURED = "measured on the first micro-batch"  # engine/runtime/probe.py's float8 auto choice
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b.*:")  # "torch.XError: ..."
MIN_PARTIAL_STEPS = 3  # a stopped peer's timed steps a ratio's lower bound is judged on (bounded_verdict)
MIN_COMPILE_TRY_S = 60.0  # a Trainer best set-up's torch_compile try gets at least this, or is not tried
# a best set-up's run without torch_compile when its usual one has not run: 0.73 B on an H100, 8 + 20 steps,
# took 32 s in all (docs/gpu-runs/2026-11-26-h100-gpu-speed-0.5b-fastlm-compile-trainer-best.log)
EAGER_TRAINER_S = 40.0
TARGET_VS_BEST = 1.3
TARGET_DATA_WAIT = 0.01
TEXTS_LABEL = {"demo": "demo texts", "reviews": "short texts with real reviews' lengths"}

# issue 31, LoRA/QLoRA on the 3B shape: real tokens/s against Trainer + peft's best and usual set-ups, and a
# lower peak memory than both
TARGET_ADAPTER_VS = {"best": 1.5, "usual": 2.0}


# --------------------------------------------------------------------------------------------------
# Preparation (parent, not timed)
# --------------------------------------------------------------------------------------------------


# ``--texts reviews``: one real-length short review per document (``length_profile.realistic_texts``, about
# 19 tokens each under this tokenizer set-up); the default document count assumes it
REVIEW_TOKENS_PER_TEXT = 19


def saved_once(folder: Path, save) -> Path:
    """``folder``, written by ``save(path)`` unless it is there already: into a sibling ``.partial`` folder
    renamed when complete, so a save cut short (a step's timeout) is never taken for a saved model. A link
    (``--cache-dir``'s ``base``) is followed: the folder it names is the one saved."""
    target = folder.resolve()
    if (target / "config.json").is_file():
        return folder
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    save(partial)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return folder


def preparation_key(args: argparse.Namespace, n_docs: int) -> str:
    """What the prepared data and the saved base model depend on: the documents, the tokenizer's vocabulary,
    the model's shape and the dtype it is saved in (the code is the session's own: a cache lives on one
    machine)."""
    what = {
        "texts": args.texts,
        "docs": n_docs,
        "seq_len": args.seq_len,
        "vocab": VOCAB_SIZE,
        "model": args.model,
        "layers": args.layers,
        "precision": args.precision,
    }
    return hashlib.sha1(json.dumps(what, sort_keys=True).encode()).hexdigest()[:12]


def cached_preparation(cache_dir: Path, workdir: Path, key: str, make) -> tuple[dict, bool]:
    """``--cache-dir``: the prepared data (tokenizer, token ids, their figures) copied into ``workdir`` from
    ``cache_dir/key`` where an earlier run of the session made it, else made by ``make()`` (``prepare``) and
    kept there; ``workdir/base`` links to the cached base model folder (saved once, ``saved_once``). The
    gpu_session.sh steps share it: a 3B base took 22-30 s to make and save. (prep, whether it was cached)."""
    cached = cache_dir / key
    cached.mkdir(parents=True, exist_ok=True)
    record = cached / "prep.json"
    hit = record.is_file()
    if hit:
        shutil.copytree(cached / "tokenizer", workdir / "tokenizer", dirs_exist_ok=True)
        shutil.copy2(cached / "tokens.npz", workdir / "tokens.npz")
        prep = json.loads(record.read_text())
    else:
        prep = make()
        shutil.copytree(workdir / "tokenizer", cached / "tokenizer", dirs_exist_ok=True)
        shutil.copy2(workdir / "tokens.npz", cached / "tokens.npz")
        partial = record.with_suffix(".partial")
        partial.write_text(json.dumps(prep))
        partial.replace(record)  # last: the record says the rest is complete
    link = workdir / "base"
    if not link.exists() and not link.is_symlink():
        link.symlink_to(cached / "base", target_is_directory=True)
    return prep, hit


def default_documents(texts: str, warmup: int, steps: int, batch_size: int, seq_len: int) -> int:
    """Enough documents for every step of a run: about 1.3x the packed tokens it trains on (demo documents:
    about seq_len / 4 tokens each, so 6 per packed row as before; reviews: about 19 tokens each)."""
    if texts == "reviews":
        return math.ceil(1.3 * (warmup + steps) * batch_size * seq_len / REVIEW_TOKENS_PER_TEXT)
    return math.ceil(6 * (warmup + steps) * batch_size)


def padded_micro_batches(same_tokens: int, batch_size: int, seq_len: int, longest: int) -> tuple[int, int]:
    """(samples per micro-batch, accumulation steps) of a padded Trainer set-up at ``same_tokens`` samples
    per optimizer step: a padded micro-batch costs up to its longest sample per row, so it holds as many
    samples as fit in fastlm's micro-batch tokens (``batch_size`` rows of ``seq_len``) at the data's longest
    sample: ``batch_size`` samples where documents reach ``seq_len``, more where all are short (reviews), as
    a user with short texts sets ``per_device_train_batch_size``; accumulation makes up the rest."""
    per_micro_batch = max(1, batch_size * seq_len // max(1, longest))
    accumulation = max(1, math.ceil(same_tokens / per_micro_batch))
    return math.ceil(same_tokens / accumulation), accumulation


def make_documents(n_docs: int, seq_len: int, seed: int = TEXT_SEED, texts: str = "demo") -> list[str]:
    """``demo``: runs of consecutive demo texts joined by newlines, geometric run lengths, about seq_len / 4
    tokens. ``reviews``: one text per document with the length profile of real short reviews (median 27
    characters, about 19 tokens), the users' corpora; its few empty rows left out (the split drops them)."""
    import numpy as np

    if texts == "reviews":
        from length_profile import realistic_texts

        return [text for text in realistic_texts(n_docs, seed=seed) if text]
    from demo_data.texts import make_texts

    probe = make_texts(2000, seed=seed, profile="demo")
    chars_per_text = sum(map(len, probe)) / len(probe)
    mean_texts = max(1.0, (seq_len / 4) * 3.0 / chars_per_text)  # about 3 characters per BPE token
    rng = np.random.default_rng(seed)
    counts = rng.geometric(1.0 / mean_texts, size=n_docs)
    texts = make_texts(int(counts.sum()), seed=seed, profile="demo")
    ends = np.cumsum(counts)
    return ["\n".join(texts[end - count : end]) for count, end in zip(counts, ends, strict=True)]


def prepare(workdir: Path, n_docs: int, seq_len: int, texts: str = "demo") -> dict:
    import numpy as np

    from fastlm.corpus.tokenization import tokenize_texts
    from fastlm.corpus.tokenizer_source import train_bpe_tokenizer

    start = time.perf_counter()
    docs = make_documents(n_docs, seq_len, texts=texts)
    tokenizer = train_bpe_tokenizer(docs, vocab_size=VOCAB_SIZE, min_frequency=2, model_max_length=seq_len)
    tokenizer.save_pretrained(str(workdir / "tokenizer"))
    tokens = tokenize_texts(docs, tokenizer, max_length=seq_len, num_proc=1)
    np.savez(workdir / "tokens.npz", values=tokens.values, offsets=tokens.offsets)
    lengths = tokens.lengths
    return {
        "texts": texts,
        "docs": len(docs),
        "tokens_total": int(lengths.sum()),
        "tokens_median": float(np.median(lengths)),
        "tokens_mean": float(lengths.mean()),
        "tokens_p90": float(np.percentile(lengths, 90)),
        "tokens_max": int(lengths.max()),
        "truncated": int(tokens.truncated.sum()),
        "vocab": len(tokenizer),
        "prepare_s": time.perf_counter() - start,
    }


def model_params(name: str, layers: int | None = None):
    """``train.model`` of a model config; ``layers``: only the first N decoder layers (None: all)."""
    from fastlm.engine.config import ModelParams

    shape = {**MODELS[name], **({"num_hidden_layers": layers} if layers else {})}
    return ModelParams(attn_implementation="sdpa", **shape)


def full_depth(name: str) -> int:
    """The decoder layers of a model config (``--layers`` keeps the first N of them)."""
    return model_params(name).num_hidden_layers


def model_label(args: argparse.Namespace) -> str:
    """``"3b shape, 2 of 28 layers"``: the config and how many of its decoder layers the run keeps."""
    full = full_depth(args.model)
    return f"{args.model} shape, {args.layers or full} of {full} layers"


def llama_config(name: str, *, seq_len: int, layers: int | None = None, vocab: int = 8000, **extra):
    """The ``LlamaConfig`` of a model config (``MODEL_CONFIG_EXTRA`` included); ``vocab``: the tokenizer's
    size where the config has no vocabulary of its own; ``extra``: further config fields."""
    from transformers import LlamaConfig

    p = model_params(name, layers)
    return LlamaConfig(
        vocab_size=MODEL_VOCAB[name] or vocab,
        hidden_size=p.hidden_size,
        intermediate_size=p.intermediate_size,
        num_hidden_layers=p.num_hidden_layers,
        num_attention_heads=p.num_attention_heads,
        num_key_value_heads=p.num_key_value_heads or p.num_attention_heads,
        tie_word_embeddings=p.tie_word_embeddings,
        max_position_embeddings=max(seq_len, 512),
        **MODEL_CONFIG_EXTRA.get(name, {}),
        **extra,
    )


class VocabOf:
    """What ``build_model`` reads from a tokenizer: its length (the model's vocabulary) and special ids."""

    def __init__(self, tokenizer, size: int | None) -> None:
        self.size = size or len(tokenizer)
        self.bos_token_id, self.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
        self.pad_token_id = tokenizer.pad_token_id

    def __len__(self) -> int:
        return self.size


def count_parameters(name: str, seq_len: int, vocab: int = 8000, layers: int | None = None) -> int:
    """Parameters of a model config (``layers``: its first N decoder layers), built on the meta device (no
    memory, no init)."""
    import torch
    from transformers import LlamaForCausalLM

    config = llama_config(name, seq_len=seq_len, layers=layers, vocab=vocab)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    return sum(t.numel() for t in model.parameters())


def process_memory() -> dict:
    """This process's resident memory now and its peak, MiB (``VmRSS`` and ``VmHWM`` of
    ``/proc/self/status``; None without /proc). Not ``ru_maxrss``: Linux hands a child process the high-water
    mark of the process that started it (exec keeps it), so a contender's ``ru_maxrss`` is at least the
    parent's peak; ``VmHWM`` is the process's own."""
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return {"rss_mb": None, "peak_mb": None}
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024  # kB
    return {"rss_mb": fields.get("VmRSS"), "peak_mb": fields.get("VmHWM")}


def make_resident(model) -> None:
    """Read every page of a model's host tensors once. A checkpoint loaded in its own dtype is memory-mapped
    from its file (safetensors): its pages become resident only as they are read, so weights not yet read
    would count in the training's peak instead of in the loaded model."""
    import itertools

    import torch

    with torch.no_grad():
        for tensor in itertools.chain(model.parameters(), model.buffers()):
            if tensor.device.type == "cpu" and tensor.numel():
                flat = tensor.detach().reshape(-1)
                flat[:: max(1, 4096 // flat.element_size())].sum()  # one element per 4 KiB page


def restart_peak() -> bool:
    """Restart ``VmHWM`` at the current resident memory (Linux 4.0+: ``5`` written to
    ``/proc/self/clear_refs``); False where this kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


# --------------------------------------------------------------------------------------------------
# Children
# --------------------------------------------------------------------------------------------------


class GpuContext(Context):
    """``train_speed.Context`` (tokenizer, token ids) plus the chosen model, device, attention."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        from fastlm.engine.model.attention.choice import choose_attention
        from fastlm.engine.runtime.environment import resolve_device

        super().__init__(args)
        self.device = resolve_device(args.device)
        self.on_cuda = self.device.type == "cuda"
        self.attn = choose_attention(args.attn, self.device, args.precision)
        torch.set_num_threads(args.threads)

    def build_model(self, attn: str | None = None):
        """The contenders' initial model, its weights' digest and its size (the 3b shape initialised on the
        run's device)."""
        import torch

        from fastlm.engine.model.build import build_model

        attn = attn or self.attn
        name, layers = self.args.model, self.args.layers
        torch.manual_seed(MODEL_SEED)
        if name in MODEL_CONFIG_EXTRA:  # fields train.model lacks (3b: rope theta): from its LlamaConfig
            from transformers import LlamaForCausalLM

            config = llama_config(
                name,
                seq_len=self.args.seq_len,
                layers=layers,
                bos_token_id=self.tokenizer.bos_token_id,
                eos_token_id=self.tokenizer.eos_token_id,
                pad_token_id=self.tokenizer.pad_token_id,
                attn_implementation=attn,
                use_cache=False,
            )
            # initialised on the run's device by every side alike (the same weights): a 3B model's fp32 init
            # on the H100 machine's CPU took most of 50 s, a contender's share of a session step
            with torch.device(self.device):
                model = LlamaForCausalLM(config).train()
        else:
            params = model_params(name, layers).model_copy(update={"attn_implementation": attn})
            model = build_model(
                params,
                VocabOf(self.tokenizer, MODEL_VOCAB[name]),
                max_length=self.args.seq_len,
                attn_implementation=attn,
            )
        digest = hashlib.sha256()
        for name, parameter in sorted(model.state_dict().items()):  # a sample of each tensor: cheap at 0.7 B
            digest.update(name.encode())
            digest.update(parameter.detach().reshape(-1)[:4096].float().cpu().numpy().tobytes())
        return model, digest.hexdigest()[:12], sum(p.numel() for p in model.parameters())

    def base_folder(self) -> Path:
        """The contenders' common initial model saved as a local pretrained folder (once, by the ``base``
        process the parent starts before the adapter contenders, so that no contender's memory holds it; with
        ``--cache-dir`` once per session: ``cached_preparation``)."""
        import torch

        def save(folder: Path) -> None:
            model, _, _ = self.build_model()
            if self.args.precision == "bf16":  # saved as both sides load it: no conversion in their load
                model = model.to(torch.bfloat16)
            model.save_pretrained(str(folder))
            self.tokenizer.save_pretrained(str(folder))

        return saved_once(Path(self.args.workdir) / "base", save)

    def adapter_model_params(
        self, quantized: bool, fused_forward: bool = True, shared_input: bool = True
    ) -> dict:
        """``train.model`` of the adapter contenders (module docstring); ``fused_forward``:
        ``train.model.lora.fused_forward`` (``fastlm_lora_peft_forward``: false); ``shared_input``:
        ``train.model.lora.shared_input`` (``fastlm_lora_own_inputs``: false)."""
        lora = {
            **LORA,
            **lora_variant(self.args.lora_variant),
            "dropout": self.args.lora_dropout,
            "enabled": True,
            "load_in_4bit": quantized,
            "fused_forward": fused_forward,
            "shared_input": shared_input,
            "target_modules": LORA_TARGETS,
            "base_dtype": "bf16" if self.args.precision == "bf16" else "fp32",  # as the Trainer loads it
        }
        return {
            "name_or_path": str(self.base_folder()),
            "attn_implementation": self.attn,
            "lora": lora,
            "gradient_checkpointing": self.args.checkpointing,
        }

    def build_adapter_model(self, quantized: bool, fused_forward: bool = True, shared_input: bool = True):
        """fastlm's LoRA / QLoRA model on the saved base, a digest of its base weights (None when 4-bit)."""
        from fastlm.engine.config import parse_train_params
        from fastlm.engine.model.build import build_model

        model_params = self.adapter_model_params(quantized, fused_forward, shared_input)
        params = parse_train_params({"model": model_params}).model
        model = build_model(
            params, self.tokenizer, max_length=self.args.seq_len, attn_implementation=self.attn
        )
        from fastlm.engine.model.lora import model_parameters  # 4-bit weights unpacked

        return model, None if quantized else base_digest(model), model_parameters(model)

    def mfu(self, model, real_tokens_per_s: float) -> dict:
        """Both MFU figures (module docstring): attention over seq_len, and over each document's length."""
        from fastlm.engine.model.lora import model_parameters
        from fastlm.engine.observe.metrics import attended_length, device_peak_flops, flops_per_token

        config = model.config
        n_params = model_parameters(model)  # a QLoRA base's 4-bit weights unpacked: the model's FLOPs
        shape = (n_params, config.num_hidden_layers, config.hidden_size)
        fpt = flops_per_token(*shape, self.args.seq_len)
        fpt_docs = flops_per_token(*shape, attended_length(self.lengths))
        peak = device_peak_flops(self.device)
        return {
            "flops_per_token": fpt,
            "flops_per_token_docs": fpt_docs,
            "mfu": fpt * real_tokens_per_s / peak if peak else None,
            "mfu_docs": fpt_docs * real_tokens_per_s / peak if peak else None,
        }

    def reset_peak(self) -> None:
        import torch

        if self.on_cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def mark_loaded(self, model) -> None:
        """The model is loaded: its weights made resident (``make_resident``), its resident memory is noted,
        then the peak restarts there, so that the training's peak is read apart from the load's own transient
        one."""
        make_resident(model)
        now = process_memory()
        self.loaded = {
            "rss_loaded_mb": now["rss_mb"],
            "peak_load_mb": now["peak_mb"],
            "peak_restarted": restart_peak(),
        }

    def cpu_memory(self) -> dict:
        """Resident memory (``process_memory``): with the model loaded, the process's peak, and the training's
        peak above the loaded model (``peak_restarted`` False: that peak includes the load's)."""
        loaded, now = getattr(self, "loaded", {}), process_memory()
        if now["peak_mb"] is None or loaded.get("rss_loaded_mb") is None:
            return {}
        return {
            **loaded,
            "peak_train_mb": now["peak_mb"],
            "peak_rss_mb": max(now["peak_mb"], loaded["peak_load_mb"]),
            "peak_above_loaded_mb": now["peak_mb"] - loaded["rss_loaded_mb"],
            "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # parent's included
        }

    def peak_memory_mb(self) -> float | None:
        """CUDA: ``torch.cuda.max_memory_allocated``; CPU: the process's own peak resident memory."""
        from fastlm.engine.observe.metrics import peak_memory_mb

        if self.on_cuda:
            return peak_memory_mb(self.device)
        return self.cpu_memory().get("peak_rss_mb")


def base_digest(model) -> str:
    """A digest of a model's base weights, adapter weights left out and peft's names mapped back: the same
    for the full model and a LoRA model on it (a sample of each tensor: cheap at 0.7 B)."""
    digest = hashlib.sha256()
    base = {
        name.removeprefix("base_model.model.").replace(".base_layer", ""): parameter
        for name, parameter in model.state_dict().items()
        if "lora_" not in name
    }
    for name, parameter in sorted(base.items()):
        digest.update(name.encode())
        digest.update(parameter.detach().reshape(-1)[:4096].float().cpu().numpy().tobytes())
    return digest.hexdigest()[:12]


def fastlm_params(
    ctx: GpuContext,
    *,
    compile_: bool,
    max_steps: int,
    log_every: int,
    name: str,
    profile=None,
    adapter: str | None = None,
    fused_linear: str | None = None,
    fused_kernel: str | None = None,
    fused_forward: bool = True,
    param_dtype: str | None = None,
    in_backward: bool = False,
    shared_input: bool = True,
    compile_mode: str | None = None,
    liger: str | None = None,
):
    """``params:train`` of a fastlm contender; ``fused_linear``: ``train.loss.fused_linear`` (None:
    ``--fused-linear``); ``fused_kernel``: ``train.loss.fused_linear_kernel`` (None: ``--fused-kernel``, else
    the one ``--liger`` implies); ``compile_mode``: ``train.runtime.compile_mode``, compiled by layers (None:
    ``--compile-mode`` in ``--compile-scope``); ``liger``: ``train.model.liger`` (None: ``--liger``), the
    head's kernel left as ``--liger`` implies."""
    from fastlm.engine.config import parse_train_params

    args = ctx.args
    fused_linear = fused_linear or args.fused_linear
    model = {"attn_implementation": ctx.attn, "gradient_checkpointing": args.checkpointing}
    if adapter:
        model = ctx.adapter_model_params(adapter == "qlora", fused_forward, shared_input)
    # --liger: the norm/rotary/MLP patch and the fused head's kernel
    model = {**model, "liger": liger or args.liger}
    raw = {
        "model": model,
        "loss": {
            "fused_linear": {"auto": "auto", "on": True, "off": False}[fused_linear],
            "fused_linear_kernel": fused_kernel or args.fused_kernel or LIGER_KERNEL[args.liger],
        },
        "batching": {
            "mode": "packed",
            "micro_batch_size": args.batch_size,
            "gradient_accumulation_steps": args.accumulation,
        },
        "runtime": {
            "device": str(ctx.device),
            "precision": args.precision,
            "param_dtype": param_dtype or args.param_dtype,
            "compile": compile_,
            "compile_scope": "layers" if compile_mode else args.compile_scope,
            "compile_mode": (compile_mode or args.compile_mode) if compile_ else "default",
            "num_threads": args.threads,
        },
        "max_steps": max_steps,
        "seed": 0,
        "log_every": log_every,
        "eval_every": None,
        "save_every": None,
        "resume": "never",
        "checkpoint_dir": str(Path(args.workdir) / f"checkpoints_{name}"),
        "quiet": True,
    }
    if profile:
        raw["profile"] = profile
    raw["optimizer"] = {"name": args.optim}
    if in_backward:
        raw["optimizer"].update(in_backward=True, grad_clip=None)
    return parse_train_params(raw)


class SyncCounter:
    """Counts CUDA 'synchronizing operation' warnings; those raised inside a log-step flush apart."""

    def __init__(self) -> None:
        self.at_log_step = 0
        self.between = 0
        self.examples: list[str] = []

    def hook(self, message, category, filename, lineno, file=None, line=None) -> None:
        if "synchroniz" not in str(message):
            return
        frames = traceback.extract_stack()[:-1]
        if any(frame.name in SYNC_LOG_FRAMES for frame in frames):
            self.at_log_step += 1
        else:
            self.between += 1
            if len(self.examples) < 3:
                where = next(
                    (
                        f"{f.filename.split('site-packages/')[-1]}:{f.lineno} {f.name}"
                        for f in reversed(frames)
                        if "warnings" not in f.filename
                    ),
                    "?",
                )
                self.examples.append(f"{str(message)[:80]} at {where}")


def liger_function_cross_entropy_sum(
    hidden, weight, targets, bias=None, *, ignore_index: int = -100, label_smoothing: float = 0.0
):
    """The fused head through liger's own ``liger_fused_linear_cross_entropy``, as fastlm called it until
    2026-11-27: the sum reduction, fp32 gradient sums, the hidden states in the weight's dtype."""
    import torch
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    loss = liger_fused_linear_cross_entropy(
        hidden.to(weight.dtype).contiguous(),
        weight,
        targets.contiguous(),
        bias=bias,
        ignore_index=ignore_index,
        label_smoothing=float(label_smoothing),
        reduction="sum",
        accum_dtype=torch.float32,
    )
    return loss.float()


def use_liger_function() -> None:
    """This process's fused head (``train.loss.fused_linear_kernel`` liger) through liger's own function
    instead of fastlm's loop over its kernel: the A/B of that loop's host syncs."""
    from fastlm.engine.model import liger

    liger.liger_linear_cross_entropy_sum = liger_function_cross_entropy_sum


@dataclass(frozen=True)
class Variant:
    """What a fastlm contender changes from ``fastlm_compile`` / ``fastlm_eager`` (``run_fastlm``'s keywords),
    and its name in ``CONTENDERS``. ``adapter``: lora / qlora; ``liger_function``: liger's own autograd
    function for the fused head (``fastlm_lora_liger_function``, ``use_liger_function``); ``fused_linear``:
    ``train.loss.fused_linear`` in place of ``--fused-linear`` (``fastlm_lora_unfused``: off);
    ``fused_kernel``: ``train.loss.fused_linear_kernel`` in place of ``--fused-kernel``
    (``fastlm_lora_own_head``: fastlm); ``peft_forward``: peft's own LoRA forward
    (``fastlm_lora_peft_forward``); ``own_inputs``: each LoRA layer on its own, no shared-input groups
    (``fastlm_lora_own_inputs``); ``param_dtype``: ``train.runtime.param_dtype`` in place of ``--param-dtype``
    (``fastlm_eager_fp32_weights``: fp32); ``in_backward``: ``train.optimizer.in_backward``
    (``fastlm_eager_in_backward``); ``compile_mode``: ``train.runtime.compile_mode`` in place of
    ``--compile-mode``, compiled by layers (``fastlm_lora_cudagraphs``: reduce-overhead;
    ``fastlm_lora_compiled`` / ``fastlm_qlora_compiled``: default); ``liger``: ``train.model.liger`` in
    place of ``--liger``, the head's kernel left as ``--liger`` implies (``fastlm_compile_inductor_layers``:
    off)."""

    adapter: str | None = None
    fused_linear: str | None = None
    fused_kernel: str | None = None
    peft_forward: bool = False
    param_dtype: str | None = None
    in_backward: bool = False
    liger_function: bool = False
    own_inputs: bool = False
    compile_mode: str | None = None
    liger: str | None = None

    def name(self, compile_: bool) -> str:
        adapter = self.adapter
        name = f"fastlm_{adapter}" if adapter else "fastlm_compile" if compile_ else "fastlm_eager"
        suffixes = (
            (self.fused_linear == "off" and adapter, "_unfused"),
            (self.fused_kernel == "fastlm" and adapter, "_own_head"),
            (self.peft_forward and adapter, "_peft_forward"),
            (self.own_inputs and adapter, "_own_inputs"),
            (self.param_dtype == "fp32" and not adapter, "_fp32_weights"),
            (self.param_dtype == "fp32" and adapter, "_fp32_adapters"),
            (self.in_backward and not adapter, "_in_backward"),
            (self.liger_function and adapter, "_liger_function"),
            (self.compile_mode == "reduce-overhead" and adapter, "_cudagraphs"),
            (self.compile_mode == "default" and adapter, "_compiled"),
            (self.liger == "off" and compile_ and not adapter, "_inductor_layers"),
        )
        return name + "".join(suffix for wanted, suffix in suffixes if wanted)


def run_fastlm(ctx: GpuContext, compile_: bool, **options) -> dict:
    """One fastlm contender, compiled or not, with the changes ``options`` names (``Variant``)."""
    from time import perf_counter

    import torch

    from fastlm.engine.data.token_dataset import TokenSequences
    from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
    from fastlm.engine.runtime.regions import compiled_layers
    from fastlm.engine.train.loop import train

    args = ctx.args
    warmup, steps = args.warmup, args.steps
    log_every = warmup if warmup >= 2 else steps
    variant = Variant(**options)
    adapter, compile_mode = variant.adapter, variant.compile_mode
    name = variant.name(compile_)
    if variant.liger_function and adapter:
        use_liger_function()
    end = warmup + steps
    runtime = setup_runtime(
        RuntimeConfig(
            device=str(ctx.device),
            precision=args.precision,
            compile=compile_,
            num_threads=args.threads,
            seed=0,
        )
    )
    if adapter:
        model, init_digest, n_params = ctx.build_adapter_model(
            adapter == "qlora", not variant.peft_forward, not variant.own_inputs
        )
    else:  # the full fine-tune: --checkpointing through the engine's own policies (as build_model does)
        from fastlm.engine.model.recompute import enable_checkpointing

        model, init_digest, n_params = ctx.build_model()
        enable_checkpointing(model, args.checkpointing)
    ctx.mark_loaded(model)
    progress(f"model ready on {ctx.device} ({n_params:,} parameters); training {warmup} + {steps} steps")
    train_set = TokenSequences(ctx.values, ctx.offsets)
    params = fastlm_params(
        ctx,
        compile_=compile_,
        max_steps=end,
        log_every=log_every,
        name=name,
        adapter=adapter,
        fused_linear=variant.fused_linear,
        fused_kernel=variant.fused_kernel,
        fused_forward=not variant.peft_forward,
        param_dtype=variant.param_dtype,
        in_backward=variant.in_backward,
        shared_input=not variant.own_inputs,
        compile_mode=compile_mode,
        liger=variant.liger,
    )
    flushed_at: dict[int, float] = {}
    sync = SyncCounter()

    def on_record(kind: str, record: dict) -> None:
        if kind != "train":
            return
        flushed_at[record["step"]] = perf_counter()
        progress(f"step {record['step']} of {end} logged (loss {record['loss']:.4f})")
        if ctx.on_cuda and record["step"] == warmup:
            ctx.reset_peak()  # steady-state peak (the compile warm-up is excluded)
            torch.cuda.set_sync_debug_mode("warn")
        if ctx.on_cuda and record["step"] == end:
            torch.cuda.set_sync_debug_mode(0)

    ctx.reset_peak()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = sync.hook
        result = train(
            model,
            train_set,
            None,
            params=params,
            runtime=runtime,
            pad_id=ctx.pad_id,
            max_length=args.seq_len,
            attn=ctx.attn,
            callbacks=[on_record],
        )
    if ctx.on_cuda:
        torch.cuda.set_sync_debug_mode(0)
    peak, host_memory = ctx.peak_memory_mb(), ctx.cpu_memory()  # before the loss check's forward passes
    window = real = computed = waited = 0.0
    previous = warmup
    for record in result.history:
        if warmup < record["step"] <= end:
            seconds = record["step_time_s"] * (record["step"] - previous)
            window += seconds
            real += record["real_tokens_per_s"] * seconds
            computed += record["tokens_per_s"] * seconds
            waited += record["data_wait_share"] * seconds
            previous = record["step"]
    trained = result.model
    out = {
        "contender": name,
        "init": init_digest,
        "parameters": n_params,
        "attn": trained.config._attn_implementation,
        "trainable_parameters": sum(p.numel() for p in trained.parameters() if p.requires_grad),
        "steps_timed": steps,
        "warmup": warmup,
        "window_s": window,
        "wall_s": flushed_at[end] - flushed_at[warmup] if warmup in flushed_at else None,
        "real_tokens_per_s": real / window,
        "computed_tokens_per_s": computed / window,
        "padding_waste": 1 - real / computed,
        "step_time_s": window / steps,
        "data_wait_share": waited / window,
        **ctx.mfu(trained, real / window),
        "first_step_s": result.summary.get("first_step_s"),
        "compiled": result.summary.get("compiled"),
        "compile_scope": ("layers" if compile_mode else args.compile_scope) if compile_ else None,
        "compile_mode": (compile_mode or args.compile_mode) if compile_ else None,
        # what was compiled in place, read off the trained model (layers scope: all but an adapter model's
        # first layer, whose input needs no gradient)
        "compiled_layers": compiled_layers(trained),
        # reduce-overhead: the CUDA graphs recorded and the compiled graphs run without one (the run's count)
        "cuda_graphs": result.summary.get("cuda_graphs"),
        "peak_memory_mb": peak,
        "cpu_memory": host_memory,
        "max_micro_batch_tokens": args.batch_size * args.seq_len,  # packed: token slots per micro-batch
        "accumulation": args.accumulation,  # micro-batches per optimizer step
        "fused_linear": result.summary.get("fused_linear"),
        "fused_linear_choice": result.summary.get("fused_linear_choice"),
        "param_dtype": result.summary.get("param_dtype"),
        # train.runtime.float8: auto's measured choice on the first micro-batch, or the rule's reason
        "float8_choice": getattr(result.runtime, "float8_choice", None),
        "lora_fused_layers": lora_fused_layers(trained) if adapter else None,
        "lora_shared_input_layers": lora_shared_input_layers(trained) if adapter else None,
        "gradient_checkpointing": result.summary.get("gradient_checkpointing"),
        "final_loss": result.history[-1]["loss"],
        "sync_between_log_steps": sync.between if ctx.on_cuda else None,
        "sync_at_log_steps": sync.at_log_step if ctx.on_cuda else None,
        "sync_examples": sync.examples,
    }
    # once per set-up: an A/B variant differs from fastlm_lora in one kernel, not in packing (about 20 s of a
    # 55 s contender on the H100: four attention paths, flex_attention's compile among them)
    ab = name in AB_CONTENDERS + FULL_AB_CONTENDERS
    if not ab and args.result:  # the figures, should the cap come during the check (measured_before_the_cap)
        write_partial(args.result, {**out, "loss_check": LOSS_CHECK_CUT})
    out["loss_check"] = None if ab else packed_vs_unpacked(ctx, trained, runtime)
    return out


def first_step_line(name: str, run: dict) -> str:
    """A fastlm run's first step (not timed) and where its compile went: into that step, or, where float8
    auto measured itself on the first micro-batch (``FLOAT8_MEASURED``), into that measurement before it."""
    if not run.get("compiled"):
        where = ""
    elif FLOAT8_MEASURED in (run.get("float8_choice") or ""):
        where = "compiled before it, in float8 auto's measurement on the first micro-batch; "
    else:
        where = "torch.compile included; "
    return f"{name}: first step {run['first_step_s']:.1f} s ({where}{compiled_where(run)}not timed)"


def compiled_where(run: dict) -> str:
    """What a compiled fastlm run compiled, for its first-step line: the layers compiled in place (and the
    mode where it is not the default, and what its CUDA graphs did), or the whole model."""
    if not run.get("compiled") or run.get("compiled_layers") is None:
        return ""
    if not run["compiled_layers"]:
        return "the whole model; "
    mode, graphs = run.get("compile_mode"), run.get("cuda_graphs")
    return (
        f"{run['compiled_layers']} layers compiled in place"
        + (f", {mode}" if mode != "default" else "")
        + (f" (CUDA graphs: {graphs})" if graphs else "")
        + "; "
    )


def lora_shared_input_layers(model) -> int:
    """How many of ``model``'s LoRA layers compute in a shared-input group (engine/model/lora_forward.py)."""
    from fastlm.engine.model.lora_forward import shares_input

    return sum(1 for module in model.modules() if shares_input(module))


def lora_fused_layers(model) -> int:
    """How many of the model's LoRA layers run fastlm's forward (engine/model/lora_forward.py)."""
    from fastlm.engine.model.lora_forward import is_fused

    return sum(is_fused(module) for module in model.modules())


def attention_paths(device) -> list[str]:
    """Every attention implementation fastlm can run on this machine (CPU: the dense-mask paths only; flex's
    CPU kernel has no backward and compiles for tens of seconds)."""
    import importlib.util

    import torch

    from fastlm.engine.model.attention.choice import torch_varlen_available

    paths = ["sdpa", "eager"]
    if device.type == "cuda":
        paths.append("flex_attention")
        if importlib.util.find_spec("flash_attn") is not None:
            paths.append("flash_attention_2")
        if (
            importlib.util.find_spec("flash_attn_interface") is not None
            and torch.cuda.get_device_capability(device)[0] == 9
        ):
            paths.append("flash_attention_3")
        if torch_varlen_available(device):
            paths.append("torch_varlen")
    return paths


def packed_vs_unpacked(ctx: GpuContext, model, runtime) -> dict:
    """Mean loss of samples packed into ``LOSS_CHECK_ROWS`` rows (several samples each) vs. each sample run
    alone (no padding), same weights, through the engine's own input builder, on every attention path."""
    import torch

    from fastlm.engine.data.collators import PackedCollator
    from fastlm.engine.data.packing import TokenBudget
    from fastlm.engine.model.attention.inputs import to_device
    from fastlm.engine.model.loss import causal_lm_loss_sum, forward_logits

    seq_len = ctx.args.seq_len
    rows: list[list] = [[]]
    used = 0
    for index in range(len(ctx.lengths)):
        length = int(ctx.lengths[index])
        if length < 2 or length > seq_len // 2:  # at least two samples per row
            continue
        if used + length > seq_len:
            if len(rows) == LOSS_CHECK_ROWS:
                break
            rows.append([])
            used = 0
        rows[-1].append(ctx.values[ctx.offsets[index] : ctx.offsets[index + 1]])
        used += length
    picked = [ids for row in rows for ids in row]
    collator = PackedCollator(
        pad_id=ctx.pad_id,
        budget=TokenBudget(row_length=seq_len, rows_per_batch=len(rows)),
        attention_mask_format="none",
    )
    host_batch = collator([{"input_ids": ids} for ids in picked])
    config = model.config
    trained_with = config._attn_implementation
    model.eval()
    checks = {}
    tol = LOSS_TOL.get(runtime.precision, LOSS_TOL["bf16"])
    with torch.no_grad(), runtime.autocast_context():
        config._attn_implementation = "sdpa"
        alone_sum = alone_n = 0.0
        for ids in picked:
            tensor = torch.as_tensor(ids, dtype=torch.long, device=ctx.device)[None]
            loss_sum, n = causal_lm_loss_sum(model(input_ids=tensor).logits, tensor)
            alone_sum, alone_n = alone_sum + float(loss_sum), alone_n + int(n)
        alone = alone_sum / alone_n
        for attn in attention_paths(ctx.device):
            config._attn_implementation = attn
            try:
                batch = to_device(host_batch, ctx.device, attn)
                packed_sum, packed_n = causal_lm_loss_sum(forward_logits(model, batch), batch["labels"])
                packed = float(packed_sum) / int(packed_n)
                rel = abs(packed - alone) / max(abs(alone), 1e-9)
                checks[attn] = {"packed": packed, "rel_diff": rel, "ok": rel <= tol}
            except Exception as error:  # a kernel this GPU cannot run: reported, not fatal
                checks[attn] = {"error": f"{type(error).__name__}: {str(error)[:120]}", "ok": False}
    config._attn_implementation = trained_with
    model.train()
    return {
        "samples": len(picked),
        "rows": len(rows),
        "tokens": int(host_batch["num_real_tokens"]),
        "unpacked": alone,
        "tolerance": tol,
        "paths": checks,
        "ok": all(c["ok"] for c in checks.values()),
    }


class RealTokenCounter(CountingCollator):
    """``train_speed.CountingCollator`` that also handles padding-free batches (no attention mask)."""

    def __call__(self, features):
        batch = self.collator(features)
        mask = batch.get("attention_mask")
        self.real.append(int(mask.sum()) if mask is not None else int(batch["input_ids"].numel()))
        self.computed.append(int(batch["input_ids"].numel()))
        return batch


def lora_variant(name: str) -> dict:
    """``--lora-variant``'s switches, named as fastlm's ``train.model.lora`` and peft's ``LoraConfig`` both
    name them."""
    return {"use_rslora": name == "rslora", "use_dora": name == "dora"}


def trainer_adapter_model(ctx: GpuContext, adapter: str, best: bool, attn: str):
    """The Trainer's LoRA / QLoRA model, built as the peft and transformers docs show it, on the saved
    base."""
    import torch
    from peft import LoraConfig, TaskType, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    bf16 = ctx.args.precision == "bf16"  # the frozen base in bf16 (CPU too), as fastlm's
    load = {"dtype": torch.bfloat16 if bf16 else torch.float32, "attn_implementation": attn}
    if adapter == "qlora":
        load["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
        load["device_map"] = {"": torch.cuda.current_device() if ctx.on_cuda else "cpu"}
    model = AutoModelForCausalLM.from_pretrained(str(ctx.base_folder()), **load)
    model.config.use_cache = False
    digest = None if adapter == "qlora" else base_digest(model)
    if adapter == "qlora":  # usual: peft's default (checkpointing on); best: --checkpointing
        model = prepare_model_for_kbit_training(
            model,
            use_gradient_checkpointing=not best or ctx.args.checkpointing != "off",
            gradient_checkpointing_kwargs={"use_reentrant": False},
        )
    config = LoraConfig(
        task_type=TaskType.CAUSAL_LM,
        r=LORA["r"],
        lora_alpha=LORA["alpha"],
        lora_dropout=ctx.args.lora_dropout,
        target_modules=LORA_TARGETS,
        **lora_variant(ctx.args.lora_variant),
    )
    model = get_peft_model(model, config)
    if best and ctx.args.checkpointing != "off":
        trainer_checkpointing(model, ctx.args.checkpointing)
        model.enable_input_require_grads()
    from fastlm.engine.model.lora import model_parameters  # 4-bit weights unpacked

    return model, digest, model_parameters(model)


def trainer_checkpointing(model, policy: str) -> str:
    """``--checkpointing`` in a Trainer's best set-up, through transformers' own per-layer switch (selective:
    every other layer; full: each; off: none), as fastlm's ``train.model.gradient_checkpointing``; the set-up
    text saying so."""
    if policy != "off":
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False},
            every_n_layers=2 if policy == "selective" else 1,
        )
    return f"gradient checkpointing {policy}"


def trainer_padding_free(choice: str, varlen: bool, on_cuda: bool) -> bool:
    """Whether a Trainer's best set-up takes the padding-free ``DataCollatorWithFlattening``. ``on``: also
    with a dense-mask attention (transformers builds the block-diagonal mask from the position ids);
    ``auto``: with a varlen kernel, and on CPU, where SDPA's block-diagonal mask was measured faster than
    length grouping (3B shape: Trainer + peft QLoRA, 2 layers, 198 against 117 real tok/s; the full
    fine-tune, 1 layer, 100 against 32)."""
    if choice == "off":
        return False
    return choice == "on" or varlen or not on_cuda


def trainer_liger(on_cuda: bool, installed: bool, fields: set[str], wanted: bool = True) -> tuple[dict, str]:
    """The Trainer's Liger switch for its best set-ups (``use_liger_kernel=True``: liger's fused RMSNorm,
    rotary, SwiGLU and fused linear cross-entropy, patched in by the Trainer, through peft too): its
    ``TrainingArguments`` and the set-up text saying which, or why not (``wanted``: ``--trainer-liger``)."""
    if not wanted:
        return {}, "no Liger kernels (--trainer-liger off)"
    if not on_cuda:
        return {}, "no Liger kernels (Triton: CUDA only)"
    if not installed:
        return {}, "no Liger kernels (liger-kernel is not installed)"
    if "use_liger_kernel" not in fields:
        return {}, "no Liger kernels (this transformers' TrainingArguments has no use_liger_kernel)"
    return {"use_liger_kernel": True}, "Liger kernels (use_liger_kernel=True)"


def checkpointed_layers(model) -> int:
    """Decoder layers whose activations transformers' checkpointing recomputes in the backward."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return sum(
        1 for m in model.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing
    )


def trainer_compile_env(compiled: bool) -> tuple[dict[str, str], str]:
    """accelerate's switches for the Trainer's (and TRL's) torch_compile in their best set-up, set in the
    contender's process, and the set-up text: dynamic shapes from the first compile (under dynamo's automatic
    dynamic shapes a padding-free batch's new token count compiles the whole model a second time) and
    regional compilation (each repeated decoder layer compiled once and reused, as fastlm's compile by
    layers). The Trainer builds its TorchDynamoPlugin with ``dynamic=None``, which reads both."""
    if not compiled:
        return {}, ""
    env = {"ACCELERATE_DYNAMO_USE_DYNAMIC": "1", "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "1"}
    return env, " (dynamic shapes, regional compilation: " + ", ".join(f"{k}=1" for k in env) + ")"


def run_trainer(ctx: GpuContext, best: bool, adapter: str | None = None, trl: bool = False) -> dict:
    """A Trainer contender (usual or best set-up, full fine-tune or Trainer + peft); ``trl``: TRL's
    ``SFTTrainer`` in its best set-up instead (``trl_lora_best`` / ``trl_qlora_best``)."""
    import dataclasses
    from time import perf_counter

    import datasets
    import numpy as np
    import pyarrow as pa
    import torch
    from datasets.table import InMemoryTable
    from transformers import DataCollatorForLanguageModeling, TrainerCallback, TrainingArguments

    args = ctx.args
    warmup, steps = args.warmup, args.steps
    datasets.disable_progress_bars()
    if ctx.on_cuda:
        # the usual set-up: torch defaults; best sets tf32 below
        torch.backends.cuda.matmul.allow_tf32 = False
    # The usual set-up pads (SDPA for it on a varlen machine: varlen kernels need the flattened view); the
    # best one gets the padding-free DataCollatorWithFlattening with cu_seq_lens and the same varlen kernel as
    # fastlm.
    varlen = ctx.attn.startswith("flash_attention") or ctx.attn == "torch_varlen"
    if adapter:
        model, init_digest, n_params = trainer_adapter_model(
            ctx, adapter, best, "sdpa" if varlen and not best else ctx.attn
        )
    else:
        model, init_digest, n_params = ctx.build_model(attn="sdpa" if varlen and not best else None)
    ctx.mark_loaded(model)
    ids = pa.ListArray.from_arrays(
        pa.array(ctx.offsets.astype(np.int32)), pa.array(ctx.values, type=pa.int32())
    )
    train_dataset = datasets.Dataset(
        InMemoryTable(pa.table({"input_ids": ids, "length": pa.array(ctx.lengths.astype(np.int64))}))
    )
    fields = {field.name for field in dataclasses.fields(TrainingArguments)}
    batch_size, setup, accumulation = args.batch_size, "dynamic padding, default arguments", 1
    extra: dict = {}
    padding_free = best and trainer_padding_free(args.padding_free, varlen, ctx.on_cuda)
    # fastlm's packed tokens per optimizer step, in samples of the mean length
    same_tokens = max(1, round(args.batch_size * args.seq_len / float(ctx.lengths.mean())))
    if trl:  # TRL packs itself (best-fit decreasing into rows of seq_len): fastlm's rows per micro-batch
        collator, setup = None, "SFTTrainer packing (best-fit decreasing, padding-free)"
    elif padding_free:
        from transformers import DataCollatorWithFlattening

        collator = RealTokenCounter(
            DataCollatorWithFlattening(return_position_ids=True, return_flash_attn_kwargs=True)
        )
        batch_size = same_tokens
        setup = "DataCollatorWithFlattening (padding-free)"
    else:
        collator = RealTokenCounter(DataCollatorForLanguageModeling(ctx.tokenizer, mlm=False))
        longest = int(ctx.lengths.max())
        if adapter and not best:  # the adapter comparison is at equal tokens per optimizer step, usual too
            batch_size, accumulation = padded_micro_batches(
                same_tokens, args.batch_size, args.seq_len, longest
            )
            extra["gradient_accumulation_steps"] = accumulation
            setup = f"dynamic padding, gradient_accumulation_steps={accumulation}"
        if best:
            if "group_by_length" in fields:
                extra["group_by_length"] = True
            elif "train_sampling_strategy" in fields:
                extra["train_sampling_strategy"] = "group_by_length"
            # padded rows cost up to the longest sample each: micro-batches within fastlm's micro-batch
            # tokens, accumulated to the same tokens per optimizer step
            batch_size, accumulation = padded_micro_batches(
                same_tokens, args.batch_size, args.seq_len, longest
            )
            extra["gradient_accumulation_steps"] = accumulation
            setup = f"dynamic padding + length grouping ({', '.join(f'{k}={v}' for k, v in extra.items())})"
    if args.accumulation > 1:  # --accumulation: every side's micro-batches per optimizer step, multiplied
        accumulation *= args.accumulation
        extra["gradient_accumulation_steps"] = accumulation
        setup += f", x{args.accumulation} accumulated"
    if best:
        extra["torch_compile"] = args.compile != "off" and args.trainer_compile == "on"
        if ctx.on_cuda:
            extra["tf32"] = True
        compile_env, compile_note = trainer_compile_env(extra["torch_compile"])
        os.environ.update(compile_env)  # this contender's own process
        # a compile cut at its cap shows its recompiles and graph breaks in the output tail
        if extra["torch_compile"]:
            torch._logging.set_logs(recompiles=True, graph_breaks=True)
        setup += f", torch_compile={extra['torch_compile']}{compile_note}, tf32={extra.get('tf32', False)}"
        installed = importlib.util.find_spec("liger_kernel") is not None
        liger, note = trainer_liger(ctx.on_cuda, installed, fields, wanted=args.trainer_liger == "on")
        extra.update(liger)
        setup += f", {note}"
        if adapter:  # its builder turned checkpointing on, under peft's wrapper
            extra["optim"] = (
                TRAINER_OPTIM[args.optim] if ctx.on_cuda or args.optim != "adamw" else "adamw_torch"
            )
            setup += f", optim {extra['optim']}, gradient checkpointing {args.checkpointing}"
        else:  # adamw: adamw_torch_fused, the Trainer's default
            extra["optim"] = TRAINER_OPTIM[args.optim]
            setup += f", optim {extra['optim']}, {trainer_checkpointing(model, args.checkpointing)}"
    if trl or not (best and not padding_free):  # the "length" column only serves length grouping
        train_dataset = train_dataset.remove_columns(["length"])

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.begin = 0.0
            self.inside = 0.0
            self.first: float | None = None  # the first step, torch_compile included (not timed)
            self.marks: dict[int, tuple[float, int]] = {}

        def on_step_begin(self, args_, state, control, **kwargs):
            self.begin = perf_counter()

        def on_step_end(self, args_, state, control, **kwargs):
            step = state.global_step
            if step in (1, warmup, warmup + steps):
                progress(f"step {step} of {warmup + steps} done")
            if step in (1, warmup, warmup + steps) and ctx.on_cuda:
                torch.cuda.synchronize()  # close the window (or the first step) on finished GPU work
            now = perf_counter()
            if step == 1:
                self.first = now - self.begin
            if warmup < step <= warmup + steps:
                self.inside += now - self.begin
            if step == warmup:
                ctx.reset_peak()
            if step in (warmup, warmup + steps):
                self.marks[step] = (now, len(collator.real))
            if warmup < step < warmup + steps and warmup in self.marks and args.result:
                # the timed steps so far, for a parent that stops this run at its cap (speed_at_most)
                t0, n0 = self.marks[warmup]
                so_far = {"steps_done": step - warmup, "steps": steps, "window_s": now - t0}
                write_partial(args.result, {**so_far, "real_tokens": sum(collator.real[n0:])})

    timer = StepTimer()
    name = f"trl_{adapter}_" if trl else f"trainer_{adapter}_" if adapter else "trainer_"
    name += "best" if best else "usual"
    common = dict(
        output_dir=str(Path(args.workdir) / f"{name}_out"),
        per_device_train_batch_size=batch_size,
        max_steps=warmup + steps,
        report_to=[],
        save_strategy="no",
        logging_steps=10**9,
        disable_tqdm=True,
        use_cpu=not ctx.on_cuda,
        seed=0,
        bf16=args.precision == "bf16",
        **extra,
    )
    # TRL's own best data path: packing (best-fit decreasing into rows of seq_len, its default strategy) with
    # padding-free batches (one flattened row, position_ids and cu_seq_lens for the varlen kernel), its
    # chunked LM head (no [tokens x vocab] logits); the model prepared as Trainer + peft's best.
    # gradient_checkpointing False: TRL's default (True) would recompute every layer; --checkpointing was
    # applied to the model as in Trainer + peft's best (trainer_adapter_model).
    sft = {
        "packing": True,
        "max_length": args.seq_len,
        "dataset_num_proc": 1,
        "gradient_checkpointing": False,
    }
    trainer, collator = peer_trainer(  # collator: the timer's counter
        model,
        common,
        train_dataset,
        collator,
        ctx.tokenizer,
        timer,
        trl=sft if trl else None,
        counter=RealTokenCounter,
    )
    training_args = trainer.args
    progress(f"{name}: model ready, Trainer built; training {warmup} + {steps} steps ({setup})")
    trainer.train()
    peak, host_memory = ctx.peak_memory_mb(), ctx.cpu_memory()
    (t0, n0), (t1, n1) = timer.marks[warmup], timer.marks[warmup + steps]
    window = t1 - t0
    real, computed = sum(collator.real[n0:n1]), sum(collator.computed[n0:n1])
    return {
        "contender": name,
        "init": init_digest,
        "parameters": n_params,
        "attn": model.config._attn_implementation,
        "setup": setup,
        "batch_samples": batch_size,
        "steps_timed": steps,
        "warmup": warmup,
        "window_s": window,
        "real_tokens_per_s": real / window,
        "computed_tokens_per_s": computed / window,
        "padding_waste": 1 - real / computed,
        "step_time_s": window / steps,
        "data_wait_share": 1 - timer.inside / window,
        **ctx.mfu(model, real / window),
        "peak_memory_mb": peak,
        "cpu_memory": host_memory,
        "max_micro_batch_tokens": max(collator.computed, default=0),  # padded slots of the largest
        "checkpointed_layers": checkpointed_layers(model),
        "args_gradient_checkpointing": bool(training_args.gradient_checkpointing),  # the Trainer's own switch
        "first_step_s": timer.first,
        "compiled": bool(extra.get("torch_compile")),
        "accumulation": accumulation,
        "optim": str(getattr(training_args.optim, "value", training_args.optim)),
    }


def profiled_adapter(results: dict[str, dict]) -> str:
    """The set-up the profile of a missed target runs: that of the run's first fastlm contender (``lora``,
    ``qlora``, or ``none``: a full fine-tune). The adapter run of 2026-11-26 (docs/gpu-runs, h100-c)
    profiled a full fine-tune of its 3B base instead, the profile's only set-up then."""
    first = next((name for name in results if name.startswith("fastlm")), "")
    return (
        "qlora" if first.startswith("fastlm_qlora") else "lora" if first.startswith("fastlm_lora") else "none"
    )


KERNEL_KINDS = (  # (kind, what a CUDA kernel's name holds), the first that matches; inductor's names start so
    ("inductor", ("triton_poi_", "triton_red_", "triton_per_", "triton_tem_")),
    ("attention", ("flash", "fmha", "attention")),
    ("matmul", ("nvjet", "gemm", "cutlass", "xmma", "cublas", "splitkreduce")),
    ("liger", ("_rms_norm", "_swiglu", "_geglu", "_rope", "liger", "_cross_entropy", "layer_norm_")),
    ("optimizer", ("multi_tensor_apply", "fusedoptimizer", "fused_adam")),
    ("copy", ("copy", "memcpy", "memset", "fill")),
    ("elementwise", ("elementwise", "reduce_kernel", "reduction")),
)


def kernel_kinds(kernels: dict[str, list[float]], steps: int) -> list[dict]:
    """Every kernel of a profile (name -> [calls, microseconds]) summed by kind (``KERNEL_KINDS``; ``other``
    for the rest): calls and milliseconds a step over ``steps`` profiled steps and the share of kernel time,
    largest first. Where the top 10 kernels of two profiles cannot say which kind of work took longer."""
    sums: dict[str, list[float]] = {}
    for name, (calls, us) in kernels.items():
        low = name.lower()
        kind = next(
            (
                k
                for k, marks in KERNEL_KINDS
                if any(low.startswith(m) if k == "inductor" else m in low for m in marks)
            ),
            "other",
        )
        row = sums.setdefault(kind, [0, 0.0])
        row[0] += calls
        row[1] += us
    total = sum(us for _, us in sums.values())
    rows = [
        {
            "kind": kind,
            "calls_per_step": calls / steps,
            "ms_per_step": us / 1e3 / steps,
            "share": us / total if total else None,
        }
        for kind, (calls, us) in sums.items()
    ]
    return sorted(rows, key=lambda row: row["ms_per_step"], reverse=True)


def profiled_compile(results: dict[str, dict], args: argparse.Namespace) -> str:
    """``on`` / ``off``: the compile of the run's first fastlm contender, which the profile of a missed target
    runs (``fastlm_eager*`` eager, ``fastlm_compile*`` and CUDA graphs compiled, the adapter contenders as
    ``--compile`` asks). A full fine-tune run of 2026-11-28 (docs/gpu-runs, h200-3-full_trainer_compiled)
    measured fastlm eager and profiled it compiled by layers: ``--compile both`` compiled every profile."""
    first = next((name for name in results if name.startswith("fastlm")), "")
    if first.startswith("fastlm_eager"):
        return "off"
    if first.startswith("fastlm_compile") or first.endswith(("_cudagraphs", "_compiled")):
        return "on"
    return "off" if args.compile == "off" else "on"


def run_profile(ctx: GpuContext) -> dict:
    """A few fastlm steps under the engine's StepProfiler (the set-up of ``--profile-adapter``); the top CUDA
    kernels from its Chrome trace."""
    from collections import defaultdict

    from fastlm.engine.data.token_dataset import TokenSequences
    from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
    from fastlm.engine.train.loop import train

    args = ctx.args
    compile_ = args.profile_compile == "on"
    runtime = setup_runtime(
        RuntimeConfig(
            device=str(ctx.device),
            precision=args.precision,
            compile=compile_,
            num_threads=args.threads,
            seed=0,
        )
    )
    adapter = None if args.profile_adapter == "none" else args.profile_adapter
    if adapter:
        model, _, _ = ctx.build_adapter_model(adapter == "qlora")
    else:
        model, _, _ = ctx.build_model()
    trace_dir = Path(args.workdir) / "profile"
    params = fastlm_params(
        ctx,
        compile_=compile_,
        max_steps=args.warmup + 3,
        log_every=args.warmup + 3,
        name="profile",
        profile={"enabled": True, "start_step": args.warmup + 1, "steps": 3, "trace_dir": str(trace_dir)},
        adapter=adapter,
    )
    result = train(
        model,
        TokenSequences(ctx.values, ctx.offsets),
        None,
        params=params,
        runtime=runtime,
        pad_id=ctx.pad_id,
        max_length=args.seq_len,
        attn=ctx.attn,
    )
    summary = result.summary["profile"]
    kernels: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    total = 0.0
    if summary.get("trace"):
        events = json.loads(Path(summary["trace"]).read_text()).get("traceEvents", [])
        for event in events:
            if event.get("cat") == "kernel" and "dur" in event:
                kernels[event["name"]][0] += 1
                kernels[event["name"]][1] += event["dur"]
                total += event["dur"]
    top = sorted(kernels.items(), key=lambda item: item[1][1], reverse=True)[:10]
    return {
        "contender": "fastlm_profile",
        "adapter": args.profile_adapter,
        "compiled": compile_,
        "window_ms": summary.get("window_ms"),
        "phase_share": summary.get("phase_share"),
        "gpu_idle": summary.get("gpu_idle"),
        "kernel_total_ms": total / 1e3,
        "kernel_kinds": kernel_kinds(kernels, steps=3),
        "top_kernels": [
            {"kernel": k, "calls": c, "ms": d / 1e3, "share": d / total if total else None}
            for k, (c, d) in top
        ],
    }


_CHILD_START = time.perf_counter()


def progress(text: str) -> None:
    """One line of a contender's progress, seconds since its process started: what the parent shows when it
    stops the contender at its cap (model load, compile, steps), not printed otherwise."""
    print(f"+{time.perf_counter() - _CHILD_START:.1f} s: {text}", flush=True)


def child_main(args: argparse.Namespace) -> None:
    import logging

    logging.basicConfig(level=logging.WARNING)
    progress(f"{args.run}: imports done")
    ctx = GpuContext(args)
    progress(f"data ready ({len(ctx.lengths):,} documents)")
    started = time.perf_counter()
    compiled = args.compile != "off"
    runners = {
        "fastlm_compile": lambda: run_fastlm(ctx, True),
        "fastlm_eager": lambda: run_fastlm(ctx, False),
        "trainer_usual": lambda: run_trainer(ctx, False),
        "trainer_best": lambda: run_trainer(ctx, True),
        "fastlm_profile": lambda: run_profile(ctx),
        **{f"fastlm_{a}": (lambda a=a: run_fastlm(ctx, compiled, adapter=a)) for a in ("lora", "qlora")},
        "fastlm_eager_fp32_weights": lambda: run_fastlm(ctx, False, param_dtype="fp32"),
        "fastlm_eager_in_backward": lambda: run_fastlm(ctx, False, in_backward=True),
        "fastlm_compile_fp32_weights": lambda: run_fastlm(ctx, True, param_dtype="fp32"),
        "fastlm_compile_inductor_layers": lambda: run_fastlm(ctx, True, liger="off"),
        "fastlm_lora_unfused": lambda: run_fastlm(ctx, compiled, adapter="lora", fused_linear="off"),
        "fastlm_lora_own_head": lambda: run_fastlm(ctx, compiled, adapter="lora", fused_kernel="fastlm"),
        "fastlm_lora_liger_function": lambda: run_fastlm(ctx, compiled, adapter="lora", liger_function=True),
        "fastlm_lora_own_inputs": lambda: run_fastlm(ctx, compiled, adapter="lora", own_inputs=True),
        "fastlm_lora_fp32_adapters": lambda: run_fastlm(ctx, compiled, adapter="lora", param_dtype="fp32"),
        "fastlm_lora_cudagraphs": lambda: run_fastlm(
            ctx, True, adapter="lora", compile_mode="reduce-overhead"
        ),
        **{
            f"fastlm_{a}_compiled": (lambda a=a: run_fastlm(ctx, True, adapter=a, compile_mode="default"))
            for a in ("lora", "qlora")
        },
        **{
            f"fastlm_{a}_peft_forward": (lambda a=a: run_fastlm(ctx, compiled, adapter=a, peft_forward=True))
            for a in ("lora", "qlora")
        },
        "base": lambda: {"contender": "base", "folder": str(ctx.base_folder())},
        **{
            f"trainer_{a}_{kind}": (lambda a=a, kind=kind: run_trainer(ctx, kind == "best", adapter=a))
            for a in ("lora", "qlora")
            for kind in ("usual", "best")
        },
        **{
            f"trl_{a}_best": (lambda a=a: run_trainer(ctx, True, adapter=a, trl=True))
            for a in ("lora", "qlora")
        },
    }
    host_before = host_us_per_op(ctx.device)
    info = runners[args.run]()
    if args.run != "base":  # the host's dispatch speed around the contender (host_us_per_op)
        info["host_us_per_op"] = [host_before, host_us_per_op(ctx.device)]
    info["device"] = str(ctx.device)
    info["child_run_s"] = time.perf_counter() - started
    info["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    Path(args.result).write_text(json.dumps(info, default=str))


def write_partial(result: str, so_far: dict) -> None:
    """``so_far`` into the child's ``partial_path``, whole or not at all (written beside it, then renamed):
    a few hundred microseconds in a peer's step that takes a tenth of a second or more."""
    path = partial_path(result)
    scratch = path.with_suffix(".tmp")
    scratch.write_text(json.dumps(so_far))
    os.replace(scratch, path)


def host_figures(figures) -> str:
    """``host_us_per_op`` before / after a contender, as the table shows them."""
    return "-" if not figures else " / ".join(f"{value:.1f}" for value in figures)


def host_us_per_op(device, ops: int = 2000, rounds: int = 5) -> float:
    """The host's cost of one dispatched op, microseconds: the median over ``rounds`` of ``ops`` in-place adds
    on a 16-element tensor of ``device``, synchronized at the end of each round. On a GPU such kernels run
    faster than they launch, so this is the launch path (Python, dispatcher, CUDA launch) that a host-bound
    step pays per op; on a CPU, the dispatch and a tiny kernel. Measured in each contender's process before
    and after it trains: a contended or slower host (another call, another machine) shows here, where it
    would otherwise be read from the contenders' figures alone."""
    import statistics

    import torch

    x = torch.zeros(16, device=device)
    synchronize = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    synchronize()
    figures = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(ops):
            x.add_(1.0)
        synchronize()
        figures.append((time.perf_counter() - started) / ops * 1e6)
    return statistics.median(figures)


# --------------------------------------------------------------------------------------------------
# Parent
# --------------------------------------------------------------------------------------------------


def run_child(
    name: str,
    args: argparse.Namespace,
    workdir: Path,
    index: int,
    *,
    timeout_s: float | None = None,
    trainer_compile: str = "on",
) -> dict:
    here = str(Path(__file__).resolve().parent)
    return run_contender(
        Path(__file__),
        name,
        workdir,
        index,
        repo=REPO,
        timeout_s=timeout_s,
        extra_args=[
            "--steps",
            str(args.steps),
            "--warmup",
            str(args.warmup),
            "--batch-size",
            str(args.batch_size),
            "--accumulation",
            str(args.accumulation),
            "--seq-len",
            str(args.seq_len),
            "--threads",
            str(args.threads),
            "--device",
            args.device,
            "--model",
            args.model,
            "--precision",
            args.precision,
            "--compile",
            args.compile,
            "--attn",
            args.attn,
            "--trainer-compile",
            trainer_compile,
            "--compile-scope",
            args.compile_scope,
            "--compile-mode",
            args.compile_mode,
            "--checkpointing",
            args.checkpointing,
            "--optim",
            args.optim,
            "--liger",
            args.liger,
            "--trainer-liger",
            args.trainer_liger,
            "--fused-linear",
            args.fused_linear,
            *(("--fused-kernel", args.fused_kernel) if args.fused_kernel else ()),
            "--param-dtype",
            args.param_dtype,
            "--padding-free",
            args.padding_free,
            "--lora-variant",
            args.lora_variant,
            "--lora-dropout",
            str(args.lora_dropout),
            "--profile-adapter",
            args.profile_adapter,
            "--profile-compile",
            args.profile_compile,
            *(("--layers", str(args.layers)) if args.layers else ()),
        ],
        extra_env={"PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))},
    )


def skip_reason(name: str, args: argparse.Namespace, on_cuda: bool) -> str | None:
    """Why this machine cannot run a contender (printed), or None."""
    from fastlm.engine.config import bitsandbytes_missing

    if name.startswith(("trainer", "trl")) and importlib.util.find_spec("accelerate") is None:
        return "accelerate is not installed (transformers.Trainer needs it)"
    if name.startswith("trl") and importlib.util.find_spec("trl") is None:
        return "trl is not installed (pip install -e '.[bench]')"
    adapter = name in ADAPTER_CONTENDERS + TRL_CONTENDERS + AB_CONTENDERS
    needs_bitsandbytes = "qlora" in name or (adapter and args.optim != "adamw")
    missing = bitsandbytes_missing() if needs_bitsandbytes else None
    if missing:
        return f"{'QLoRA' if 'qlora' in name else f'--optim {args.optim}'} needs bitsandbytes: {missing}"
    if adapter and args.optim.startswith("paged_") and not on_cuda:
        return f"--optim {args.optim} needs CUDA (paged states)"
    return None


class Budget:
    """``--budget-s`` for the whole script: each remaining contender gets an equal share of what is left."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.start = seconds, time.perf_counter()

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.start)

    def share(self, remaining_runs: int) -> float:
        return max(self.left() / max(remaining_runs, 1), 1.0)


def run_contender_in_budget(
    name: str,
    args: argparse.Namespace,
    workdir: Path,
    position: tuple[int, int],
    budget: Budget,
    results: dict,
) -> dict:
    """One contender's run with its share of ``budget`` (``position``: its index and the contenders' count).
    A Trainer best set-up keeps time for a run without torch_compile (1.5x its usual set-up's wall time when
    that ran, else ``EAGER_TRAINER_S``): its compile try gets what is left of its share, or is not tried under
    ``MIN_COMPILE_TRY_S``; a try that does not finish or fails is run again without torch_compile, and says
    so (on the H200, 2026-11-28, its compile stopped in inductor's autotuning: an illegal memory access)."""
    index, count = position
    cap = budget.share(count - index)
    best = name.startswith(("trainer", "trl")) and name.endswith("_best") and args.compile != "off"
    note = None
    if best:
        usual = results.get(name.replace("_best", "_usual"), {})
        reserve = 1.5 * usual.get("process_wall_s", EAGER_TRAINER_S)
        cap = min(cap, budget.left() - reserve)
        if cap < MIN_COMPILE_TRY_S:
            note = f"torch_compile not tried: {budget.left():.0f} s left, {reserve:.0f} s kept for eager"
    if note is None:
        label = model_label(args)
        print(f"[{index + 1}/{count}] {name}, {label} (at most {cap:.0f} s) ...", flush=True)
        run = run_child(name, args, workdir, index, timeout_s=cap)
        if name.startswith("fastlm"):
            return measured_before_the_cap(run, cap)
        if not (best and "error" in run):
            return run
        note = f"torch_compile {run['error']}" if run.get("timed_out") else f"torch_compile {failure(run)}"
    cap = budget.share(count - index)
    print(f"  {name}: {note}; without torch_compile (at most {cap:.0f} s) ...", flush=True)
    run = run_child(name, args, workdir, index, timeout_s=cap, trainer_compile="off")
    run["compile_note"] = note
    if "setup" in run:
        run["setup"] += f" ({note})"
    return run


def measured_before_the_cap(run: dict, cap_s: float) -> dict:
    """A fastlm child stopped at its cap after its timed steps, in the loss check that follows them: the
    figures it wrote before that check (``run_fastlm``), the check reported as cut; any other run as it is
    (a peer's partial is its step timer's, a bound: ``speed_at_most``)."""
    partial = run.get("partial") or {}
    if not run.get("timed_out") or partial.get("loss_check") != LOSS_CHECK_CUT:
        return run
    stopped = f"stopped at its {cap_s:.0f} s cap in its loss check, after its timed steps"
    return {**partial, "process_wall_s": cap_s, "other_load_cores": None, "stopped": stopped}


def failure(run: dict) -> str:
    """``failed (exit N: the last exception line of its output)`` for a child that stopped with an error."""
    lines = [line.strip() for line in run.get("output_tail", "").splitlines()]
    raised = [line for line in lines if EXCEPTION_LINE.match(line)]
    return f"failed ({run['error']}: {raised[-1]})" if raised else f"failed ({run['error']})"


def wants_profile(lines: list[tuple[str, bool | None]], args: argparse.Namespace) -> bool:
    """Whether a run profiles its first fastlm contender after its verdicts (``--profile``)."""
    if args.no_profile or args.profile == "never":
        return False
    return args.profile == "always" or any(ok is False for _, ok in lines)


def profile_skip_reason(results: dict[str, dict], left_s: float) -> str | None:
    """Why the profile of a missed target is not run (None: run it). It runs a fastlm contender again, its
    compile too: only where that contender finished and its own time fits in what is left (a profile started
    with 71 s left behind a compiled 3B run that had not finished did not finish either)."""
    fastlm = {name: run for name, run in results.items() if name.startswith("fastlm")}
    if not fastlm or any("error" in run for run in fastlm.values()):
        return "no fastlm contender finished, a profile of it would not either"
    needs = max(30.0, *(run.get("process_wall_s", 0.0) for run in fastlm.values()))
    if left_s < needs:
        return f"{left_s:.0f} s left, a fastlm run took {needs:.0f} s (again with a larger --budget-s)"
    return None


def gpu_info() -> dict:
    import torch

    from fastlm.engine.observe.metrics import device_peak_flops

    if not torch.cuda.is_available():
        return {"cuda": False}
    props = torch.cuda.get_device_properties(0)
    return {
        "cuda": True,
        "name": props.name,
        "memory_gb": props.total_memory / 2**30,
        "capability": f"{props.major}.{props.minor}",
        "cuda_version": torch.version.cuda,
        "peak_bf16_tflops": (device_peak_flops("cuda") or 0) / 1e12 or None,
        "flash_attn": importlib.util.find_spec("flash_attn") is not None,
    }


def speed_at_most(run: dict) -> tuple[float, int, int] | None:
    """A peer stopped at its cap after some timed steps (``partial``, written by its Trainer's step timer):
    its real tokens over the host's time since the timed window opened, at most its speed over those steps
    (the host does not wait for the GPU's last steps, and counts every micro-batch collated), with the steps
    done and asked; None for a run that finished or timed nothing."""
    partial = run.get("partial") or {}
    if run.get("real_tokens_per_s") or not partial.get("steps_done") or not partial.get("window_s"):
        return None
    return partial["real_tokens"] / partial["window_s"], partial["steps_done"], partial["steps"]


def bounded_verdict(
    a: str, b: str, speed: float, bound: tuple[float, int, int], target: float, on_cuda: bool
) -> tuple[str, bool | None]:
    """``a``'s ratio to a peer ``b`` known only by an upper bound of its speed over the timed steps it ran
    (``speed_at_most``): at least ``speed / bound`` over those steps. Over the target, on at least
    ``MIN_PARTIAL_STEPS`` steps, it passes; otherwise nothing is judged."""
    at_most, done, asked = bound
    ratio = speed / at_most
    why = f"{b} did not finish: at most {at_most:,.0f} real tok/s over {done} of {asked} timed steps"
    if not on_cuda:
        return f"{a} / {b} real tokens/s: at least {ratio:.2f}x ({why}; CPU figures)", None
    if done < MIN_PARTIAL_STEPS:
        why += f", fewer than {MIN_PARTIAL_STEPS} to judge on"
    judged = ratio >= target and done >= MIN_PARTIAL_STEPS
    return f"{a} / {b} real tokens/s >= {target:g}x: at least {ratio:.2f}x ({why})", True if judged else None


def adapter_verdicts(results: dict[str, dict], on_cuda: bool) -> list[tuple[str, bool | None]]:
    """fastlm's LoRA/QLoRA against Trainer + peft (``ADAPTER_PAIRS``): real tokens/s >= ``TARGET_ADAPTER_VS``
    of each set-up and a lower peak memory (``max_memory_allocated``), judged on CUDA; on CPU the speed
    ratios are reported and nothing is judged (the targets are GPU targets)."""
    lines: list[tuple[str, bool | None]] = []
    for a, b in ADAPTER_PAIRS:
        ra, rb = results.get(a, {}), results.get(b, {})
        target = TARGET_ADAPTER_VS[b.rsplit("_", 1)[1]]
        bound = speed_at_most(rb)
        if ra.get("real_tokens_per_s") and bound is not None:
            lines.append(bounded_verdict(a, b, ra["real_tokens_per_s"], bound, target, on_cuda))
            continue
        if not (ra.get("real_tokens_per_s") and rb.get("real_tokens_per_s")):
            continue
        ratio = ra["real_tokens_per_s"] / rb["real_tokens_per_s"]
        if not on_cuda:
            lines.append(
                (f"{a} / {b} real tokens/s: {ratio:.2f}x (CPU figures; target {target:g}x on a GPU)", None)
            )
            continue
        lines.append((f"{a} / {b} real tokens/s >= {target:g}x: {ratio:.2f}x", ratio >= target))
        peak_a, peak_b = ra.get("peak_memory_mb"), rb.get("peak_memory_mb")
        if peak_a and peak_b:
            sides = [checkpointing_of(a, ra), checkpointing_of(b, rb)]
            what = f"; checkpointing: {', '.join(sides)}" if all(sides) else ""
            lines.append(
                (
                    f"{a} / {b} peak memory < 1x: {peak_a / peak_b:.2f}x "
                    f"({peak_a:,.0f} vs {peak_b:,.0f} MiB{what})",
                    peak_a < peak_b,
                )
            )
    return lines


def checkpointing_of(name: str, run: dict) -> str | None:
    """What a contender's run checkpointed, for its memory verdict: a Trainer's layers counted on its model
    (peft's kbit preparation turns it on for every layer), fastlm's setting."""
    if run.get("checkpointed_layers") is not None:
        return f"{name} {run['checkpointed_layers']} layers"
    if run.get("gradient_checkpointing") is not None:
        return f"{name} {run['gradient_checkpointing']}"
    return None


def verdicts(results: dict[str, dict], on_cuda: bool, model: str) -> list[tuple[str, bool | None]]:
    fastlm = [
        r
        for name, r in results.items()
        if name.startswith("fastlm") and "error" not in r and "skipped" not in r
    ]
    full = [r for r in fastlm if r["contender"] in FULL_CONTENDERS]
    best_fast = max(full, key=lambda r: r["real_tokens_per_s"], default=None)
    best_trainer = results.get("trainer_best", {})
    lines: list[tuple[str, bool | None]] = []

    def check(text: str, value, ok) -> None:
        lines.append((f"{text}: {value}", ok))

    lines.extend(adapter_verdicts(results, on_cuda))
    if not fastlm:
        return [*lines, ("fastlm: no successful run", False)]
    if best_fast is not None:
        label = best_fast["contender"]
        mfu = best_fast.get("mfu")
        text = f"{label} MFU >= {TARGET_MFU:.0%} (target set for 0.5b)"
        if mfu is None:
            check(
                text,
                "n/a (" + ("GPU missing from PEAK_BF16_DENSE_FLOPS" if on_cuda else "skipped: no CUDA") + ")",
                None,
            )
        else:
            check(text, f"{mfu:.1%}", mfu >= TARGET_MFU if model == "0.5b" else None)
        target = f"{label} / trainer_best real tokens/s >= {TARGET_VS_BEST:g}x"
        bound = speed_at_most(best_trainer)
        if bound is not None:  # stopped at its cap: its timed steps so far bound the ratio from below
            speed = best_fast["real_tokens_per_s"]
            lines.append(bounded_verdict(label, "trainer_best", speed, bound, TARGET_VS_BEST, on_cuda))
        elif best_trainer.get("real_tokens_per_s"):
            ratio = best_fast["real_tokens_per_s"] / best_trainer["real_tokens_per_s"]
            if on_cuda:
                check(target, f"{ratio:.2f}x", ratio >= TARGET_VS_BEST)
            else:  # a GPU target, as the adapters' (adapter_verdicts): the CPU ratio reported, not judged
                check(
                    f"{label} / trainer_best real tokens/s",
                    f"{ratio:.2f}x (CPU figures; target {TARGET_VS_BEST:g}x on a GPU)",
                    None,
                )
        else:
            check(
                target,
                "n/a (" + best_trainer.get("skipped", best_trainer.get("error", "not run")) + ")",
                None,
            )
    for run in fastlm:
        name = run["contender"]
        wait = run["data_wait_share"]
        check(f"{name} data-wait share <= {TARGET_DATA_WAIT:.0%}", f"{wait:.2%}", wait <= TARGET_DATA_WAIT)
        if run.get("sync_between_log_steps") is None:
            check(f"{name} host syncs between log steps == 0", "skipped: no CUDA", None)
        else:
            check(
                f"{name} host syncs between log steps == 0",
                f"{run['sync_between_log_steps']} (and {run['sync_at_log_steps']} in the log-step flushes)",
                run["sync_between_log_steps"] == 0,
            )
        loss = run["loss_check"]
        if loss == LOSS_CHECK_CUT:
            check(f"{name} packed vs unpacked loss", f"not run: cut ({run['stopped']})", None)
            continue
        if loss is None:
            base = next((a for a, b in AB_PAIRS + FULL_AB_PAIRS if b == name), "fastlm_lora")
            covered = f"not run, an A/B variant ({base}'s check covers its packing)"
            check(f"{name} packed vs unpacked loss", covered, None)
            continue
        for attn, path in loss["paths"].items():
            check(
                f"{name} packed vs unpacked loss on {attn} ({loss['samples']} samples in {loss['rows']} "
                f"rows, {loss['tokens']} tokens)",
                path.get("error")
                or f"{path['packed']:.5f} vs {loss['unpacked']:.5f}, rel diff "
                f"{path['rel_diff']:.2e} (tol {loss['tolerance']:g})",
                path["ok"],
            )
    return lines


def initial_weights_line(results: dict[str, dict]) -> str:
    """Whether the contenders that finished started from the same weights (each child digests its model's
    weights before training; a 4-bit base is not digested: each quantizes the same saved base folder)."""
    inits = {run["init"] for run in results.values() if run.get("init")}
    if inits:
        same = "identical" if len(inits) == 1 else "DIFFERENT"
        return f"initial weights: {same} across contenders ({', '.join(sorted(inits))})"
    if all("error" in run for run in results.values()):
        return "initial weights: not digested (no contender finished)"
    return "initial weights: 4-bit bases, not digested (each quantizes the same saved base folder)"


def report(args, info: dict, gpu: dict, prep: dict, n_params: int, results: dict[str, dict]) -> None:
    print()
    print(
        f"machine: {info['cpu']}; nproc {info['nproc']}, usable cores {info['usable_cores']}, "
        f"torch threads {info['threads']}; load average at start {info['load_average']}"
    )
    print(
        "versions: "
        + ", ".join(f"{k} {v}" for k, v in info["versions"].items())
        + f", python {info['python']}"
    )
    tuning = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
    print("glibc malloc: " + (", ".join(f"{k}={v}" for k, v in sorted(tuning.items())) or "defaults"))
    if gpu.get("cuda"):
        print(
            f"GPU: {gpu['name']}, {gpu['memory_gb']:.0f} GiB, sm {gpu['capability']}, "
            f"CUDA {gpu['cuda_version']}, dense bf16 peak {_fmt(gpu['peak_bf16_tflops'], '.0f')} TFLOP/s, "
            f"flash_attn installed: {gpu['flash_attn']}"
        )
    else:
        print("GPU: none (CUDA not available)")
    print(
        f"model {model_label(args)}: {n_params:,} parameters; seq_len {args.seq_len}; "
        f"precision {args.precision}; "
        f"fastlm batch {args.batch_size} packed rows"
        + (f" x {args.accumulation} micro-batches a step" if args.accumulation > 1 else "")
        + f"; warmup {args.warmup} + {args.steps} timed steps; "
        f"liger {args.liger}, fused linear {args.fused_linear}, compile scope {args.compile_scope}"
        + (f", compile mode {args.compile_mode}" if args.compile_mode != "default" else "")
        + (f", fused kernel {args.fused_kernel}" if args.fused_kernel else "")
        + (f"; adapters: {args.lora_variant} on every side" if args.lora_variant != "lora" else "")
        + (f"; LoRA dropout {args.lora_dropout:g} on every side" if args.lora_dropout else "")
    )
    print(
        f"data: {prep['docs']:,} documents of {TEXTS_LABEL[prep.get('texts', 'demo')]}, "
        f"{prep['tokens_total']:,} tokens (median "
        f"{prep['tokens_median']:.0f}, mean {prep['tokens_mean']:.0f}, p90 {prep['tokens_p90']:.0f}, max "
        f"{prep['tokens_max']}, {prep['truncated']} truncated at {args.seq_len}); vocab {prep['vocab']}"
    )
    print()
    width = name_width(results)
    header = (
        f"{'contender':<{width}}{'attn':>15}{'real tok/s':>13}{'pad waste':>10}{'step s':>9}{'MFU':>8}"
        f"{'MFU docs':>9}{'peak MiB':>10}{'data wait':>10}{'other load':>11}{'host us/op':>16}"
    )
    print(header)
    print("-" * len(header))
    for name, run in results.items():
        if "skipped" in run:
            print(f"{name:<{width}}  skipped: {run['skipped']}")
            continue
        if "error" in run:
            print(f"{name:<{width}}  FAILED ({run['error']})")
            continue
        print(
            f"{name:<{width}}{run['attn']:>15}{run['real_tokens_per_s']:>13,.0f}{run['padding_waste']:>10.1%}"
            f"{run['step_time_s']:>9.3f}{_fmt(run['mfu'], '.1%'):>8}{_fmt(run['mfu_docs'], '.1%'):>9}"
            f"{_fmt(run['peak_memory_mb'], ',.0f'):>10}"
            f"{run['data_wait_share']:>10.2%}{_fmt(run['other_load_cores'], '.2f'):>11}"
            f"{host_figures(run.get('host_us_per_op')):>16}"
        )
    for name, run in results.items():
        if run.get("setup"):
            print(
                f"  {name}: {run['setup']}; {run['batch_samples']} "
                f"{'packed rows' if name.startswith('trl') else 'samples'} per micro-batch x "
                f"{run.get('accumulation', 1)}; optim {run['optim']}"
            )
    print(initial_weights_line(results))
    print(
        "MFU: (6N + 12*layers*hidden*seq_len) FLOPs per real token x real tokens/s / dense bf16 peak; "
        "MFU docs: the attention term over each document's own length (sum len^2 / sum len), the work a "
        "document-masked path needs; peak MiB: torch.cuda.max_memory_allocated over the timed steps "
        "(on CPU: the process's own peak resident memory, below); host us/op: microseconds the host took "
        "per dispatched op (tiny in-place adds) in the contender's process before / after it trained: a "
        "host-bound step slows with it"
    )
    for name, run in results.items():
        if run.get("first_step_s") is not None:
            print(f"  {first_step_line(name, run)}")
    for name, run in results.items():
        if run.get("float8_choice"):
            print(f"  {name}: {run['float8_choice']}")
    for name, run in results.items():
        if run.get("stopped"):
            print(f"  {name}: {run['stopped']} (its figures written before the check)")
    on_cuda = bool(gpu.get("cuda")) and args.device != "cpu"
    if not on_cuda:
        cpu_memory_report(model_label(args), results)
    memory_ratios(model_label(args), results, on_cuda)
    print()
    print(f"ratios (real tokens/s{'' if on_cuda else ', CPU figures, not GPU'}; {model_label(args)}):")
    for a in ("fastlm_compile", "fastlm_eager"):
        for b in ("trainer_best", "trainer_usual", "fastlm_eager"):
            ra, rb = results.get(a, {}), results.get(b, {})
            if a != b and ra.get("real_tokens_per_s") and rb.get("real_tokens_per_s"):
                print(f"  {a} / {b}: {ra['real_tokens_per_s'] / rb['real_tokens_per_s']:.2f}x")
    for a, b in ADAPTER_PAIRS + AB_PAIRS + FULL_AB_PAIRS:
        ra, rb = results.get(a, {}), results.get(b, {})
        if ra.get("real_tokens_per_s") and rb.get("real_tokens_per_s"):
            print(f"  {a} / {b}: {ra['real_tokens_per_s'] / rb['real_tokens_per_s']:.2f}x")
    tb, tu = results.get("trainer_best", {}), results.get("trainer_usual", {})
    if tb.get("real_tokens_per_s") and tu.get("real_tokens_per_s"):
        print(f"  trainer_best / trainer_usual: {tb['real_tokens_per_s'] / tu['real_tokens_per_s']:.2f}x")
    for run in results.values():
        if run.get("sync_examples"):
            print(f"  {run['contender']} syncs between log steps, e.g.: " + "; ".join(run["sync_examples"]))
    print()


def name_width(results: dict[str, dict]) -> int:
    """The tables' first column: the longest contender name and a space, at least 20 characters."""
    return max([20, *(len(name) + 1 for name in results)])


def cpu_memory_report(label: str, results: dict[str, dict]) -> None:
    """The CPU memory table: each contender process's resident memory with the model loaded, its peak, and
    the training's peak above the loaded model; the largest micro-batch; real tokens/s (CPU)."""
    print()
    print(
        f"CPU resident memory of each contender's process, MiB ({label}; VmRSS / VmHWM of /proc/self/status; "
        "not GPU memory):"
    )
    width = name_width(results)
    header = (
        f"{'contender':<{width}}{'loaded':>10}{'peak':>10}{'peak above loaded':>19}{'micro-batch tokens':>20}"
        f"{'real tok/s (CPU)':>18}  model"
    )
    print(header)
    print("-" * (len(header) + len(label)))
    for name, run in results.items():
        memory = run.get("cpu_memory")
        if not memory:
            continue
        print(
            f"{name:<{width}}{memory['rss_loaded_mb']:>10,.0f}{memory['peak_rss_mb']:>10,.0f}"
            f"{memory['peak_above_loaded_mb']:>19,.0f}{run['max_micro_batch_tokens']:>20,}"
            f"{run['real_tokens_per_s']:>18,.0f}  {label}"
        )
    print(
        "  loaded: after the model (and its adapters) is built and every weight page read once (a "
        "checkpoint memory-mapped from its file is resident only once read), before training; peak: the "
        "process's highest resident memory (load included); peak above loaded: the training's highest "
        "resident memory, its high-water mark restarted once the model was loaded (clear_refs), less loaded; "
        "micro-batch tokens: the largest micro-batch's token slots (padding included)"
    )
    for name, run in results.items():
        memory = run.get("cpu_memory") or {}
        if memory and not memory.get("peak_restarted"):
            print(f"  {name}: the peak could not be restarted after the load: peak above loaded includes it")


def memory_ratios(label: str, results: dict[str, dict], on_cuda: bool) -> None:
    """fastlm's peak memory over its peer's for ``MEMORY_PAIRS`` (lower is better): on CUDA
    ``max_memory_allocated``; on CPU the peak RSS above the loaded model and the whole process's peak."""
    lines = []
    for a, b in MEMORY_PAIRS:
        ra, rb = results.get(a, {}), results.get(b, {})
        if on_cuda and ra.get("peak_memory_mb") and rb.get("peak_memory_mb"):
            ratio = ra["peak_memory_mb"] / rb["peak_memory_mb"]
            lines.append(f"  {a} / {b} peak memory (max_memory_allocated): {ratio:.2f}x [{label}]")
        ma, mb = ra.get("cpu_memory"), rb.get("cpu_memory")
        if not on_cuda and ma and mb and mb["peak_above_loaded_mb"] > 0:
            above = ma["peak_above_loaded_mb"] / mb["peak_above_loaded_mb"]
            whole = ma["peak_rss_mb"] / mb["peak_rss_mb"]
            lines.append(
                f"  {a} / {b} peak RSS above the loaded model: {above:.2f}x; whole-process peak RSS: "
                f"{whole:.2f}x [{label}]"
            )
    if lines:
        print()
        print("ratios (peak memory; below 1: fastlm holds less):")
        print("\n".join(lines))


def parse_args(argv=None) -> argparse.Namespace:
    # after train_speed set the offline environment
    from fastlm.engine.model.attention.inputs import IMPLEMENTATIONS

    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model",
        choices=tuple(MODELS),
        default="0.5b",
        help="model config (default 0.5b; 3b: the Llama-3.2-3B shape, vocab 128256)",
    )
    parser.add_argument(
        "--layers",
        type=int,
        default=None,
        help="keep only the first N decoder layers of the model config (default: all; 3b has 28)",
    )
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument(
        "--seq-len", type=int, default=2048, help="packed row length / truncation (default 2048)"
    )
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument(
        "--compile",
        choices=("both", "on", "off"),
        default="both",
        help="fastlm variants: compiled and eager (both), one of them; 'off' also turns "
        "torch_compile off in trainer_best",
    )
    parser.add_argument(
        "--compile-scope",
        choices=("model", "layers"),
        default="model",
        help="compiled fastlm contenders: train.runtime.compile_scope (model: one graph; layers: each "
        "transformer layer, about one layer's compile time)",
    )
    parser.add_argument(
        "--compile-mode",
        choices=("default", "reduce-overhead"),
        default="default",
        help="compiled fastlm contenders: train.runtime.compile_mode (reduce-overhead: a CUDA graph of each "
        "compiled layer over micro-batches of one shape; needs --compile-scope layers)",
    )
    parser.add_argument("--attn", choices=("auto", *IMPLEMENTATIONS), default="auto")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=480.0,
        help="wall-clock budget of the whole script (default 480 s: 8 minutes); each contender "
        "process is stopped past its share",
    )
    parser.add_argument("--trainer-compile", choices=("on", "off"), default="on", help=argparse.SUPPRESS)
    parser.add_argument(
        "--steps", type=int, default=30, help="timed optimizer steps per contender (default 30)"
    )
    parser.add_argument(
        "--warmup", type=int, default=10, help="untimed steps first, compile included (default 10)"
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="fastlm packed rows per step, Trainer samples per step (default 8 for 0.5b, 16 tiny)",
    )
    parser.add_argument(
        "--accumulation",
        type=int,
        default=1,
        help="micro-batches per optimizer step, on every side (fastlm's gradient_accumulation_steps, the "
        "Trainer's multiplied by it): the tokens per optimizer step of a real fine-tune, equal on both "
        "sides (default 1)",
    )
    parser.add_argument(
        "--docs", type=int, default=None, help="documents to generate (default: enough for the run)"
    )
    parser.add_argument(
        "--texts",
        choices=tuple(TEXTS_LABEL),
        default="demo",
        help="documents: demo (runs of demo texts, about seq-len / 4 tokens each) or reviews (one short text "
        "each with the length profile of real reviews, about 19 tokens: the users' corpora)",
    )
    parser.add_argument(
        "--contenders",
        nargs="+",
        choices=CONTENDERS,
        default=None,
        help=f"default: {' '.join(FULL_CONTENDERS)} (full fine-tuning)",
    )
    parser.add_argument(
        "--adapters",
        action="store_true",
        help=f"run the LoRA/QLoRA contenders instead: {' '.join(ADAPTER_CONTENDERS)}",
    )
    parser.add_argument(
        "--checkpointing",
        choices=("off", "selective", "full"),
        default="off",
        help="train.model.gradient_checkpointing of fastlm and of the Trainer's best set-ups, full fine-tune "
        "(the 3B shape needs it on an 80 GB GPU) and adapters (default off)",
    )
    parser.add_argument(
        "--optim",
        choices=tuple(TRAINER_OPTIM),
        default="adamw",
        help="train.optimizer.name of fastlm, its Trainer peer in the best set-ups (default adamw: the "
        "Trainer's adamw_torch_fused)",
    )
    parser.add_argument(
        "--liger",
        choices=tuple(LIGER_KERNEL),
        default="auto",
        help="fastlm contenders: liger-kernel's kernels (train.model.liger, and "
        "train.loss.fused_linear_kernel auto/liger/fastlm for auto/on/off; default auto: where "
        "CUDA and liger-kernel are there). A/B: run once with --liger on, once with --liger off",
    )
    parser.add_argument(
        "--trainer-liger",
        choices=("on", "off"),
        default="on",
        help="the Trainer's and TRL's best set-ups: use_liger_kernel (default on, where CUDA and "
        "liger-kernel are there); off: their torch_compile without Liger, the faster of the two where "
        "Liger's kernels break the compile",
    )
    parser.add_argument(
        "--fused-linear",
        choices=("auto", "on", "off"),
        default="auto",
        help="fastlm contenders: train.loss.fused_linear (auto: vocabularies >= 65,536; the 0.5b model's "
        "32,000 needs on to run the fused head at all)",
    )
    parser.add_argument(
        "--fused-kernel",
        choices=("auto", "fastlm", "liger", "cce"),
        default=None,
        help="fastlm contenders: train.loss.fused_linear_kernel, in place of the one --liger implies (cce: "
        "cut-cross-entropy's kernel)",
    )
    parser.add_argument(
        "--param-dtype",
        choices=("auto", "fp32", "bf16"),
        default="auto",
        help="fastlm's contenders: train.runtime.param_dtype (auto: bf16 weights, or LoRA's bf16 adapters, "
        "with fp32 masters on a GPU in bf16, fp32 weights under autocast on a CPU; *_fp32_weights and "
        "*_fp32_adapters contenders: fp32)",
    )
    parser.add_argument(
        "--padding-free",
        choices=("auto", "on", "off"),
        default="auto",
        help="the Trainer's best set-ups: DataCollatorWithFlattening (one flattened row per micro-batch); "
        "auto: with a varlen attention kernel, and on CPU (measured faster there than length grouping); "
        "on: also with a dense-mask attention on a GPU (transformers builds the block-diagonal mask from the "
        "position ids)",
    )
    parser.add_argument(
        "--lora-variant",
        choices=("lora", "rslora", "dora"),
        default="lora",
        help="the adapter contenders on every side: plain LoRA, rank-stabilized (scaling alpha / sqrt(r)) or "
        "DoRA (peft's use_dora: a trained magnitude per output feature; fastlm's fused DoRA forward, peft's "
        "in the Trainer, TRL and fastlm_lora_peft_forward)",
    )
    parser.add_argument(
        "--lora-dropout",
        type=float,
        default=LORA["dropout"],
        help="LoRA dropout on every side (peft's lora_dropout, fastlm's train.model.lora.dropout); recipes "
        "often use 0.05-0.1: peft's DoRA then applies W to the dropped-out input once more",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: usable cores)")
    parser.add_argument(
        "--profile",
        choices=("missed", "always", "never"),
        default="missed",
        help="a profiler window of the first fastlm contender: when a target is missed (default), after "
        "every run (an A/B of two set-ups' kernels), or never",
    )
    parser.add_argument("--no-profile", action="store_true", help="the same as --profile never")
    parser.add_argument("--force", action="store_true", help="train 0.5b even on CPU")
    parser.add_argument("--json", type=Path, default=None, help="write every figure to this JSON file")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="keep the prepared data here (default: temp dir)"
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="keep the prepared data and the adapters' base model here for later runs of the same data and "
        "model (gpu_session.sh's steps share one; default: none)",
    )
    parser.add_argument("--run", choices=(*CONTENDERS, "fastlm_profile", "base"), help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument(  # the profile's set-up: the run's first fastlm contender's (profiled_adapter)
        "--profile-adapter", choices=("none", "lora", "qlora"), default="none", help=argparse.SUPPRESS
    )
    parser.add_argument(  # and its compile (profiled_compile)
        "--profile-compile", choices=("on", "off"), default="on", help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.warmup < 1 or args.steps < 1 or args.seq_len < 8:
        parser.error("--warmup and --steps must be >= 1, --seq-len >= 8")
    depth = full_depth(args.model)
    if args.layers is not None and not 1 <= args.layers <= depth:
        parser.error(
            f"--layers {args.layers}: --model {args.model} has {depth} decoder layers; pass 1 to {depth}"
        )
    if args.compile_mode == "reduce-overhead" and (args.compile_scope != "layers" or args.compile == "off"):
        parser.error("--compile-mode reduce-overhead replays a CUDA graph of each compiled layer: pass "
                     "--compile-scope layers and --compile on or both")  # fmt: skip
    if args.accumulation < 1:
        parser.error(f"--accumulation {args.accumulation}: micro-batches per optimizer step; pass 1 or more")
    if args.batch_size is None:
        args.batch_size = DEFAULT_BATCH[args.model]
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.run:
        child_main(args)
        return
    import torch

    from fastlm.engine.runtime.environment import usable_cpu_count

    if args.threads is None:
        args.threads = usable_cpu_count()
    on_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available here")
    label = model_label(args)
    n_params = count_parameters(args.model, args.seq_len, layers=args.layers)
    print(f"model {label}: {n_params:,} parameters ({n_params / 1e9:.2f} B)", flush=True)
    if args.model != "tiny" and not on_cuda and not args.force and args.layers is None:
        print(
            f"{args.model} on CPU: parameter count only (pass --layers N to keep N decoder layers, or "
            "--force to train it whole)"
        )
        return
    contenders = list(args.contenders or (ADAPTER_CONTENDERS if args.adapters else FULL_CONTENDERS))
    if args.compile == "on":
        contenders = [c for c in contenders if c != "fastlm_eager"]
    elif args.compile == "off":
        contenders = [c for c in contenders if c != "fastlm_compile"]
    info, gpu = machine(args.threads), gpu_info()
    keep = args.workdir is not None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fastlm_gpu_speed_"))
    workdir.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget_s)
    try:
        n_docs = args.docs or default_documents(
            args.texts, args.warmup, args.steps, args.batch_size * args.accumulation, args.seq_len
        )
        print(f"preparing {n_docs:,} documents (tokenizer, token ids) in {workdir} ...", flush=True)
        if args.cache_dir is not None:
            key = preparation_key(args, n_docs)
            prep, hit = cached_preparation(
                args.cache_dir, workdir, key, lambda: prepare(workdir, n_docs, args.seq_len, args.texts)
            )
            if hit:
                print(f"  the prepared data from the cache ({args.cache_dir / key})", flush=True)
        else:
            prep = prepare(workdir, n_docs, args.seq_len, args.texts)
        results: dict[str, dict] = {}
        reasons = {name: skip_reason(name, args, on_cuda) for name in contenders}
        if any(
            reasons[name] is None
            for name in contenders
            if name in ADAPTER_CONTENDERS + TRL_CONTENDERS + AB_CONTENDERS
        ):
            # the adapter contenders' common base, saved by a process of its own: in no contender's memory
            if (workdir / "base" / "config.json").is_file():
                print("the adapter contenders' base model from the cache", flush=True)
            else:
                print("saving the adapter contenders' base model ...", flush=True)
                base = run_child("base", args, workdir, len(contenders) + 1, timeout_s=budget.left())
                if "error" in base:
                    raise SystemExit(f"the base model could not be saved: {base['error']}")
        for index, name in enumerate(contenders):
            reason = reasons[name]
            if reason:
                print(f"[{index + 1}/{len(contenders)}] {name}: skipped: {reason}", flush=True)
                results[name] = {"contender": name, "skipped": reason}
                continue
            run = run_contender_in_budget(name, args, workdir, (index, len(contenders)), budget, results)
            results[name] = run
            if "error" not in run:
                print(
                    f"  {run['real_tokens_per_s']:,.0f} real tok/s, MFU {_fmt(run['mfu'], '.1%')} "
                    f"(docs {_fmt(run['mfu_docs'], '.1%')}), step {run['step_time_s']:.3f} s, "
                    f"{run['process_wall_s']:.1f} s in all",
                    flush=True,
                )
        report(args, info, gpu, prep, n_params, results)
        lines = verdicts(results, on_cuda, args.model)
        for text, ok in lines:
            print(f"{'PASS' if ok else 'FAIL' if ok is not None else 'N/A '}  {text}")
        if args.model != "0.5b":
            print(f"      (the MFU target is set for --model 0.5b, not judged on {model_label(args)})")
        profile = None
        print(f"budget: {budget.seconds - budget.left():.0f} s of {budget.seconds:.0f} s used")
        profiling = wants_profile(lines, args)
        why = "a target was missed" if any(ok is False for _, ok in lines) else "--profile always"
        skip = profile_skip_reason(results, budget.left()) if profiling else None
        if skip:
            print(f"\n{why}; profile skipped: {skip}")
        elif profiling:
            if not on_cuda:
                print("\ntop CUDA kernels: skipped: no CUDA")
            else:
                args.profile_adapter = profiled_adapter(results)
                args.profile_compile = profiled_compile(results, args)
                shown = {"none": "full fine-tune"}.get(args.profile_adapter, args.profile_adapter)
                shown += ", compiled" if args.profile_compile == "on" else ", eager"
                print(f"\n{why}: profiling a few fastlm steps ({shown}) ...", flush=True)
                profile = run_child("fastlm_profile", args, workdir, len(contenders), timeout_s=budget.left())
                if "error" not in profile:
                    print(
                        f"top 10 CUDA kernels of fastlm, {shown} (steps {args.warmup + 1}-{args.warmup + 3}, "
                        f"{profile['kernel_total_ms']:.1f} ms of kernels in a "
                        f"{_fmt(profile['window_ms'], '.1f')} ms window; "
                        f"phase shares {profile['phase_share']}):"
                    )
                    for row in profile["top_kernels"]:
                        print(
                            f"  {row['ms']:>9.2f} ms {_fmt(row['share'], '>6.1%')} {row['calls']:>6}x  "
                            f"{row['kernel'][:110]}"
                        )
                    print("kernel time by kind (a step):")
                    for row in profile.get("kernel_kinds", []):
                        print(
                            f"  {row['kind']:<12} {row['ms_per_step']:>8.2f} ms "
                            f"{_fmt(row['share'], '>6.1%')} {row['calls_per_step']:>7.0f} calls"
                        )
                    from fastlm.engine.observe.gpu_idle import idle_lines

                    print("where the GPU waited (engine/observe/gpu_idle.py):")
                    for line in idle_lines(profile.get("gpu_idle")):
                        print(f"  {line}")
        if args.json:
            payload = {
                "settings": {
                    k: (str(v) if isinstance(v, Path) else v)
                    for k, v in vars(args).items()
                    if k not in ("run", "result")
                },
                "targets": {
                    "mfu": TARGET_MFU,
                    "vs_trainer_best": TARGET_VS_BEST,
                    "data_wait": TARGET_DATA_WAIT,
                    "adapter_vs": TARGET_ADAPTER_VS,
                },
                "machine": info,
                "gpu": gpu,
                "data": prep,
                "parameters": n_params,
                "runs": results,
                "verdicts": [{"check": t, "pass": ok} for t, ok in lines],
                "profile": profile,
            }
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(payload, indent=2, default=str))
            print(f"\nwrote {args.json}")
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
