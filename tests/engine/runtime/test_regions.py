"""``train.runtime.compile_scope: layers``: each transformer layer compiled in place, one graph traced for all
of them, the same training as eager within the compiled-vs-eager tolerance, the state dict's names kept, and a
model without such layers refused in one line; the CPU probe measures and undoes it like the whole model."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

from fastlm.engine.config import parse_train_params
from fastlm.engine.runtime import regions
from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
from fastlm.errors import ConfigError
from tests.support import linear_loss, varlen_op
from tests.support.linear_loss import PACKED_LAYOUT, packed_batch, step_loss_and_grads
from tests.support.tolerances import OTHER_FP32_MODEL

pytestmark = pytest.mark.kernels  # compiled against eager: run under other CPU kernel sets too

VOCAB = 301


def tiny_llama(vocab: int, **config):
    """The tests' tiny Llama as the engine builds a model to train: no KV cache (``build.py``; a cache makes
    each layer's guards differ, one graph per layer)."""
    model = linear_loss.tiny_llama(vocab, **config)
    model.config.use_cache = False
    return model


def assert_trains_as_eager(compiled, eager, batches) -> None:
    """One step's loss and every gradient of ``compiled`` against ``eager`` (same weights): another
    computation, so the tolerance of a whole model run through another kernel (loss) and of its gradients."""
    want_loss, want = step_loss_and_grads(eager, batches)
    got_loss, got = step_loss_and_grads(compiled, batches)
    got = {name.removeprefix("_orig_mod."): grad for name, grad in got.items()}  # the whole model's wrapper
    torch.testing.assert_close(got_loss, want_loss, **OTHER_FP32_MODEL)
    assert got.keys() == want.keys()
    for name, grad in got.items():
        torch.testing.assert_close(grad, want[name], rtol=OTHER_FP32_MODEL["rtol"], atol=1e-5, msg=name)


def varlen_twins():
    """Two 2-layer tiny Llamas with the same weights on the ``torch_varlen`` path (its calling contract: the
    ``varlen_op`` stand-in): one stays eager, the other is compiled."""
    eager = tiny_llama(VOCAB, num_hidden_layers=2)
    model = tiny_llama(VOCAB, num_hidden_layers=2)
    model.load_state_dict(eager.state_dict())
    for each in (eager, model):
        each.config._attn_implementation = "torch_varlen"
    return eager, model


def whole_model_or_two_layers(scope: str) -> int:
    """The depth a scope's graph count needs: compiled whole, one layer (dynamo traces the model in one frame
    whatever its depth, and a second layer only doubles the tracing); compiled by layers, two (the second
    reuses the first's graph)."""
    return 1 if scope == "model" else 2


