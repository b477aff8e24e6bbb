"""bf16 weights with fp32 masters (``train.runtime.param_dtype: bf16``, engine/train/master_weights.py).

The step makes the activation passes of a bf16 model (not those of autocast over fp32 weights), its optimizer
updates fp32 masters that the bf16 weights follow, micro-batches accumulate in fp32, checkpoints hold the
masters and a resumed run continues exactly, the run returns fp32 weights, and a request that cannot apply
is refused in one line."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from fastlm.engine.config import parse_train_params
from fastlm.engine.model.accumulation import accumulate_gradients
from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
from fastlm.engine.train.master_weights import MasterWeights, choose_param_dtype
from fastlm.engine.train.step import Optimization, make_optimization, train_step
from fastlm.errors import ConfigError
from tests.support import ddp_ranks, fsdp_ranks
from tests.support.checkpoints import steps_on_disk
from tests.support.lora_checks import ActivationOps, token_batch
from tests.support.tolerances import BF16_MODEL_LOSS_REL
from tests.support.toy_training import VOCAB, run_toy, toy_model, toy_params

pytestmark = pytest.mark.kernels

ROWS, TOKENS = 2, 37  # 74 activation rows: no weight of the toy model has 74 rows


def _runtime(precision: str = "bf16"):
    return setup_runtime(RuntimeConfig(device="cpu", precision=precision, compile=False, num_threads=1))


def _params(param_dtype: str, **optimizer):
    return parse_train_params(
        {
            "runtime": {"device": "cpu", "precision": "bf16", "param_dtype": param_dtype, "float8": "off"},
            "loss": {"fused_linear": False},
            "optimizer": {"lr": 1e-2, "warmup_steps": 0, **optimizer},
        }
    )


def _bf16_weights(model):
    """A copy of ``model`` with its weights cast to bf16 (its buffers, such as the rotary frequencies, kept as
    they are, as ``MasterWeights`` keeps them)."""
    model = copy.deepcopy(model)
    for param in model.parameters():
        param.data = param.data.to(torch.bfloat16)
    return model


def _plain(model) -> Optimization:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    return Optimization(model, optimizer, scheduler, torch.amp.GradScaler("cpu", enabled=False), math.inf)


def _activation_ops(model, opt, runtime) -> tuple[ActivationOps, int]:
    """The step's activation passes, and the bytes of the tensors its forward keeps for backward that are
    not the model's weights (activations, and autocast's bf16 copies of fp32 weights)."""
    batch = token_batch(VOCAB, TOKENS, rows=ROWS)
    weights = {param.untyped_storage().data_ptr() for param in model.parameters()}
    kept: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    with ActivationOps(ROWS * TOKENS) as ops, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        train_step(model, [batch], opt, runtime=runtime)
    return ops, sum(kept.values())


def test_the_step_makes_the_activation_passes_of_a_bf16_model_not_those_of_autocast_over_fp32():
    """The residual stream, the norms' outputs and every add are bf16: no projection casts its input and no
    input gradient is cast back and summed in fp32. Counted against the same step of the model cast to bf16
    (the computation bf16 weights must make) and of autocast over fp32 weights (what it replaces). Without
    liger's norm kernel (this CPU) a bf16 model's norms cast to fp32 and back inside, so the counts of
    passes are close; the bytes they write and keep for backward are not."""
    runtime = _runtime()
    model = toy_model()
    bf16_model = _bf16_weights(model)
    autocast_model = copy.deepcopy(model)
    opt = make_optimization(model, _params("bf16"), runtime, total_steps=2)

    ours, ours_kept = _activation_ops(model, opt, runtime)
    bf16, bf16_kept = _activation_ops(bf16_model, _plain(bf16_model), runtime)
    autocast, autocast_kept = _activation_ops(autocast_model, _plain(autocast_model), runtime)

    assert ours.counts == bf16.counts and ours.written == bf16.written and ours_kept == bf16_kept
    assert {param.dtype for param in model.parameters()} == {torch.bfloat16}
    # autocast over fp32 weights: fp32 residual stream and sums, each projection's input cast (measured:
    # 1.26x the bytes written, 3.7x those of fp32 adds, 1.44x the bytes kept for backward)
    assert sum(autocast.written.values()) > 1.2 * sum(ours.written.values())
    assert autocast.written["add", "float32"] > 3 * ours.written["add", "float32"]
    assert autocast_kept > 1.3 * ours_kept


def test_the_optimizer_updates_fp32_masters_and_the_model_holds_their_bf16_copy():
    runtime = _runtime()
    model = toy_model()
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    opt = make_optimization(model, _params("bf16"), runtime, total_steps=3)
    masters = opt.masters
    assert isinstance(masters, MasterWeights) and "bf16 weights" in opt.param_dtype_choice
    stepped = [p for group in opt.optimizer.param_groups for p in group["params"]]
    assert {p.dtype for p in stepped} == {torch.float32}
    assert {id(p) for p in stepped} == {id(masters.master_of(p)) for p in model.parameters()}

    for seed in range(2):
        train_step(model, [token_batch(VOCAB, TOKENS, rows=ROWS, seed=seed)], opt, runtime=runtime)

    for name, param in model.named_parameters():
        master = masters.master_of(param)
        assert torch.equal(param.detach(), master.detach().to(torch.bfloat16)), name  # the same cast
        assert param.grad is None and master.grad is None, name
        assert not torch.equal(master.detach(), before[name]), name


def test_an_update_below_bf16_resolution_accumulates_in_the_masters():
    """AdamW's first steps move each weight by about lr; at lr 1e-4 a weight at 1 moves by less than half a
    bf16 step (2^-9) in four steps, so a bf16 weight updated in place would stay at 1: the masters keep the
    updates, the bf16 copies round them away until they add up to a bf16 step."""
    runtime = _runtime()
    model = toy_model()
    with torch.no_grad():
        model.model.norm.weight.fill_(1.0)
    opt = make_optimization(model, _params("bf16", lr=1e-4, weight_decay=0.0), runtime, total_steps=4)
    norm = model.model.norm.weight
    for seed in range(4):
        train_step(model, [token_batch(VOCAB, TOKENS, rows=ROWS, seed=seed)], opt, runtime=runtime)

    moved = (opt.masters.master_of(norm).detach() - 1.0).abs()
    assert 2e-4 < moved.max() < 2**-9  # several steps of about lr each, all below half a bf16 step
    assert torch.equal(norm.detach(), torch.ones_like(norm))


def test_micro_batches_accumulate_in_fp32():
    """Two micro-batches: each master's gradient is the fp32 sum of the two bf16 gradients the bf16 model
    gives each micro-batch (the same computations, so equal), not their bf16 sum."""
    runtime = _runtime()
    model = toy_model()
    reference = _bf16_weights(model)
    masters = MasterWeights(model)
    batches = [token_batch(VOCAB, TOKENS, rows=ROWS, seed=seed) for seed in (5, 6)]
    total = sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches)

    accumulate_gradients(model, batches, autocast=runtime.autocast_context, total_targets=total)

    sums = {}
    for batch in batches:
        reference.zero_grad(set_to_none=True)
        accumulate_gradients(reference, [batch], autocast=runtime.autocast_context, total_targets=total)
        for name, param in reference.named_parameters():
            sums[name] = param.grad.float() + sums.get(name, 0)
    for name, param in model.named_parameters():
        assert param.grad is None, name  # moved into the master as soon as autograd had it
        assert torch.equal(masters.master_of(param).grad, sums[name]), name


SMALL = 2.0**-10  # below bf16's resolution at 1 (2**-7): 1 + SMALL is 1 in bf16
DDP_GRAD = torch.tensor([[((1.0 + SMALL) + (SMALL + SMALL)) / 2]])  # fp32 sums of powers of two


@pytest.fixture(scope="module")
def ddp_ranks_run(tmp_path_factory):
    """Two DDP ranks, two micro-batches each (the first under ``no_sync``), rank 0 summing 1 + 2**-10, rank
    1 starting from another weight; a plain run and one updating in the backward (tests/support/ddp_ranks)."""
    folder = tmp_path_factory.mktemp("ddp_ranks")
    return ddp_ranks.run(folder, inputs=[[1.0, SMALL], [SMALL, SMALL]], initial=[1.0, 3.0], lr=0.1)


def test_ddp_adds_every_rank_and_micro_batch_into_the_masters_in_fp32(ddp_ranks_run):
    """Each rank's master gradient is the fp32 average over the ranks of each rank's fp32 sum of its
    micro-batches' gradients: a sum in bf16 anywhere (the micro-batches', or DDP's all-reduce in the weights'
    dtype) would give another figure. A second step starts from nothing left over; rank 1's own initial
    weight gives way to rank 0's in its master too, as DDP makes every replica equal."""
    assert DDP_GRAD.item() != torch.tensor(1.0 + SMALL, dtype=torch.bfloat16).item() / 2  # what bf16 gives
    for rank, seen in enumerate(run["plain"] for run in ddp_ranks_run):
        assert torch.equal(seen["initial"], torch.ones(1, 1)), rank  # rank 0's weight, in fp32
        for grad in seen["grads"]:
            assert grad.dtype == torch.float32
            torch.testing.assert_close(grad, DDP_GRAD, rtol=1e-6, atol=0, msg=f"rank {rank}")
        for grad in seen["model_grads"]:  # the bf16 weight keeps no gradient a next step would add to
            assert grad is None or not grad.any(), rank


