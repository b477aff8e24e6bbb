"""Batched generation for many prompts given as token ids: what scoring a model against references needs.

``generate_continuations`` returns, for each prompt, the ids the model generated after it (stopped at the
first end id, which is not included), in the prompts' order. The end ids are the given EOS (the tokenizer's)
and every id of the model's ``generation_config.eos_token_id`` (``end_ids``): an instruct model ends its turn
with a token of its own (Llama-3: <|eot_id|>, Qwen3: <|im_end|>), where plain ``model.generate`` stops too.
What makes it fast and still exact:

* prompts are sorted by length (longest first, stable) and cut into batches of ``batch_size``, so a batch
  pads to similar lengths; the results are put back in the original order;
* LEFT padding with an attention mask: every prompt ends at the last column, so the first generated token
  of every row is at the same position and the KV cache grows in step (the model derives position ids
  from the mask, so a padded prompt generates what it generates alone); the padding is filled so that the
  repetition penalty and the n-gram ban, which read every id of a row, see none of it (``_padding_rule``);
* the KV cache is on for generation (training switches ``config.use_cache`` off; it is switched on here and
  restored), the model is in eval mode under ``torch.inference_mode`` and the runtime's autocast, and gets
  its training mode back;
* sampling is seeded once (``seed``) in a forked RNG state: the same prompts, order and settings give the
  same texts, and the caller's random state is untouched.

``generate_samples`` is the same path for text: a few prompts under several decoding settings (greedy, seeded
sampling), returned as a DataFrame of decoded continuations (the report's sample generations).

Only ``model.generate`` is used, so a plain Hugging Face model and a peft adapter model both work.

Encoder-decoder models (``config.is_encoder_decoder``: BART, T5) decode with their own ``generate`` too: the
prompts are the ENCODER inputs, right-padded with their mask (learned absolute positions, as in BART, count
from the first column, so right padding is what training saw), each followed by the special tokens the
tokenizer puts after a text (``encoder_inputs``: BART's and T5's ``</s>``), as training's encoder rows are;
their output is the decoder row, whose first token is the decoder start (then the BOS a BART-style model is
made to generate first, ``forced_bos_token_id``), so the continuation is everything after them.
``continuation_start`` says which. The EOS a checkpoint forces at the last position (``forced_eos_token_id``,
BART's) is generated after the tokens asked for (``forced_end``), a forced BOS before them: neither takes
the place of a new token.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter

import numpy as np
import pandas as pd
import torch

from fastlm.engine.data.collators import TextEnds, pad_id_of
from fastlm.engine.evaluate.line_ends import lf_line_ends
from fastlm.engine.model.attention.choice import generation_attention
from fastlm.engine.runtime.environment import Runtime

__all__ = [
    "DECODING_RULES",
    "KEPT_FROM_MODEL",
    "Generations",
    "continuation_start",
    "continuation_text",
    "decoding_kwargs",
    "encoder_inputs",
    "end_ids",
    "explicit_decoding",
    "forced_end",
    "generate_continuations",
    "generate_samples",
    "is_encoder_decoder",
    "kept_model_rules",
    "clean_response",
    "response_text",
]

log = logging.getLogger(__name__)


# Which settings reach ``model.generate`` and how: raised whenever the same settings would generate other
# tokens, so that kept predictions of the earlier rules are not reused (``reporting.predictions``' job key).
# 2: the controls a setting leaves out are off, not the model's generation_config's (``explicit_decoding``).
# 3: so are the ones no setting names (a length floor, a time limit, sampling's other cuts: ``_OFF``).
# 4: a left-padded row's padding is no part of what the repetition penalty and n-gram ban read
# (``_padding_rule``).
# 5: a forced EOS (``forced_eos_token_id``, BART's) is generated after the new tokens asked for, not in place
# of the last (``forced_end``).
DECODING_RULES = 5


@dataclass
class Generations:
    """``continuations``: the generated ids of each prompt (the end id excluded), in prompt order; ``seconds``
    of wall time and ``new_tokens`` generated (the end id and padding after it not counted)."""

    continuations: list[list[int]]
    seconds: float
    new_tokens: int


def decoding_kwargs(
    *,
    num_beams: int = 1,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int | None = None,
    repetition_penalty: float = 1.0,
    no_repeat_ngram_size: int = 0,
    length_penalty: float = 1.0,
) -> dict:
    """``model.generate`` options for these settings, leaving out the ones that would do nothing.

    Temperature, top-p and top-k only matter when sampling (passing them to greedy decoding makes
    transformers warn); a repetition penalty of 1 and a no-repeat size of 0 are off; a length penalty only
    matters to beam search (the encoder-decoder summarisers' usual set-up).
    """
    kwargs: dict = {"num_beams": num_beams, "do_sample": do_sample}
    if do_sample:
        kwargs.update(temperature=temperature, top_p=top_p)
        if top_k is not None:
            kwargs["top_k"] = top_k
    if repetition_penalty != 1.0:
        kwargs["repetition_penalty"] = repetition_penalty
    if no_repeat_ngram_size > 0:
        kwargs["no_repeat_ngram_size"] = no_repeat_ngram_size
    if num_beams > 1 and length_penalty != 1.0:
        kwargs["length_penalty"] = length_penalty
    return kwargs


# The "off" value of every decoding control a model folder's generation_config.json can set besides the ones a
# setting names: no length floor (its end token barred until then: min_length, min_new_tokens), no time limit,
# no encoder-side penalty, length decay, sequence bias, guidance, watermark or logit renormalisation, no
# contrastive, DoLa, group-beam, constrained or speculative decoding, no token healing, one sequence a prompt.
_OFF = {
    "min_length": 0,
    "min_new_tokens": None,
    "max_time": None,
    "stop_strings": None,
    "encoder_repetition_penalty": 1.0,
    "encoder_no_repeat_ngram_size": 0,
    "exponential_decay_length_penalty": None,
    "sequence_bias": None,
    "guidance_scale": None,
    "watermarking_config": None,
    "renormalize_logits": False,
    "penalty_alpha": None,
    "dola_layers": None,
    "num_beam_groups": 1,
    "diversity_penalty": 0.0,
    "constraints": None,
    "force_words_ids": None,
    "prompt_lookup_num_tokens": None,
    "assistant_early_exit": None,
    "speculation_type": None,
    "use_mtp": False,
    "token_healing": False,
    "num_return_sequences": 1,
    "return_dict_in_generate": False,
}
# Sampling's cuts besides top-p and top-k, off: no typical, epsilon, eta, min-p or top-h cut.
_SAMPLING_OFF = {"typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "min_p": None, "top_h": None}
# What a model folder's generation_config.json sets that generation keeps: the tokens it forces (an
# encoder-decoder's BOS after the decoder start, its EOS at the length limit) and the ones it never emits (a
# Marian pad, Whisper's suppressed ids): part of the model, said once (``kept_model_rules``).
KEPT_FROM_MODEL = (
    "forced_bos_token_id",
    "forced_eos_token_id",
    "bad_words_ids",
    "suppress_tokens",
    "begin_suppress_tokens",
)
_said_kept: set[str] = set()


def explicit_decoding(generate_kwargs: dict) -> dict:
    """``model.generate`` options with every decoding control a setting can name given: the ones left out
    (or None) at their "off" value (greedy, one beam, no repetition penalty, no n-gram ban, length penalty 1
    and no early stop in beam search; sampling at temperature 1 with no top-p, top-k, typical, epsilon, eta,
    min-p or top-h cut), and the controls no setting names off too (``_OFF``: no length floor, time limit,
    watermark, extra sequences, ...). Else ``generate`` takes them from the model folder's
    ``generation_config.json`` (a repetition penalty, no-repeat size, ``min_new_tokens`` or ``min_length`` a
    checkpoint ships, its sampling and top-k; transformers' own top-k of 50 where it has none): outputs the
    recorded settings do not describe, and an "off" setting that cannot turn them off. The folder's forced
    and banned tokens stay (``KEPT_FROM_MODEL``). Controls this transformers does not have are left out."""
    from transformers import GenerationConfig

    known = GenerationConfig()
    given = {key: value for key, value in generate_kwargs.items() if value is not None}
    off: dict = {"do_sample": False, "num_beams": 1, "repetition_penalty": 1.0, "no_repeat_ngram_size": 0}
    merged = {**off, **given}
    if merged["num_beams"] > 1:
        merged = {"length_penalty": 1.0, "early_stopping": False, **merged}
    if merged["do_sample"]:
        merged = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, **_SAMPLING_OFF, **merged}
    return {**{key: value for key, value in _OFF.items() if hasattr(known, key)}, **merged}


def kept_model_rules(model) -> dict:
    """The token rules of ``model``'s generation_config that generation keeps (``KEPT_FROM_MODEL``), set ones
    only."""
    config = getattr(model, "generation_config", None)
    found = {key: getattr(config, key, None) for key in KEPT_FROM_MODEL}
    return {key: value for key, value in found.items() if value is not None}


def _say_kept_rules(model) -> None:
    """Log once (per set of rules) the token rules of the model folder's generation_config that generation
    keeps."""
    kept = kept_model_rules(model)
    described = ", ".join(f"{key}={value}" for key, value in kept.items())
    if kept and described not in _said_kept:
        _said_kept.add(described)
        log.info(
            "Generation keeps the model's generation_config token rules %s (part of the model); its other "
            "decoding controls are off unless the settings name them",
            described,
        )


def is_encoder_decoder(model) -> bool:
    return bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))


def continuation_start(model, input_ids: torch.Tensor) -> int:
    """Where the new tokens begin in ``model.generate``'s output: after the prompt (decoder-only) or after
    the decoder start token and a forced BOS (encoder-decoder, whose output holds no prompt)."""
    if not is_encoder_decoder(model):
        return input_ids.shape[1]
    forced = getattr(getattr(model, "generation_config", None), "forced_bos_token_id", None)
    return 1 + (forced is not None)


def forced_end(model) -> int:
    """1 where ``model``'s generation_config forces its EOS at the last position (``forced_eos_token_id``:
    BartConfig's default, facebook/bart-*'s), else 0: that EOS is generated after the new tokens asked for,
    as a forced BOS is before them, so it takes none of their places (it is an end id, never part of a
    continuation)."""
    forced = getattr(getattr(model, "generation_config", None), "forced_eos_token_id", None)
    return int(forced is not None)


def encoder_inputs(model, prompts: Sequence[Sequence[int]], tokenizer) -> list[list[int]]:
    """``prompts`` as ``model`` trained on them: an encoder-decoder model's each followed by the ids the
    tokenizer puts after a text (``TextEnds.tail``, BART's ``</s>``; not doubled), as its training's encoder
    rows (``collators.seq2seq_sides``); a decoder-only model's as they are."""
    prompts = [list(ids) for ids in prompts]
    tail = list(TextEnds.of(tokenizer).tail) if is_encoder_decoder(model) else []
    if not tail:
        return prompts
    return [ids + tail if ids and ids[-len(tail) :] != tail else ids for ids in prompts]


# An empty reasoning block at the start of an answer: Qwen3's template writes it before every answer it
# renders in non-thinking mode, and a Qwen3 fine-tune may still open its answers with it.
EMPTY_THINK = re.compile(r"^<think>\s*</think>\s*")


def response_text(ids: Sequence[int], tokenizer) -> str:
    """A generated response as text: special tokens skipped, as ``clean_response`` gives it."""
    return clean_response(tokenizer.decode(ids, skip_special_tokens=True))


def continuation_text(prompt: Sequence[int] | None, ids: Sequence[int], tokenizer) -> str:
    """The text a continuation ``ids`` adds after its ``prompt`` ids, LF line ends: the whole text decoded
    less the prompt's (special tokens skipped), where the one begins with the other, else ``ids`` decoded
    alone (``prompt`` None: an encoder-decoder's output, which continues no prompt). A SentencePiece-style
    tokenizer (Llama-2, Mistral, Gemma) takes the space off the first token it decodes: ``ids`` decoded
    alone lose the space that joins them to the prompt ("died" for " died")."""
    if prompt:
        before = tokenizer.decode(list(prompt), skip_special_tokens=True)
        whole = tokenizer.decode([*prompt, *ids], skip_special_tokens=True)
        if whole.startswith(before):
            return lf_line_ends(whole[len(before) :])
    return lf_line_ends(tokenizer.decode(list(ids), skip_special_tokens=True))


def clean_response(text: str) -> str:
    """A decoded response with LF line ends (``lf_line_ends``), stripped, and without a leading empty
    ``<think></think>`` block (a non-empty one, the model's reasoning, is kept)."""
    return EMPTY_THINK.sub("", lf_line_ends(text).strip(), count=1)


def end_ids(model, eos_id: int | Sequence[int]) -> set[int]:
    """``eos_id`` and the ids of the model's ``generation_config.eos_token_id`` (an int, a list, or None)."""
    ids = {int(eos_id)} if isinstance(eos_id, int) else {int(i) for i in eos_id}
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if configured is not None:
        ids |= {int(configured)} if isinstance(configured, int) else {int(i) for i in configured}
    return ids


def _padded(prompts: Sequence[Sequence[int]], pad_id: int | None, device: torch.device, *, left: bool = True):
    """The prompts padded to one width, with their mask; ``pad_id`` None: each row's padding is its own first
    id (``_padding_rule``)."""
    width = max(len(ids) for ids in prompts)
    input_ids = torch.full((len(prompts), width), pad_id if pad_id is not None else 0, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, ids in enumerate(prompts):
        if ids:
            columns = slice(width - len(ids), width) if left else slice(0, len(ids))
            input_ids[row, columns] = torch.as_tensor(list(ids), dtype=torch.long)
            attention_mask[row, columns] = 1
            if pad_id is None:
                input_ids[row, : width - len(ids)] = int(ids[0])
    return input_ids.to(device), attention_mask.to(device)


def _padding_rule(generate_kwargs: dict, pad_id: int, end_id: int) -> tuple[int | None, bool]:
    """What fills a left-padded row's padding, and whether a batch holds prompts of one length only (no
    padding). The model never sees the padding (masked), but ``generate``'s repetition penalty and n-gram ban
    read every id of a row: padded with the pad id (a model without one pads with its EOS), a row got its EOS
    penalised (transformers 5.0's penalty) or banned (a one-gram ban: the row could not end), or the pad's
    n-grams banned what follows a pad the model wrote, where the prompt alone generates freely.
    So: under a penalty or a one-gram ban, the row's own first id (None: already in the row, so neither
    penalised nor banned anew); under a longer n-gram ban, the end id (its n-grams hold an end id, which ends
    a row before it could be read); both that ban and a penalty: no padding; neither: ``pad_id``."""
    ngram = int(generate_kwargs.get("no_repeat_ngram_size") or 0)
    penalised = float(generate_kwargs.get("repetition_penalty") or 1.0) != 1.0
    if ngram >= 2:
        return end_id, penalised
    if ngram == 1 or penalised:
        return None, False
    return pad_id, False


def _batches(order: np.ndarray, prompts: Sequence[Sequence[int]], batch_size: int, one_length: bool):
    """``order`` cut into batches of ``batch_size``; ``one_length``: each cut again into its prompts of one
    length."""
    for begin in range(0, len(order), batch_size):
        chunk = order[begin : begin + batch_size]
        if not one_length:
            yield chunk
            continue
        lengths = np.array([len(prompts[i]) for i in chunk])
        for length in dict.fromkeys(lengths.tolist()):
            yield chunk[lengths == length]


def _until_eos(ids: list[int], eos_ids: set[int]) -> list[int]:
    for position, token in enumerate(ids):
        if token in eos_ids:
            return ids[:position]
    return ids


def _model_config(model):
    config = getattr(model, "config", None)
    return config if config is not None and hasattr(config, "use_cache") else None


def generate_continuations(
    model,
    prompts: Sequence[Sequence[int]],
    *,
    pad_id: int,
    eos_id: int | Sequence[int],
    runtime: Runtime,
    batch_size: int = 16,
    max_new_tokens: int = 64,
    seed: int = 0,
    start_id: int | None = None,
    **generate_kwargs,
) -> Generations:
    """The token ids generated after each prompt (stopped at the first of ``end_ids``, excluded), in the order
    of ``prompts``.

    ``generate_kwargs`` are ``model.generate`` decoding options (see :func:`decoding_kwargs`); the controls
    they leave out are off, not the model's ``generation_config``'s (``explicit_decoding``). An empty
    prompt starts from ``start_id`` (BOS, say); without one it is an error.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    eos_ids = end_ids(model, eos_id)
    prompts = [list(ids) if len(ids) else ([start_id] if start_id is not None else []) for ids in prompts]
    if any(not ids for ids in prompts):
        raise ValueError("an empty prompt needs a start_id (the tokenizer's BOS or EOS id)")
    order = np.argsort(-np.array([len(ids) for ids in prompts], dtype=np.int64), kind="stable")
    results: list[list[int] | None] = [None] * len(prompts)
    device = runtime.device
    config = _model_config(model)
    was_training, cache_setting = model.training, (config.use_cache if config is not None else None)
    devices = (
        [device.index if device.index is not None else torch.cuda.current_device()]
        if device.type == "cuda"
        else []
    )
    _say_kept_rules(model)
    new_tokens, start = 0, perf_counter()
    model.eval()
    if config is not None:
        config.use_cache = True
    try:
        with torch.random.fork_rng(devices=devices), torch.inference_mode(), generation_attention(model):
            torch.manual_seed(seed)
            left = not is_encoder_decoder(model)
            # an encoder-decoder pads its encoder rows on the right: its decoder rows, which these controls
            # read, hold no padding
            fill, one_length = (
                _padding_rule(generate_kwargs, pad_id, min(eos_ids)) if left else (pad_id, False)
            )
            for chunk in _batches(order, prompts, batch_size, one_length):
                input_ids, attention_mask = _padded([prompts[i] for i in chunk], fill, device, left=left)
                skip = continuation_start(model, input_ids)
                # an encoder-decoder's forced BOS is generated but is no continuation token, not one asked
                # for; nor is a forced EOS, generated after them
                forced = (skip - 1 if is_encoder_decoder(model) else 0) + forced_end(model)
                with runtime.autocast_context():
                    output = model.generate(
                        input_ids=input_ids,
                        attention_mask=attention_mask,
                        max_new_tokens=max_new_tokens + forced,
                        pad_token_id=pad_id,
                        eos_token_id=sorted(eos_ids),
                        use_cache=True,
                        **explicit_decoding(generate_kwargs),
                    )
                new = output[:, skip:].tolist()
                for index, ids in zip(chunk, new, strict=True):
                    # a forced EOS that is no end id is cut off with the tokens past the limit
                    results[int(index)] = _until_eos(ids, eos_ids)[:max_new_tokens]
                    new_tokens += len(results[int(index)])
    finally:
        if config is not None:
            config.use_cache = cache_setting
        model.train(was_training)
    return Generations(continuations=results, seconds=perf_counter() - start, new_tokens=new_tokens)


def generate_samples(
    model,
    tokenizer,
    prompts: Sequence[str],
    *,
    settings: Sequence[dict],
    max_new_tokens: int = 40,
    runtime: Runtime,
    batch_size: int = 32,
    prompt_ids: Sequence[Sequence[int]] | None = None,
    continuation: bool | None = None,
) -> pd.DataFrame:
    """Continuations of ``prompts`` under each decoding setting: rows prompt, setting, settings, output.

    A setting is ``model.generate`` keyword arguments plus ``name`` and an optional ``seed`` (default 0: see
    ``generate_continuations``, which decodes each setting). An empty prompt starts from BOS, or EOS when the
    tokenizer has no BOS. ``output`` is the continuation only, decoded with special tokens skipped, its line
    ends LF (``lf_line_ends``).

    ``prompt_ids``: the ids each prompt is given as, made by the caller (a prompt model's prompts wrapped by
    its prompt template, a chat model's rendered as a user turn with its chat template, a text model's
    tokenized as predict tokenizes a text); the table still shows ``prompts`` as written. ``continuation``:
    whether the outputs are continuations, the text after the ``prompt_ids`` given (``continuation_text``;
    decoded alone without them), or responses, as ``response_text``
    reads them (stripped, without a leading empty think block); None: continuations without ``prompt_ids``,
    responses with them.
    """
    start_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    if continuation is None:
        continuation = prompt_ids is None
    if prompt_ids is not None and len(prompt_ids) != len(prompts):
        raise ValueError(f"{len(prompt_ids)} prompt id lists for {len(prompts)} prompts")
    encoded = encoder_inputs(
        model,
        prompt_ids
        if prompt_ids is not None
        else [list(tokenizer(prompt)["input_ids"]) if prompt else [] for prompt in prompts],
        tokenizer,
    )
    # a continuation of prompt ids given is the text after them (``continuation_text``); an encoder-decoder's
    # output continues no prompt, and prompts tokenized here (a model of ids: ids as words) are decoded alone
    rows, alone = [], is_encoder_decoder(model) or prompt_ids is None
    for setting in settings:
        kwargs = {key: value for key, value in setting.items() if key not in ("name", "seed")}
        generated = generate_continuations(
            model,
            encoded,
            pad_id=pad_id_of(tokenizer),
            eos_id=tokenizer.eos_token_id,
            runtime=runtime,
            batch_size=batch_size,
            max_new_tokens=max_new_tokens,
            seed=int(setting.get("seed", 0)),
            start_id=start_id,
            **kwargs,
        )
        name, described = setting.get("name", _describe(setting) or "default"), _describe(setting)
        rows += [
            {
                "prompt": prompt,
                "setting": name,
                "settings": described,
                "output": continuation_text(None if alone else fed, ids, tokenizer)
                if continuation
                else response_text(ids, tokenizer),
            }
            for prompt, fed, ids in zip(prompts, encoded, generated.continuations, strict=True)
        ]
    return pd.DataFrame(rows, columns=["prompt", "setting", "settings", "output"])


def _describe(setting: dict) -> str:
    """``{"name": "sampled", "do_sample": True, "temperature": 0.8, "top_p": 0.95, "seed": 0}`` ->
    ``"temperature=0.8, top_p=0.95"``."""
    return ", ".join(
        f"{key}={value}" for key, value in setting.items() if key not in ("name", "do_sample", "seed")
    )