def count_graphs(monkeypatch) -> list:
    """Every graph dynamo hands to a backend from here on (the backend runs it eagerly: no inductor time)."""
    graphs = []
    real_compile = torch.compile

    def backend(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    def counting_compile(model=None, **kwargs):
        return real_compile(model, backend=backend, dynamic=kwargs.get("dynamic"))

    monkeypatch.setattr(torch, "compile", counting_compile)
    return graphs


def test_layers_compile_in_place_with_one_graph_for_all_of_them(monkeypatch):
    graphs = count_graphs(monkeypatch)
    torch._dynamo.reset()
    model = tiny_llama(VOCAB, num_hidden_layers=4)
    names = list(model.state_dict())
    assert regions.compile_in_scope(model, "layers") is model
    assert list(model.state_dict()) == names  # nothing wrapped: checkpoints keep their names
    layers = regions.repeated_layers(model)
    assert len(layers) == 4 and regions.compiled_layers(model) == 4
    step_loss_and_grads(model, [packed_batch(VOCAB)])
    assert len(graphs) == 1  # traced once, reused by the other three layers


@pytest.mark.parametrize("scope", ["model", "layers"])
def test_each_scope_compiles_with_the_backend_asked_for(scope):
    """``backend``: torch.compile's (compile_scope.py's --backend: aot_eager traces without inductor's
    kernels); the graphs reach that backend, in either scope."""
    torch._dynamo.reset()
    seen = []

    def backend(graph, example_inputs):
        seen.append(graph)
        return graph.forward

    model = tiny_llama(VOCAB, num_hidden_layers=whole_model_or_two_layers(scope))
    run = regions.compile_in_scope(model, scope, backend=backend)
    step_loss_and_grads(run, [packed_batch(VOCAB)])
    assert len(seen) >= 1


def test_layers_compiled_train_as_eager_within_the_compiled_tolerance():
    """Inductor's fused kernels against eager."""
    torch._dynamo.reset()
    batches = [packed_batch(VOCAB), packed_batch(VOCAB)]
    eager = tiny_llama(VOCAB, num_hidden_layers=2)
    compiled = tiny_llama(VOCAB, num_hidden_layers=2)
    compiled.load_state_dict(eager.state_dict())
    regions.compile_in_scope(compiled, "layers")
    assert_trains_as_eager(compiled, eager, batches)


# other rows, then other row lengths, then both: each micro-batch another shape (first: 3 rows of 20)
OTHER_LAYOUTS = (
    ((9, 4), (8, 0), (6, 3), (11, 2)),  # 2 rows of 20
    ((5, 1), (7, 2), (4, 0), (6, 1)),  # 2 rows of 16
    ((16, 0), (15, 1), (14, 2)),  # 3 rows of 16
)


@pytest.mark.parametrize("scope", regions.COMPILE_SCOPES)
def test_micro_batches_of_other_shapes_compile_once_per_varying_size_then_reuse(scope, monkeypatch):
    """Packed micro-batches change shape every step: dynamo compiles the first static and once more for each
    size seen to vary (automatic dynamic shapes: the rows, then the row length), then every shape reuses that
    graph. No graph per shape; ``dynamic=True`` was measured and not taken (regions' docstring)."""
    graphs = count_graphs(monkeypatch)
    torch._dynamo.reset()
    model = tiny_llama(VOCAB, num_hidden_layers=whole_model_or_two_layers(scope))
    compiled = regions.compile_in_scope(model, scope)
    batches = [packed_batch(VOCAB), *(packed_batch(VOCAB, layout=layout) for layout in OTHER_LAYOUTS)]
    shapes = [tuple(batch["input_ids"].shape) for batch in batches]
    assert shapes == [(3, 20), (2, 20), (2, 16), (3, 16)]
    traced = []
    for batch in batches:
        step_loss_and_grads(compiled, [batch])
        traced.append(len(graphs))
    assert traced[3] == traced[2] > traced[1] > traced[0]  # the fourth shape: nothing traced again
    if scope == "layers":  # the whole model: more graphs, one on each side of the CPU head's graph break
        assert traced == [1, 2, 3, 3]


@pytest.mark.parametrize("scope", regions.COMPILE_SCOPES)
def test_packed_varlen_micro_batches_of_every_shape_share_the_first_compile(scope, monkeypatch):
    """The GPU path (``torch_varlen``, PyTorch's varlen kernel as an opaque op, here its CPU stand-in): rows,
    row lengths, segment counts and longest segments change every step, and the first compile serves them
    all: the token count, the segment boundaries and the target positions are dynamic from the first trace,
    and the kernel gets the run's row length as its longest segment (flash-attention's contract: any bound
    at least the longest, same output). Eager calls keep the exact longest segment."""
    seen = varlen_op.install(monkeypatch)
    graphs = count_graphs(monkeypatch)
    torch._dynamo.reset()
    eager, model = varlen_twins()
    compiled = regions.compile_in_scope(model, scope)
    layouts = (PACKED_LAYOUT, *OTHER_LAYOUTS)
    batches = [packed_batch(VOCAB, attn="torch_varlen", layout=layout) for layout in layouts]
    assert len({int(batch["max_seqlen"]) for batch in batches}) > 1
    assert len({tuple(batch["cu_seq_lens"].shape) for batch in batches}) > 1
    traced = []
    for batch in batches:
        step_loss_and_grads(compiled, [batch])
        traced.append(len(graphs))
    assert traced == [traced[0]] * len(batches)
    assert traced[0] == 1 or scope == "model"
    assert set(seen) == {20}  # the run's row length (rows of 20 and 16 tokens), in every compiled call
    seen.clear()
    assert_trains_as_eager(compiled, eager, batches[:1])
    assert set(seen) == {int(batches[0]["max_seqlen"]), 20}  # eager: the exact longest segment


def test_fp32_weights_on_the_flash_attention_path_compile_without_a_break_in_each_layer(monkeypatch):
    """transformers' flash-attention path casts fp32 queries (fp32 weights under bf16 autocast: the rotary
    product is fp32) to bf16 and says so once through ``logger.warning_once``, which dynamo cannot trace: a
    graph break inside every compiled layer, each layer's attention a frame of its own guarded on its
    ``layer_idx``, and past dynamo's recompile limit the other layers' attention eager. Compiled by layers,
    the fp32 model traces as many graphs as the same model in bf16, where nothing is cast (flash_attn's
    calling contract: the varlen_op stand-in behind transformers' own dispatch). transformers loads the
    kernel at the first call and keeps which in a module global, on which a layer traced through that load
    is guarded: loaded before compiling, the layers share one graph."""
    from torch._dynamo.utils import counters
    from transformers import modeling_flash_attention_utils as fa_utils

    def flash_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **kwargs):
        return varlen_op.varlen(q, k, v, cu_seqlens_q, int(max_seqlen_q))

    kernels = (None, flash_varlen, None, fa_utils._pad_input, fa_utils._unpad_input)
    monkeypatch.setattr(fa_utils, "_lazy_imports", lambda *args, **kwargs: kernels)
    monkeypatch.setattr(fa_utils, "_loaded_implementation", None)
    batch = packed_batch(VOCAB, attn="flash_attention_2", layout=PACKED_LAYOUT)
    traced, graphs = {}, count_graphs(monkeypatch)
    for dtype in (torch.bfloat16, torch.float32):
        graphs.clear()
        torch._dynamo.reset()
        counters.clear()
        model = tiny_llama(VOCAB, num_hidden_layers=4).to(dtype)
        model.config._attn_implementation = "flash_attention_2"
        regions.compile_in_scope(model, "layers")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            step_loss_and_grads(model, [batch])
        assert not counters["graph_break"], dict(counters["graph_break"])
        traced[dtype] = len(graphs)
    assert traced[torch.float32] == traced[torch.bfloat16] == 1