def test_under_ddp_the_masters_are_updated_in_backward_from_their_reduced_gradients(ddp_ranks_run):
    """``train.optimizer.in_backward`` under DDP: DDP's reduction (the comm hook) updates each master of a
    bucket from its fp32-reduced gradient in the last micro-batch's backward and frees the gradient (the
    ranks assert it): the updates of an AdamW given that gradient after the backward, on every rank."""
    reference = torch.nn.Parameter(torch.ones(1, 1))
    adamw = torch.optim.AdamW([reference], lr=0.1, weight_decay=0.0)
    want = []
    for _ in range(2):
        reference.grad = DDP_GRAD.clone()
        adamw.step()
        want.append(reference.detach().clone())
    for rank, seen in enumerate(run["in_backward"] for run in ddp_ranks_run):
        for got, expected, norm in zip(seen["masters"], want, seen["grads"], strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-6, atol=0, msg=f"rank {rank}")
            torch.testing.assert_close(norm, DDP_GRAD, rtol=1e-6, atol=0, msg=f"rank {rank}")
        for grad in seen["model_grads"]:
            assert grad is None or not grad.any(), rank


def _accumulators(model) -> list:
    """Each weight's gradient accumulator: the autograd node DDP hooks its reduction onto."""
    return [param.view_as(param).grad_fn.next_functions[0][0] for param in model.parameters()]