def test_an_adapter_model_keeps_its_first_layer_eager_and_one_graph_for_the_others(monkeypatch):
    """LoRA freezes the embedding: the first layer's hidden states need no gradient, every later layer's do,
    and dynamo guards on that (one more graph, one more compile). That layer runs eagerly; the others share
    one graph and train as eager within the compiled tolerance."""
    from fastlm.engine.config import LoraParams
    from fastlm.engine.model.lora import apply_lora

    LORA = LoraParams(enabled=True, r=4, dropout=0.0)  # no dropout: the same computation on both sides
    graphs = count_graphs(monkeypatch)
    torch._dynamo.reset()
    eager = apply_lora(tiny_llama(VOCAB, num_hidden_layers=4), LORA, gradient_checkpointing=False)
    compiled = apply_lora(tiny_llama(VOCAB, num_hidden_layers=4), LORA, gradient_checkpointing=False)
    compiled.load_state_dict(eager.state_dict())
    for module in (eager, compiled):  # non-zero adapters: their gradients reach the earlier layers
        for name, weight in module.named_parameters():
            if "lora_B" in name:
                torch.manual_seed(len(name))
                weight.data.normal_(0, 0.02)
    compiled.load_state_dict(eager.state_dict())
    assert regions.compile_in_scope(compiled, "layers") is compiled
    assert_trains_as_eager(compiled, eager, [packed_batch(VOCAB)])
    assert len(graphs) == 1
    layers = regions.repeated_layers(compiled)
    assert regions.compiled_layers(compiled) == 3 and layers[0]._compiled_call_impl is None


def test_uncompile_and_the_eager_stance_run_the_layers_eagerly(monkeypatch):
    graphs = count_graphs(monkeypatch)
    torch._dynamo.reset()
    model = tiny_llama(VOCAB, num_hidden_layers=2)
    regions.compile_in_scope(model, "layers")
    with regions.eager_stance():
        step_loss_and_grads(model, [packed_batch(VOCAB)])
    assert graphs == []
    regions.uncompile_layers(model)
    step_loss_and_grads(model, [packed_batch(VOCAB)])
    assert graphs == []


def test_a_model_without_transformer_layers_is_refused_in_one_line():
    with pytest.raises(ConfigError) as refused:
        regions.compile_in_scope(torch.nn.Sequential(torch.nn.Linear(4, 4)), "layers")
    assert "train.runtime.compile_scope" in str(refused.value) and "\n" not in str(refused.value)


def test_the_scope_is_a_parameter_and_reaches_the_runtime():
    params = parse_train_params({"runtime": {"compile_scope": "layers"}})
    assert params.runtime.compile_scope == "layers"
    config = RuntimeConfig(device="cpu", precision="fp32", compile=True, compile_scope="layers")
    runtime = setup_runtime(config)
    assert runtime.compile_scope == "layers" and runtime.describe()["compile_scope"] == "layers"
    model = tiny_llama(VOCAB, num_hidden_layers=2)
    assert runtime.compile_model(model) is model
    with pytest.raises(ConfigError, match="compile_scope"):
        parse_train_params({"runtime": {"compile_scope": "blocks"}})


def test_the_cpu_probe_measures_layers_and_undoes_them_when_eager_is_kept(monkeypatch):
    """``compile: auto`` on CPU with ``layers``: the probe's candidate is the model itself with its layers
    compiled; its eager passes run in the eager stance; kept eager, the layers are eager again."""
    from fastlm.engine.runtime import probe

    stances = []

    def measure(model, batch, runtime):
        compiled = regions.compiled_layers(model) == 2
        stances.append(compiled and not torch.compiler.is_compiling())
        return 1.0  # no gain: eager is kept

    model = tiny_llama(VOCAB, num_hidden_layers=2)
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=1, compile="auto"))
    runtime, result = probe.probe_runtime(
        runtime,
        "fp32",
        model,
        packed_batch(VOCAB),
        compile_probe=probe.CompileProbe("auto", 10**6, scope="layers"),
        measure=measure,
    )
    assert runtime.compile is False and result.compiled is None
    assert any(stances)  # the layers were compiled while measured
    assert regions.compiled_layers(model) == 0


@pytest.mark.parametrize("policy", ["full", "selective"])
def test_layers_compiled_under_gradient_checkpointing_give_the_eager_gradients(policy, monkeypatch):
    """Checkpointing recomputes each compiled layer in the backward: the gradients of eager without it, within
    the compiled tolerance, and at most one graph per checkpointing setting (selective: two)."""
    from fastlm.engine.model.recompute import checkpointed_layers, enable_checkpointing

    graphs = count_graphs(monkeypatch)
    stance = fresh_compile_state()
    batches = [packed_batch(VOCAB)]
    eager = tiny_llama(VOCAB, num_hidden_layers=4)
    compiled = tiny_llama(VOCAB, num_hidden_layers=4)
    compiled.load_state_dict(eager.state_dict())
    enable_checkpointing(compiled, policy)
    assert len(checkpointed_layers(compiled)) == (4 if policy == "full" else 2)
    regions.compile_in_scope(compiled, "layers")
    compiled.train()
    with torch.compiler.set_stance("default"):
        assert_trains_as_eager(compiled, eager, batches)
    assert regions.compiled_layers(compiled) == 4
    seen = (
        f"{len(graphs)} graphs; stance at the start {stance}; dynamo counters "
        f"{dict(torch._dynamo.utils.counters.get('stats', {}))}"
    )
    if not graphs:
        # Seen only after hundreds of earlier tests in one process (every layer compiled, the gradients
        # eager's, dynamo's counters showing its graphs): the compile went past this test's counting
        # backend. Said for a report; the count below is checked wherever the backend saw the compile.
        warnings.warn(f"the counting backend saw no graph: {seen}", stacklevel=1)
        return
    assert len(graphs) <= (1 if policy == "full" else 2), seen


def fresh_compile_state() -> str:
    """Dynamo's caches emptied and anything an earlier test left unreferenced collected (a context that
    set the compile stance is restored when its frame is collected), in the default stance; the stance
    found first, for a failure's message (said as a warning where it was not the default)."""
    import gc

    gc.collect()
    torch._dynamo.reset()
    stance = str(torch._dynamo.eval_frame._stance)
    if "stance='default'" not in stance:
        warnings.warn(f"an earlier test left the compile stance {stance}", stacklevel=2)
    return stance


def test_an_encoder_decoder_compiles_its_encoder_and_decoder_layers():
    from transformers import BartConfig, BartForConditionalGeneration

    config = BartConfig(
        vocab_size=64,
        d_model=16,
        encoder_layers=2,
        decoder_layers=3,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=32,
    )
    model = BartForConditionalGeneration(config)
    layers = regions.repeated_layers(model)
    assert [type(layer).__name__ for layer in layers] == ["BartEncoderLayer"] * 2 + ["BartDecoderLayer"] * 3
    assert regions.compile_in_scope(model, "layers") is model