def test_saving_and_loading_through_the_masters_keep_each_weight_s_gradient_accumulator():
    """Checkpoints read and write the masters (``full_precision``). A weight whose tensor changed dtype on
    the way would get a new gradient accumulator, and DDP, which hooked its reduction onto the old one, would
    stop reducing it after the first checkpoint (its trained weights went apart from one process's)."""
    model = toy_model()
    masters = MasterWeights(model)
    before = _accumulators(model)
    with masters.full_precision():
        state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
        assert all(t.dtype == torch.float32 for t in state.values())
        model.load_state_dict(state)
    after = _accumulators(model)
    assert all(a is b for a, b in zip(after, before, strict=True))
    assert {param.dtype for param in model.parameters()} == {torch.bfloat16}


def test_a_probe_backward_before_the_first_step_leaves_no_gradient_in_the_masters():
    """The runtime's probes run a forward and backward on the stepping model and drop the gradients with
    ``model.zero_grad``, which does not reach the masters: the first step must still see its own gradients
    only."""
    runtime = _runtime()
    batch = token_batch(VOCAB, TOKENS, rows=ROWS, seed=1)
    seen = []
    for probed in (False, True):
        model = toy_model()
        opt = make_optimization(model, _params("bf16"), runtime, total_steps=1)
        if probed:
            accumulate_gradients(
                model, [token_batch(VOCAB, TOKENS, rows=ROWS, seed=9)], autocast=runtime.autocast_context
            )
            model.zero_grad(set_to_none=True)
        grads = {}
        opt.optimizer.register_step_pre_hook(
            lambda optimizer, args, kwargs, grads=grads: grads.update(
                {
                    i: p.grad.clone()
                    for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])
                }
            )
        )
        train_step(model, [batch], opt, runtime=runtime)
        seen.append(grads)
    assert seen[0].keys() == seen[1].keys()
    for index in seen[0]:
        assert torch.equal(seen[0][index], seen[1][index]), index  # the same computation