# --- CUDA graphs: train.runtime.compile_mode reduce-overhead ------------------------------------------------


def _fixed_shape_varlen_batch(layout):
    """A packed micro-batch of one shape (rows of 20, 4 of them) whatever ``layout`` fills: the engine's
    collator with ``fixed_shape``, on the varlen path."""
    from fastlm.engine.data import PackedCollator
    from fastlm.engine.data.packing import TokenBudget
    from fastlm.engine.model.attention.inputs import to_device

    generator = torch.Generator().manual_seed(3)
    features = [
        {"input_ids": torch.randint(3, VOCAB, (n,), generator=generator).tolist(), "prompt_length": p}
        for n, p in layout
    ]
    collate = PackedCollator(
        pad_id=0, budget=TokenBudget(row_length=20, rows_per_batch=4), attention_mask_format="none",
        fixed_shape=True,
    )  # fmt: skip
    return to_device(collate(features), torch.device("cpu"), "torch_varlen")


def test_reduce_overhead_compiles_each_layer_for_cuda_graphs_once_on_one_shape(monkeypatch):
    """``reduce-overhead`` (CUDA graphs of each compiled layer: one launch per layer where each kernel was
    one) reaches ``torch.compile``; the micro-batches have one token count, so only the boundaries' count
    (a few powers of two) is marked dynamic and one trace serves micro-batches of every fill and boundary
    count, with the eager gradients."""
    seen = varlen_op.install(monkeypatch)
    modes, marked, graphs = [], [], []
    real_compile = torch.compile

    def backend(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    def recording_compile(model=None, **kwargs):
        modes.append(kwargs.get("mode"))
        return real_compile(model, backend=backend)

    monkeypatch.setattr(torch, "compile", recording_compile)
    real_mark = torch._dynamo.maybe_mark_dynamic
    monkeypatch.setattr(
        torch._dynamo, "maybe_mark_dynamic", lambda t, dim: marked.append(dim) or real_mark(t, dim)
    )
    torch._dynamo.reset()
    eager, model = varlen_twins()
    assert regions.compile_in_scope(model, "layers", mode="reduce-overhead") is model
    layouts = (PACKED_LAYOUT, *OTHER_LAYOUTS, ((20, 0),) * 4)  # 8 segments with the padding's; 4 with none
    batches = [_fixed_shape_varlen_batch(layout) for layout in layouts]
    assert len({tuple(batch["input_ids"].shape) for batch in batches}) == 1
    assert len({tuple(batch["cu_seq_lens"].shape) for batch in batches}) == 2
    for batch in batches:
        step_loss_and_grads(model, [batch])
    assert modes == ["reduce-overhead", "reduce-overhead"] and len(graphs) == 1
    assert set(marked) == {0} and len(marked) == len(batches)  # cu_seq_lens' count, in each batch
    assert set(seen) == {20}  # the row length as the longest segment: the padding's segments too
    assert_trains_as_eager(model, eager, batches[:1])


def test_reduce_overhead_is_refused_where_it_cannot_replay_one_graph():
    """Each contradiction is one line naming the parameter and the fix."""
    ok = parse_train_params(
        {"runtime": {"compile": True, "compile_scope": "layers", "compile_mode": "reduce-overhead"}}
    )
    assert ok.runtime.compile_mode == "reduce-overhead" and ok.runtime.fixed_shapes()
    graphs = {"compile": True, "compile_scope": "layers", "compile_mode": "reduce-overhead"}
    for weights in ("auto", "fp32"):  # fp32 weights too: the step owns each micro-batch's graph outputs
        accumulated = parse_train_params(
            {"runtime": {**graphs, "param_dtype": weights}, "batching": {"gradient_accumulation_steps": 4}}
        )
        assert accumulated.batching.gradient_accumulation_steps == 4
    assert not parse_train_params({}).runtime.fixed_shapes()
    # auto: off unless tune writes a policy, and tune measures none under CUDA graphs
    assert parse_train_params({"runtime": graphs, "model": {"gradient_checkpointing": "auto"}})
    cases = [  # (train.runtime, the other sections, what the line names)
        ({"compile": False, "compile_scope": "layers"}, {}, "train.runtime.compile"),
        ({"compile_scope": "model"}, {}, "train.runtime.compile_scope"),
        ({"compile_scope": "layers"}, {"batching": {"mode": "dynamic"}}, "train.batching.mode"),
        ({"compile_scope": "layers", "device": "cpu"}, {}, "this run is on CPU"),
        ({"compile_scope": "layers"}, {"distributed": {"strategy": "fsdp", "nproc_per_node": 2}}, "fsdp"),
        # a checkpointed layer runs its forward again in the backward (pytorch/pytorch#154306)
        ({"compile_scope": "layers"}, {"model": {"gradient_checkpointing": "selective"}}, "checkpointing"),
        ({"compile_scope": "layers"}, {"model": {"gradient_checkpointing": True}}, "checkpointing"),
    ]
    for runtime, other, named in cases:
        with pytest.raises(ConfigError) as refused:
            parse_train_params({"runtime": {**runtime, "compile_mode": "reduce-overhead"}, **other})
        message = str(refused.value)
        assert named in message and "compile_mode" in message and "\n" not in message, message
    with pytest.raises(ConfigError, match="compile_mode"):
        parse_train_params({"runtime": {"compile_mode": "max-autotune"}})


def test_an_adapter_layers_graphs_hold_nothing_that_keeps_cuda_graphs_off(monkeypatch):
    """What inductor checks before it records a CUDA graph, on the aten graphs of a LoRA layer (forward and
    backward, the varlen kernel's calling contract, micro-batches of one shape): one graph each way (no
    graph break: each piece would be a graph of its own, with eager code between), no op it cannot capture
    (``torch._inductor.utils.get_first_incompatible_cudagraph_node``: an op tagged unsafe, a size read from
    the data) and no input other than tensors and sizes (inductor then records no graph)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._inductor.utils import get_first_incompatible_cudagraph_node

    from fastlm.engine.config import LoraParams
    from fastlm.engine.model.lora import apply_lora

    varlen_op.install(monkeypatch)
    checked = []

    def check(gm, example_inputs):
        other = [type(t) for t in example_inputs if not isinstance(t, (torch.Tensor, torch.SymInt))]
        checked.append((get_first_incompatible_cudagraph_node(gm), other))
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=check, bw_compiler=check)
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model=None, **kwargs: real_compile(model, backend=backend))
    torch._dynamo.reset()
    model = apply_lora(
        tiny_llama(VOCAB, num_hidden_layers=3),
        LoraParams(enabled=True, r=4, dropout=0.0),
        gradient_checkpointing=False,
    )
    model.config._attn_implementation = "torch_varlen"
    regions.compile_in_scope(model, "layers", mode="reduce-overhead")
    step_loss_and_grads(model, [_fixed_shape_varlen_batch(PACKED_LAYOUT)])
    assert len(checked) == 2  # one layer graph's forward and backward (the first layer runs eagerly)
    for incompatible, other in checked:
        assert incompatible is None and other == []


def test_a_run_compiles_as_its_parameters_say_whatever_runtime_it_is_handed(monkeypatch, tmp_path):
    """``train.runtime.compile_scope`` and ``compile_mode`` are the run's parameters: a runtime set up without
    them (an API caller's ``RuntimeConfig``; benchmarks/gpu_speed.py's, where the whole model was compiled
    while its parameters said layers) trains as the parameters say, and the run's runtime records it."""
    from fastlm.engine.train.loop import train
    from tests.support.toy_training import EOS, toy_model, toy_params, toy_sequences

    modes = []
    real_compile = torch.compile

    def recording_compile(model=None, **kwargs):
        modes.append(kwargs.get("mode"))
        return real_compile(model, backend="eager")

    monkeypatch.setattr(torch, "compile", recording_compile)
    torch._dynamo.reset()
    runtime = {"device": "auto", "precision": "fp32", "compile": True, "compile_scope": "layers"}
    params = toy_params(tmp_path, runtime={**runtime, "compile_mode": "reduce-overhead"}, max_steps=2)
    handed = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", compile=True, num_threads=1))
    assert handed.compile_scope == "model" and handed.compile_mode == "default"
    model = toy_model(0, "sdpa")
    result = train(
        model,
        toy_sequences(60, 1),
        None,
        params=params,
        runtime=handed,
        pad_id=EOS,
        max_length=64,
        attn="sdpa",
    )
    layers = len(regions.repeated_layers(model))
    assert regions.compiled_layers(result.model) == layers and modes == ["reduce-overhead"] * layers
    assert result.runtime.compile_scope == "layers" and result.runtime.compile_mode == "reduce-overhead"
    # the run says whether CUDA graphs ran (here: no CUDA; the eager backend compiles nothing to skip)
    assert result.summary["cuda_graphs"] == "none: this run is on cpu"


def test_the_census_counts_the_compiled_graphs_that_ran_without_a_cuda_graph():
    """What a run's summary reports under ``reduce-overhead`` (``cuda_graphs``): the CUDA graphs recorded and
    the compiled graphs inductor ran without one, counted over the run. On this CPU inductor compiles a
    layer's forward and backward and records no graph: each one it skipped is counted."""
    torch._dynamo.reset()  # a compile of its own, not a frame another test left cached
    before = regions.cuda_graph_census(torch.device("cpu"))
    layer = torch.compile(torch.nn.Linear(8, 8), mode="reduce-overhead")
    layer(torch.randn(4, 8, requires_grad=True)).sum().backward()
    after = regions.cuda_graph_census(torch.device("cpu"))
    assert after.recorded is None and after.skipped > before.skipped
    text = regions.describe_cuda_graphs(before, after, torch.device("cpu"))
    assert text == f"none: this run is on cpu ({after.skipped - before.skipped} compiled graphs ran without)"
    # on CUDA: the graphs recorded, and a pointer to inductor's reasons for any it skipped
    recorded = regions.GraphCensus(recorded=56, skipped=before.skipped)
    assert regions.describe_cuda_graphs(before, recorded, torch.device("cuda")) == "56 recorded"
    skipped = regions.GraphCensus(recorded=0, skipped=before.skipped + 2)
    text = regions.describe_cuda_graphs(before, skipped, torch.device("cuda"))
    assert (
        text.startswith("0 recorded; 2 compiled graphs ran without one") and "TORCH_LOGS=cudagraphs" in text
    )


def test_the_compile_clock_times_torch_compile_while_entered_and_nothing_after():
    """``CompileClock`` reads dynamo's own compile callbacks: a compile counts while it is entered (a
    function compiled, then compiled again for another rank of input), a cached call and anything after
    its exit do not."""
    torch._dynamo.reset()
    function = torch.compile(lambda x: x.sin() + 1, backend="eager")
    with regions.CompileClock() as clock:
        function(torch.ones(3))
        function(torch.ones(3))  # cached: no compile
        function(torch.ones(2, 2))
        assert clock.compiles == 2 and clock() > 0
    seconds = clock()
    function(torch.ones(2, 2, 2))
    assert clock.compiles == 2 and clock() == seconds


class _Collect(logging.Handler):
    """A user's own handler: the records that reach it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _quiet_frame_logger() -> None:
    logging.getLogger(regions.DYNAMO_FRAME_LOGGER).setLevel(logging.ERROR)


def _quiet_dynamo_logs() -> None:
    torch._logging.set_logs(dynamo=logging.ERROR)  # what TORCH_LOGS="-dynamo" sets


def _quiet_torch_logger() -> None:
    logging.getLogger("torch").setLevel(logging.ERROR)  # a logging config's `torch: ERROR`


@pytest.mark.parametrize(
    "quiet",
    [None, _quiet_frame_logger, _quiet_dynamo_logs, _quiet_torch_logger],
    ids=lambda q: getattr(q, "__name__", "default"),
)
def test_the_compile_clock_sees_dynamos_recompile_limit_whatever_the_log_levels(quiet, caplog):
    """Past ``torch._dynamo.config.recompile_limit`` dynamo runs the function eagerly and says so only at
    WARNING on its own logger: a level above WARNING there or on a parent (a logging config, ``TORCH_LOGS``)
    must not hide the hit from the run. The hit is recorded with the function's name and said once on
    fastlm's log, and the user's own handlers see exactly what they saw before (the warning only where
    their levels let it through); every level is as it was after."""
    names = ("torch", "torch._dynamo", regions.DYNAMO_FRAME_LOGGER)
    levels = {name: logging.getLogger(name).level for name in names}
    users = _Collect()
    logging.getLogger("torch._dynamo").addHandler(users)
    torch._dynamo.reset()

    def tiny_shapes(x):
        return x * 2

    function = torch.compile(tiny_shapes, backend="eager", dynamic=False)
    try:
        if quiet is not None:
            quiet()
        set_levels = {name: logging.getLogger(name).level for name in names}
        with (
            torch._dynamo.config.patch(recompile_limit=1),
            caplog.at_level(logging.WARNING, logger="fastlm"),
            regions.CompileClock() as clock,
        ):
            for n in (1, 2, 3):
                assert torch.equal(function(torch.ones(n)), torch.full((n,), 2.0))
        after = {name: logging.getLogger(name).level for name in names}
    finally:
        logging.getLogger("torch._dynamo").removeHandler(users)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        if quiet is _quiet_dynamo_logs:
            torch._logging.set_logs()
        torch._dynamo.reset()
    assert [hit.split(" ")[0] for hit in clock.recompile_limit_hits()] == ["tiny_shapes"]
    said = [r.getMessage() for r in caplog.records if r.name.startswith("fastlm")]
    assert len(said) == 1 and "tiny_shapes" in said[0] and "Fix:" in said[0]
    seen = [
        r for r in users.records if r.name == regions.DYNAMO_FRAME_LOGGER and r.levelno >= logging.WARNING
    ]
    assert len(seen) == (1 if quiet is None else 0)
    assert after == set_levels
    assert not logging.getLogger(regions.DYNAMO_FRAME_LOGGER).filters


def test_the_compile_clock_counts_a_recompile_limit_hit_dynamo_did_not_log(caplog):
    """A logger disabled outright (``logging.config.dictConfig``'s ``disable_existing_loggers``, the default,
    applied after torch's import) drops dynamo's warning whatever its level: dynamo's own count of the hit
    (``counters["unimplemented"]``) still records it, unnamed, and the run says it once when read."""
    frame_logger = logging.getLogger(regions.DYNAMO_FRAME_LOGGER)
    torch._dynamo.reset()

    def tiny_unlogged(x):
        return x + 1

    function = torch.compile(tiny_unlogged, backend="eager", dynamic=False)
    frame_logger.disabled = True
    try:
        with (
            torch._dynamo.config.patch(recompile_limit=1),
            caplog.at_level(logging.WARNING, logger="fastlm"),
            regions.CompileClock() as clock,
        ):
            for n in (1, 2):
                function(torch.ones(n))
            hits = clock.recompile_limit_hits()
            assert clock.recompile_limit_hits() == hits  # said once however often it is read
    finally:
        frame_logger.disabled = False
        torch._dynamo.reset()
    assert len(hits) == 1 and hits[0].startswith("unnamed")
    said = [r.getMessage() for r in caplog.records if r.name.startswith("fastlm")]
    assert len(said) == 1 and "recompile_limit" in said[0] and "Fix:" in said[0]


class _Embedder(torch.nn.Module):
    """An embedding and a head: the least a model NEFTune hooks into needs (``get_input_embeddings``)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = torch.nn.Embedding(VOCAB, 8), torch.nn.Linear(8, VOCAB)

    def get_input_embeddings(self):
        return self.embed

    def forward(self, input_ids):
        return self.head(self.embed(input_ids))


def test_a_model_given_hooks_after_another_of_its_class_compiled_runs_them_compiled():
    """A sweep's runs train in one process: one compiled without NEFTune (``neftune_noise_alpha: 0``), the
    next with it. Dynamo did not guard on module hooks (``skip_nnmodule_hook_guards``), so the second model,
    of the same class, ran the first one's graph, traced without hooks: trained on clean embeddings (a tiny
    Llama's losses equal to the plain run's) while its summary said alpha 5. A model compiled here is guarded
    on its hooks: the second traces its own graph, with the noise."""
    from fastlm.engine.model.noise import add_neftune

    torch._dynamo.reset()
    # dynamo's default, put back after (a monkeypatch would delete the setting: the config module keeps it
    # outside the instance __dict__ a monkeypatch restores)
    with torch._dynamo.config.patch(skip_nnmodule_hook_guards=True):

        def backend(graph, example_inputs):
            return graph.forward

        ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
        plain = _Embedder()
        with torch.no_grad():
            regions.compile_in_scope(plain, "model", backend=backend)(input_ids=ids)  # traced without hooks
            clean = plain(input_ids=ids)
            noisy = _Embedder()  # the same weights (seed 0)
            add_neftune(noisy, 5.0)
            torch.manual_seed(1)
            eager = noisy(input_ids=ids)
            torch.manual_seed(1)
            compiled = regions.compile_in_scope(noisy, "model", backend=backend)(input_ids=ids)
        assert (eager - clean).abs().max() > 100 * OTHER_FP32_MODEL["atol"]  # the noise shows in the logits
        torch.testing.assert_close(compiled, eager, **OTHER_FP32_MODEL)