def test_losses_follow_autocast_over_fp32_weights():
    """Five steps of bf16 weights with fp32 masters against bf16 autocast over fp32 weights: two bf16
    computations of the same updates, their losses within the bf16 loss tolerance."""
    runtime = _runtime()
    losses = {}
    for param_dtype in ("bf16", "fp32"):
        model = toy_model()
        opt = make_optimization(model, _params(param_dtype), runtime, total_steps=5)
        assert (opt.masters is not None) == (param_dtype == "bf16")
        losses[param_dtype] = []
        for seed in range(5):
            batch = token_batch(VOCAB, TOKENS, rows=ROWS, seed=seed)
            result = train_step(model, [batch], opt, runtime=runtime)
            losses[param_dtype].append(float(result.loss_sum) / result.target_tokens)
    assert losses["bf16"][-1] < losses["bf16"][0]
    for ours, theirs in zip(losses["bf16"], losses["fp32"], strict=True):
        assert abs(ours - theirs) <= BF16_MODEL_LOSS_REL * abs(theirs)


def _bf16_run(tmp_path, **overrides):
    return toy_params(
        tmp_path,
        runtime={"precision": "bf16", "param_dtype": "bf16", "deterministic": True},
        log_every=1,
        save_every=2,
        eval_every=None,
        max_steps=6,
        **overrides,
    )


def test_checkpoints_hold_the_masters_a_resumed_run_continues_exactly_and_the_run_returns_fp32(tmp_path):
    import safetensors.torch

    straight = run_toy(_bf16_run(tmp_path / "a"), attn="eager")  # bf16: run_toy's docstring
    assert "bf16 weights" in straight.summary["param_dtype"]
    assert {p.dtype for p in straight.model.parameters()} == {torch.float32}

    def interrupt(kind, record):
        if record["step"] == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_toy(_bf16_run(tmp_path / "b"), callbacks=[interrupt], attn="eager")
    assert steps_on_disk(tmp_path / "b" / "checkpoints")[-1] == "checkpoint-00000002"
    saved = safetensors.torch.load_file(
        str(tmp_path / "b" / "checkpoints" / "checkpoint-00000002" / "model.safetensors")
    )
    assert {t.dtype for t in saved.values()} == {torch.float32}
    assert any(not torch.equal(t, t.to(torch.bfloat16).float()) for t in saved.values())  # not bf16 values

    resumed = run_toy(_bf16_run(tmp_path / "b", resume="auto"), attn="eager")
    assert resumed.history[-1]["loss"] == straight.history[-1]["loss"]  # bitwise: deterministic mode
    for a, b in zip(straight.model.parameters(), resumed.model.parameters(), strict=True):
        assert a.dtype == torch.float32 and torch.equal(a, b)


def test_weights_kept_in_fp32_by_the_model_train_as_they_are():
    model = toy_model()
    model._keep_in_fp32_modules = ["down_proj"]
    masters = MasterWeights(model)
    for name, param in model.named_parameters():
        kept = "down_proj" in name
        assert param.dtype == (torch.float32 if kept else torch.bfloat16), name
        assert (masters.master_of(param) is param) == kept, name


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"runtime": {"precision": "fp32", "param_dtype": "bf16"}}, "train.runtime.param_dtype"),
    ],
)
def test_a_request_that_cannot_apply_is_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as error:
        parse_train_params(overrides)
    text = str(error.value)
    assert "param_dtype" in text and message in text and "\n" not in text.strip()


def test_auto_takes_bf16_weights_only_for_a_bf16_full_fine_tune_on_a_gpu():
    model = toy_model()
    bf16, gpu = torch.bfloat16, {"device": "cuda"}
    assert choose_param_dtype("auto", model, autocast_dtype=bf16, world_size=1, **gpu)[0] is bf16
    dtype, why = choose_param_dtype("auto", model, autocast_dtype=bf16, world_size=2, **gpu)
    assert dtype is bf16 and "under DDP" in why  # reduced in fp32 into the masters
    ddp = {"runtime": {"param_dtype": "bf16"}, "distributed": {"nproc_per_node": 2}}
    assert parse_train_params(ddp).runtime.param_dtype == "bf16"
    for kwargs in (
        {"autocast_dtype": None, "world_size": 1, **gpu},
        {"autocast_dtype": bf16, "world_size": 1, "device": "cpu"},  # asked for with bf16, not by default
    ):
        dtype, why = choose_param_dtype("auto", model, **kwargs)
        assert dtype is None and "param_dtype auto" in why
    assert choose_param_dtype("bf16", model, autocast_dtype=bf16, world_size=1, device="cpu")[0] is bf16
    dtype, why = choose_param_dtype("auto", model, autocast_dtype=bf16, world_size=2, strategy="fsdp", **gpu)
    assert (
        dtype is bf16 and "FSDP2" in why
    )  # its MixedPrecisionPolicy: fp32 shards, gradients reduced in fp32
    fsdp = {"runtime": {"param_dtype": "bf16"}, "distributed": {"nproc_per_node": 2, "strategy": "fsdp"}}
    assert parse_train_params(fsdp).runtime.param_dtype == "bf16"
    model.model.embed_tokens.weight.requires_grad_(False)
    assert choose_param_dtype("auto", model, autocast_dtype=bf16, world_size=1, **gpu)[0] is None
    with pytest.raises(ConfigError, match="frozen"):
        choose_param_dtype("bf16", model, autocast_dtype=bf16, world_size=1, **gpu)


def _in_backward_run(in_backward: bool, steps: int = 3, micro_batches: int = 2, tied: bool = False):
    """``steps`` steps of ``micro_batches`` each on the toy model with bf16 weights, grad_clip null; what
    each step's last backward held: the most master gradients alive at once (counted after each weight's
    gradient moved), and the step results."""
    runtime = _runtime()
    model = toy_model(tied=tied)
    optimizer = {"grad_clip": None, "in_backward": in_backward}
    opt = make_optimization(model, _params("bf16", **optimizer), runtime, total_steps=steps)
    masters = [master for _, master in opt.masters.pairs]
    alive = []
    for param in model.parameters():  # after MasterWeights' own hook on each weight
        param.register_post_accumulate_grad_hook(
            lambda _: alive.append(sum(master.grad is not None for master in masters))
        )
    results, peaks = [], []
    for step in range(steps):
        batches = [token_batch(VOCAB, TOKENS, rows=ROWS, seed=10 * step + i) for i in range(micro_batches)]
        alive.clear()
        results.append(train_step(model, batches, opt, runtime=runtime))
        peaks.append(max(alive[-len(masters) :]))  # the last micro-batch's backward
    return model, opt, results, peaks


def test_updates_in_backward_equal_the_step_after_it_and_free_each_gradient_at_once():
    """``train.optimizer.in_backward``: each master is updated as soon as its gradient is complete in the
    last micro-batch's backward, by an optimizer of its own sharing the run's optimizer's state. The same
    updates as AdamW's step after the backward (the same fused kernel, one tensor at a time), the same
    gradient norms, the same optimizer state (checkpoints), and no master gradient outliving its own
    update in that backward where a step has one micro-batch (with more, the gradients accumulated so far
    are held until each update), where the step after the backward holds them all."""
    peaks = _in_backward_run(True, micro_batches=1)[3]
    twin_peaks = _in_backward_run(False, micro_batches=1)[3]
    model, opt, results, _ = _in_backward_run(True)  # two micro-batches
    twin, twin_opt, twin_results, _ = _in_backward_run(False)
    assert "in the backward" in opt.param_dtype_choice
    assert max(peaks) == 0 and min(twin_peaks) == len(opt.masters.pairs) > 1
    for (name, param), other in zip(model.named_parameters(), twin.parameters(), strict=True):
        mine, theirs = opt.masters.master_of(param), twin_opt.masters.master_of(other)
        torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-7, msg=name)  # fp32 rounding at most
        assert mine.grad is None and param.grad is None, name
    for got, want in zip(results, twin_results, strict=True):
        torch.testing.assert_close(got.grad_norm, want.grad_norm, rtol=1e-5, atol=0)  # summed in other orders
        assert got.lr == want.lr
    state, twin_state = opt.optimizer.state_dict(), twin_opt.optimizer.state_dict()
    assert state["param_groups"] == twin_state["param_groups"]
    assert state["state"].keys() == twin_state["state"].keys()
    for index, saved in state["state"].items():
        for key, value in saved.items():
            torch.testing.assert_close(value, twin_state["state"][index][key], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_a_tied_embedding_is_updated_in_backward_once_from_both_of_its_uses(micro_batches):
    """The input embedding and the output head share one weight (``tie_word_embeddings``): its gradient is
    complete only once both uses have added theirs, and its master is updated then, once. The same masters
    and gradient norms as the step after the backward."""
    model, opt, results, _ = _in_backward_run(True, micro_batches=micro_batches, tied=True)
    twin, twin_opt, twin_results, _ = _in_backward_run(False, micro_batches=micro_batches, tied=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    for (name, param), other in zip(model.named_parameters(), twin.parameters(), strict=True):
        mine, theirs = opt.masters.master_of(param), twin_opt.masters.master_of(other)
        torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-7, msg=name)  # fp32 rounding at most
    for got, want in zip(results, twin_results, strict=True):
        torch.testing.assert_close(got.grad_norm, want.grad_norm, rtol=1e-5, atol=0)  # summed in other orders


def test_a_run_updating_in_backward_resumes_exactly(tmp_path):
    """A resume loads the optimizer's state dict, which replaces its state and its parameter groups: the
    masters' own optimizers must read the loaded ones (the AdamW moments and the scheduled rate), or a
    resumed run would start its moments over."""
    in_backward = {"optimizer": {"in_backward": True, "grad_clip": None}}

    def interrupt(kind, record):
        if record["step"] == 3:
            raise KeyboardInterrupt

    straight = run_toy(_bf16_run(tmp_path / "a", **in_backward), attn="eager")
    assert "in the backward" in straight.summary["param_dtype"]
    with pytest.raises(KeyboardInterrupt):
        run_toy(_bf16_run(tmp_path / "b", **in_backward), callbacks=[interrupt], attn="eager")
    resumed = run_toy(_bf16_run(tmp_path / "b", resume="auto", **in_backward), attn="eager")
    assert resumed.history[-1]["loss"] == straight.history[-1]["loss"]  # bitwise: deterministic mode
    for a, b in zip(straight.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_backward_outside_a_step_updates_nothing_in_backward():
    """A probe's forward and backward (before the first step) must not move any weight."""
    runtime = _runtime()
    model = toy_model()
    opt = make_optimization(model, _params("bf16", grad_clip=None, in_backward=True), runtime, total_steps=1)
    before = [master.detach().clone() for _, master in opt.masters.pairs]
    accumulate_gradients(
        model, [token_batch(VOCAB, TOKENS, rows=ROWS, seed=3)], autocast=runtime.autocast_context
    )
    for (_, master), kept in zip(opt.masters.pairs, before, strict=True):
        assert torch.equal(master.detach(), kept) and master.grad is not None  # accumulated, not applied


def test_out_of_memory_after_the_first_updates_in_backward_is_not_a_step_to_redo():
    """The loop redoes a step that ran out of memory with a smaller micro-batch; once the backward updated
    some weights, redoing it would update them twice: a plain error naming the remedy instead."""
    runtime = _runtime()
    model = toy_model()
    opt = make_optimization(model, _params("bf16", grad_clip=None, in_backward=True), runtime, total_steps=1)

    def out_of_memory(_):
        raise torch.OutOfMemoryError("simulated")

    model.model.embed_tokens.weight.register_post_accumulate_grad_hook(out_of_memory)  # the last weight
    with pytest.raises(RuntimeError, match="in_backward") as error:
        train_step(model, [token_batch(VOCAB, TOKENS, rows=ROWS, seed=1)], opt, runtime=runtime)
    assert not isinstance(error.value, torch.OutOfMemoryError)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"optimizer": {"in_backward": True}}, "grad_clip"),
        ({"optimizer": {"in_backward": True, "grad_clip": None, "name": "adamw_8bit"}}, "adamw"),
        (
            {"optimizer": {"in_backward": True, "grad_clip": None}, "runtime": {"param_dtype": "fp32"}},
            "param_dtype",
        ),
    ],
)
def test_updates_in_backward_that_cannot_apply_are_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as error:
        parse_train_params(overrides)
    text = str(error.value)
    assert "in_backward" in text and message in text and "\n" not in text.strip()
    # FSDP2's fp32 shards are the masters: no bf16 weights needed
    sharded = {"nproc_per_node": 2, "strategy": "fsdp"}
    ok = parse_train_params({**overrides, "distributed": sharded}) if message == "param_dtype" else None
    assert ok is None or ok.optimizer.in_backward


def test_updates_in_backward_without_masters_are_refused_naming_param_dtype():
    """param_dtype auto on a CPU keeps fp32 weights: nothing to update in the backward."""
    params = parse_train_params(
        {
            "runtime": {"device": "cpu", "precision": "bf16", "float8": "off"},
            "optimizer": {"in_backward": True, "grad_clip": None},
        }
    )
    with pytest.raises(ConfigError, match="param_dtype"):
        make_optimization(toy_model(), params, _runtime(), total_steps=1)


def test_under_fsdp2_each_shard_is_updated_in_the_backward_as_the_step_after_it_would(tmp_path):
    """``train.optimizer.in_backward`` under FSDP2 (``BackwardUpdates.on_shards``): FSDP2 calls each sharded
    weight's post-accumulate-grad hooks after its reduce-scatter, on the synchronizing micro-batch; the
    weights have changed and no gradient is left when the backward returns, and each step's weights and
    gradient norm (the shards' local norms, all-reduced) are those of the AdamW step after the backward."""
    for rank, seen in enumerate(fsdp_ranks.run(tmp_path)):
        after, during = seen["after"], seen["during"]
        assert during["updated_in_backward"] == [True] * 3, rank
        for step, (mine, theirs) in enumerate(zip(during["weights"], after["weights"], strict=True)):
            for got, want in zip(mine, theirs, strict=True):
                # the same AdamW arithmetic, one weight at a time against the step's foreach over all
                torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7, msg=f"rank {rank} step {step}")
        torch.testing.assert_close(
            torch.stack(during["norms"]), torch.stack(after["norms"]), rtol=1e-6, atol=0, msg=f"rank {rank}"
        )
