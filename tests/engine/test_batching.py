"""engine/batching.py: a batching mode's sampler and collator, the packed row budget, the DataLoader
settings and the endless micro-batch stream whose position a checkpoint saves (a stream rebuilt at that
position continues with exactly the batches the first one would have given)."""

import multiprocessing
import os
import signal

import pytest
import torch

from fastlm.engine.batching import (
    MicroBatches,
    RandomBatches,
    Seq2SeqSides,
    StepPlan,
    StreamLayout,
    backoff_pieces,
    loader_settings,
    make_batching,
    micro_batches,
    packed_budget,
    step_plan,
    trained_samples,
)
from fastlm.engine.data import DynamicPaddingCollator, PackedCollator, Seq2SeqCollator
from fastlm.engine.data.samplers import LengthGroupedSampler, PackedBatchSampler
from fastlm.errors import ConfigError
from tests.support.toy_training import EOS, toy_params, toy_sequences

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("mode", "sampler", "collator"),
    [
        ("packed", PackedBatchSampler, PackedCollator),
        ("length_grouped", LengthGroupedSampler, DynamicPaddingCollator),
        ("dynamic", RandomBatches, DynamicPaddingCollator),
    ],
)
def test_each_mode_gets_its_sampler_and_collator(tmp_path, mode, sampler, collator):
    params = toy_params(tmp_path, batching={"mode": mode})
    got_sampler, got_collator = make_batching(
        params, toy_sequences(50, 0).lengths, pad_id=EOS, max_length=64, seed=0
    )
    assert type(got_sampler) is sampler and type(got_collator) is collator


def test_encoder_decoder_rows_are_length_grouped_where_packing_cannot_keep_samples_apart(tmp_path):
    params = toy_params(tmp_path, batching={"mode": "packed"})
    data = toy_sequences(50, 0)
    sampler, collator = make_batching(
        params,
        data.lengths,
        pad_id=EOS,
        max_length=64,
        seed=0,
        sides=Seq2SeqSides(data.lengths // 2, EOS, packing=False),
    )
    assert type(sampler) is LengthGroupedSampler and type(collator) is Seq2SeqCollator


def test_the_packed_budget_holds_the_micro_batch_tokens_and_refuses_a_row_too_short(tmp_path):
    params = toy_params(tmp_path, batching={"mode": "packed", "micro_batch_size": 4, "row_length": 32})
    lengths = toy_sequences(50, 0).lengths
    longest = int(lengths.max())
    assert longest <= 48
    budget = packed_budget(params.batching, lengths[lengths <= 32], max_length=64)
    assert (budget.row_length, budget.rows_per_batch) == (32, 4 * 64 // 32)
    with pytest.raises(
        ConfigError, match=r"train\.batching\.row_length is 32 tokens .* sample of \d+"
    ) as error:
        packed_budget(params.batching, lengths.clip(min=33), max_length=64)
    assert "\n" not in str(error.value)


def test_where_float8_may_train_every_padded_length_and_row_is_a_multiple_of_16(tmp_path):
    # float8's weight gradients take token counts in multiples of 16 (runtime.float8.token_multiple)
    lengths = toy_sequences(50, 0).lengths
    for mode in ("packed", "dynamic"):
        params = toy_params(tmp_path, batching={"mode": mode}, runtime={"float8": "auto"})
        on = params.model_copy(update={"runtime": params.runtime.model_copy(update={"float8": "on"})})
        for settings, multiple in ((params, 1), (on, 16)):  # auto on a CPU: no float8, samples unpadded
            _, collator = make_batching(settings, lengths, pad_id=EOS, max_length=64, seed=0)
            assert collator.pad_to_multiple_of == multiple
    assert params.batching.model_copy(update={"pad_to_multiple_of": 24}).pad_multiple("cuda", 16) == 48
    assert params.batching.pad_multiple("cuda", 16) == 16 and params.batching.pad_multiple("cuda") == 8
    explicit = toy_params(tmp_path, batching={"mode": "packed", "row_length": 40}).batching
    assert packed_budget(explicit, lengths[lengths <= 40], max_length=64).row_length == 40
    with pytest.raises(ConfigError, match=r"row_length is 40 tokens, and float8 .* multiples of 16") as error:
        packed_budget(explicit, lengths[lengths <= 40], max_length=64, align=16)
    assert "row_length to auto or 48" in str(error.value) and "\n" not in str(error.value)
    auto = toy_params(tmp_path, batching={"mode": "packed"}).batching
    assert packed_budget(auto, lengths, max_length=64, align=16).row_length % 16 == 0


def test_an_explicit_row_float8_cannot_take_leaves_auto_off_instead_of_refusing(tmp_path, monkeypatch):
    """float8 ``auto`` on a float8 GPU with ``row_length: 40``: the run's rows stay 40 tokens (float8's rule
    then says off, ``runtime.float8.float8_decision``); ``on`` refuses the row, naming the fix."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr("fastlm.engine.runtime.float8.torchao_installed", lambda: True)
    lengths = toy_sequences(50, 0).lengths
    lengths = lengths[lengths <= 40]
    batching = {"mode": "packed", "row_length": 40}
    auto = toy_params(tmp_path, batching=batching, runtime={"float8": "auto", "device": "cuda"})
    sampler, collator = make_batching(auto, lengths, pad_id=EOS, max_length=64, seed=0)
    assert sampler.budget.row_length == 40 and collator.pad_to_multiple_of == 8
    on = auto.model_copy(update={"runtime": auto.runtime.model_copy(update={"float8": "on"})})
    with pytest.raises(ConfigError, match=r"row_length is 40 tokens, and float8"):
        make_batching(on, lengths, pad_id=EOS, max_length=64, seed=0)


def test_loader_settings_use_no_workers_on_cpu_and_pin_memory_on_cuda(tmp_path, monkeypatch):
    params = toy_params(tmp_path)
    assert loader_settings(params, CPU) == {"num_workers": 0, "pin_memory": False}
    monkeypatch.setattr("fastlm.engine.batching.usable_cpu_count", lambda: 16)
    cuda = loader_settings(params, torch.device("cuda", 0))
    assert cuda["num_workers"] == 8 and cuda["pin_memory"] is True
    assert cuda["persistent_workers"] == params.dataloader.persistent_workers


def test_auto_workers_share_the_cores_among_the_processes_of_a_machine_and_are_logged(
    tmp_path, monkeypatch, caplog
):
    """Eight processes on a 16-core machine (``LOCAL_WORLD_SIZE``), each sharing the cores as its threads do
    (``launch.job``): two workers each, not half the machine's cores each (8 x 8 = 64 loader processes and
    8 training ones on 16 cores). The choice is logged with its reason."""
    params = toy_params(tmp_path)
    monkeypatch.setattr("fastlm.engine.batching.usable_cpu_count", lambda: 16)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    caplog.set_level("INFO", logger="fastlm.engine.batching")
    assert loader_settings(params, torch.device("cuda", 0), announce=True)["num_workers"] == 2
    assert "2 DataLoader workers" in caplog.text and "8 processes" in caplog.text
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert loader_settings(params, torch.device("cuda", 0))["num_workers"] == 4  # 8 cores each, half
    given = toy_params(tmp_path, dataloader={"num_workers": 3})
    assert loader_settings(given, torch.device("cuda", 0))["num_workers"] == 3  # as given, any processes


class _KilledInAWorker:
    """A collator whose loader process is killed (as the out-of-memory killer ends one) at its third batch."""

    def __init__(self, collator) -> None:
        self.collator, self.calls = collator, 0

    def __call__(self, samples):
        self.calls += 1
        if self.calls == 3 and torch.utils.data.get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return self.collator(samples)


def test_a_killed_loader_worker_is_one_line_naming_the_parameter(tmp_path):
    """A DataLoader worker killed mid-run (the host's out-of-memory killer): one line naming
    ``train.dataloader.num_workers`` and the fix, not torch's traceback from its worker watchdog."""
    params = toy_params(tmp_path, batching={"mode": "dynamic", "micro_batch_size": 4})
    kwargs = {"num_workers": 1, "pin_memory": False, "prefetch_factor": 1, "persistent_workers": True}
    stream = micro_batches(toy_sequences(40, 0), params, StreamLayout(EOS, 64, None, kwargs))
    stream.collator = _KilledInAWorker(stream.collator)
    with pytest.raises(ConfigError, match="train.dataloader.num_workers") as error:
        _ids(stream, 6)
    assert "\n" not in str(error.value) and "killed" in str(error.value)


def _ids(stream: MicroBatches, count: int) -> list[list[int]]:
    return [next(stream)["input_ids"].flatten().tolist() for _ in range(count)]


class _WorkerPids:
    """A collator that puts the pid of the process it ran in into each batch."""

    def __init__(self, collator) -> None:
        self.collator = collator

    def __call__(self, samples):
        return {**self.collator(samples), "pid": os.getpid()}


PERSISTENT = {"num_workers": 2, "pin_memory": False, "prefetch_factor": 2, "persistent_workers": True}


def test_persistent_workers_are_the_same_processes_every_epoch_and_end_with_the_stream(tmp_path):
    """``train.dataloader.persistent_workers``: the stream's loader is built once and iterated again each
    epoch, so the workers that loaded epoch 0 load epochs 1 and 2; ``close`` ends them."""
    params = toy_params(tmp_path, batching={"mode": "dynamic", "micro_batch_size": 8})
    stream = micro_batches(toy_sequences(48, 0), params, StreamLayout(EOS, 64, None, PERSISTENT))
    stream.collator = _WorkerPids(stream.collator)
    per_epoch = stream.batches_per_epoch()
    pids = [{next(stream)["pid"] for _ in range(per_epoch)} for _ in range(3)]
    assert stream.position == {"epoch": 2, "batch_in_epoch": per_epoch}
    assert len(pids[0]) == 2 and os.getpid() not in pids[0]
    assert pids[1] == pids[0] and pids[2] == pids[0]
    stream.close()
    assert not {child.pid for child in multiprocessing.active_children()} & pids[0]


@pytest.mark.parametrize("mode", ["packed", "dynamic"])
def test_persistent_workers_give_the_batches_of_no_workers_across_epochs_and_a_resume(tmp_path, mode):
    """Each epoch's order comes from the sampler, iterated in the training process: the persistent loader
    gives every epoch the batches a loader without workers gives, and a stream resumed in mid-epoch with
    workers continues into the next epoch as the uninterrupted one."""
    params = toy_params(tmp_path, batching={"mode": mode, "micro_batch_size": 8})
    data = toy_sequences(48, 0)
    plain = micro_batches(data, params, StreamLayout(EOS, 64, None, {"num_workers": 0}))
    per_epoch = plain.batches_per_epoch()
    expected = _ids(plain, 3 * per_epoch)
    workers = micro_batches(data, params, StreamLayout(EOS, 64, None, PERSISTENT))
    assert _ids(workers, 3 * per_epoch) == expected  # same computation run twice: exact
    workers.close()
    resumed = micro_batches(data, params, StreamLayout(EOS, 64, None, PERSISTENT), epoch=1, batch=2)
    assert _ids(resumed, 2 * per_epoch - 2) == expected[per_epoch + 2 :]
    resumed.close()


@pytest.mark.parametrize("mode", ["packed", "length_grouped", "dynamic"])
def test_a_stream_rebuilt_at_a_saved_position_continues_with_the_same_batches(tmp_path, mode):
    params = toy_params(tmp_path, batching={"mode": mode, "micro_batch_size": 4})
    data = toy_sequences(200, 0)
    layout = StreamLayout(pad_id=EOS, max_length=64, sides=None, loader_kwargs={"num_workers": 0})
    stream = micro_batches(data, params, layout)
    per_epoch = stream.batches_per_epoch()
    assert per_epoch > 5
    first = _ids(stream, per_epoch + 3)  # past the end of the first epoch
    assert stream.position == {"epoch": 1, "batch_in_epoch": 3}
    saved = micro_batches(data, params, layout)
    _ids(saved, 5)
    resumed = micro_batches(data, params, layout, epoch=saved.epoch, batch=saved.batch)
    assert _ids(resumed, per_epoch - 2) == first[5:]  # same computation run twice: exact
    assert first[per_epoch : per_epoch + 3] != first[:3]  # each epoch is shuffled anew


def _orders(data, params, world: int, epochs: int = 2) -> list[list[list[int]]]:
    """Each rank's batches of ``epochs`` epochs as its stream's sampler gives them (rank by rank)."""
    orders = []
    for rank in range(world):
        sampler = micro_batches(
            data, params, StreamLayout(EOS, 64, None, {}, rank=rank, world_size=world)
        ).sampler
        orders.append([index for epoch in range(epochs) for index in (sampler.set_epoch(epoch) or sampler)])
    return orders


@pytest.mark.parametrize("mode", ["packed", "length_grouped", "dynamic"])
def test_train_data_seed_draws_the_data_order_alone_and_null_leaves_it_to_train_seed(tmp_path, mode):
    """``train.data_seed`` (the Hugging Face Trainer's ``data_seed``): null, the order of every epoch and
    every rank's shard is train.seed's, the batches of before it existed; set, the order is its own, the
    same whatever train.seed, while the weights' init (the run's start seeds torch) stays on train.seed."""
    from fastlm.pipelines.start import start_node

    data = toy_sequences(120, 0)

    def params(**seeds):
        return toy_params(tmp_path, batching={"mode": mode, "micro_batch_size": 4}, **seeds)

    for world in (1, 2):
        by_seed = _orders(data, params(seed=3), world)
        before = make_batching(params(seed=3), data.lengths, pad_id=EOS, max_length=64, seed=3)[0]
        assert world > 1 or by_seed[0] == [
            index for epoch in range(2) for index in (before.set_epoch(epoch) or before)
        ]  # same computation run twice: exact
        assert _orders(data, params(seed=3, data_seed=None), world) == by_seed
        assert _orders(data, params(seed=0, data_seed=3), world) == by_seed  # it draws as train.seed did
        fixed = _orders(data, params(seed=1, data_seed=5), world)
        assert _orders(data, params(seed=2, data_seed=5), world) == fixed
        assert _orders(data, params(seed=1, data_seed=6), world) != fixed
        assert _orders(data, params(seed=1), world) != _orders(data, params(seed=2), world)

    def init(**seeds) -> list[float]:
        raw = {"runtime": {"device": "cpu", "num_threads": 1}, **seeds}
        start_node(raw, {})
        return torch.rand(4).tolist()

    assert init(seed=1, data_seed=5) == init(seed=1, data_seed=6) == init(seed=1)
    assert init(seed=1, data_seed=5) != init(seed=2, data_seed=5)


def test_one_steps_micro_batches_reach_the_device_with_the_wait_measured(tmp_path):
    params = toy_params(tmp_path, batching={"mode": "packed", "micro_batch_size": 4})
    layout = StreamLayout(pad_id=EOS, max_length=64, sides=None, loader_kwargs={"num_workers": 0})
    stream = micro_batches(toy_sequences(60, 0), params, layout)
    peeked = stream.peek_step(2, CPU, "sdpa")
    step, waited = stream.next_step(2, CPU, "sdpa")
    assert step is peeked and len(step) == 2 and waited >= 0
    assert stream.batch == 2


def test_the_stream_keeps_one_shape_for_cuda_graphs(tmp_path):
    """``train.runtime.compile_mode: reduce-overhead`` (CUDA graphs replay one shape): the packed collator
    keeps every micro-batch at its capacity and the varlen view at that many tokens, where the default mode
    gives each micro-batch its own fill."""
    layout = StreamLayout(pad_id=EOS, max_length=64, sides=None, loader_kwargs={"num_workers": 0})
    shapes = {}
    for mode in ("default", "reduce-overhead"):
        runtime = {"device": "auto", "compile": True, "compile_scope": "layers", "compile_mode": mode}
        params = toy_params(tmp_path, batching={"mode": "packed", "micro_batch_size": 4}, runtime=runtime)
        _, collator = make_batching(params, toy_sequences(60, 0).lengths, pad_id=EOS, max_length=64, seed=0)
        assert collator.fixed_shape is (mode == "reduce-overhead")
        stream = micro_batches(toy_sequences(60, 0), params, layout)
        step, _ = stream.next_step(6, CPU, "sdpa_varlen")
        shapes[mode] = {tuple(batch["model_inputs"]["input_ids"].shape) for batch in step}
    assert len(shapes["reduce-overhead"]) == 1 and len(shapes["default"]) > 1


def test_a_step_plan_of_epochs_sums_each_epochs_own_steps_and_max_steps_is_the_total_as_given():
    """Packed epochs hold slightly different micro-batch counts: ``epochs: 3`` is each epoch's steps summed
    (epoch 0's times three was one step short or over); a fraction plans part of the next epoch as before;
    ``max_steps`` is the total whatever the epochs hold."""
    sizes = [105, 107, 106, 104]
    plan = StepPlan(lambda epoch: sizes[epoch], world_size=1, accumulation=2, epochs=3)
    assert [plan.steps(epoch) for epoch in range(3)] == [53, 54, 53] and plan.total_steps == 160
    assert StepPlan(lambda epoch: sizes[epoch], world_size=1, accumulation=2, epochs=2.5).total_steps == 134
    assert (
        StepPlan(lambda epoch: 105, world_size=1, accumulation=2, epochs=2.5).total_steps == 133
    )  # ceil(2.5 x 53)
    assert StepPlan(lambda epoch: sizes[epoch], world_size=1, accumulation=2, max_steps=7).total_steps == 7
    assert [plan.epochs_at(step) for step in (0, 53, 80, 107, 160)] == [0.0, 1.0, 1.5, 2.0, 3.0]
    # two processes of one micro-batch each: an odd epoch's last micro-batch left out (the even split)
    two = StepPlan(lambda epoch: sizes[epoch], world_size=2, accumulation=1, epochs=3)
    assert [two.trained(epoch) for epoch in range(3)] == [104, 106, 106] and two.total_steps == 158
    assert two.outline(1) == [105, 107, 106] and two.outline(2) == [104, 106, 106]
    assert "train 105 of epoch 0's 105 micro-batches and this run's 2 processes 104" in two.difference(1)
    assert two.difference(2) is None
    # max_steps never reaching an epoch's end: both numbers of processes train the same micro-batches
    inside = StepPlan(lambda epoch: sizes[epoch], world_size=2, accumulation=1, max_steps=40)
    assert inside.outline(1) == inside.outline(2) == [80] and inside.difference(1) is None


def test_the_step_plan_counts_the_streams_epochs(tmp_path):
    """``step_plan`` counts each epoch's micro-batches as the stream reads them (this rank's: the even
    split)."""
    params = toy_params(tmp_path, max_steps=None, epochs=3, batching={"micro_batch_size": 8})
    data = toy_sequences(5000, 1)
    for world in (1, 2):
        plan = step_plan(data, params, StreamLayout(EOS, 64, None, {"num_workers": 0}, world_size=world))
        stream = micro_batches(
            data, params, StreamLayout(EOS, 64, None, {"num_workers": 0}, world_size=world)
        )
        read = [stream.sampler.set_epoch(epoch) or len(stream.sampler) for epoch in range(3)]
        assert [plan.trained(epoch) // world for epoch in range(3)] == read
        assert plan.total_steps == sum(read)


@pytest.mark.parametrize("mode", ["packed", "length_grouped", "dynamic"])
def test_the_trained_samples_are_those_the_ranks_samplers_give(tmp_path, mode):
    """An epoch of micro-batches that do not divide between the processes: the samples a step holds (the run
    summary's ``samples_per_step``, ``tokens_per_step``, ``train_tokens``) are those the ranks' samplers
    give, the last ``N mod processes`` micro-batches left out; one process trains every sample."""
    params = toy_params(tmp_path, max_steps=None, batching={"mode": mode, "micro_batch_size": 4})
    data = toy_sequences(203, 1)
    for world in (1, 2, 4):  # 9 packed micro-batches, 51 dynamic ones
        layout = StreamLayout(EOS, 64, None, {"num_workers": 0}, world_size=world)
        plan = step_plan(data, params, layout)
        given = [
            index
            for rank in range(world)
            for batch in micro_batches(data, params, StreamLayout(**{**vars(layout), "rank": rank})).sampler
            for index in batch
        ]
        assert world == 1 or plan.size(0) % world  # some left out
        assert sorted(trained_samples(data, params, layout, plan).tolist()) == sorted(given)
        assert (len(given) == len(data)) == (world == 1)


@pytest.mark.parametrize("mode", ["length_grouped", "dynamic"])
def test_each_step_holds_the_samples_of_one_batch_whatever_its_micro_batches_and_processes(tmp_path, mode):
    """A step of 8 samples is the same 8 samples as 8 x 1, 4 x 2 or 2 x 4 in one process and as 4 x 1,
    2 x 2 or 1 x 4 in each of two (length_grouped: sorted mega-batches cut into whole steps, then into
    micro-batches, as the Trainer's ``group_by_length`` sorts by ``train_batch_size *
    gradient_accumulation_steps``; the epoch's short step last), each micro-batch of similar lengths. Was:
    each length-grouped micro-batch drawn on its own, so a step held other samples for every split."""
    data = toy_sequences(203, 1)  # 25 steps of 8 and one of 3

    def steps(size: int, accumulation: int, world: int, epoch: int) -> list[list[int]]:
        batching = {"mode": mode, "micro_batch_size": size, "gradient_accumulation_steps": accumulation}
        params = toy_params(tmp_path, max_steps=None, batching=batching)
        ranks = []
        for rank in range(world):
            layout = StreamLayout(EOS, 64, None, {"num_workers": 0}, rank=rank, world_size=world)
            sampler = micro_batches(data, params, layout).sampler
            sampler.set_epoch(epoch)
            ranks.append(list(sampler))
        count = len(ranks[0])
        return [
            sorted(index for batches in ranks for batch in batches[k : k + accumulation] for index in batch)
            for k in range(0, count, accumulation)
        ]

    for epoch in (0, 1):
        whole = steps(8, 1, 1, epoch)
        assert len(whole) == 26 and all(len(step) == 8 for step in whole[:-1]) and len(whole[-1]) == 3
        for size, accumulation in ((4, 2), (2, 4)):
            assert steps(size, accumulation, 1, epoch) == whole
        for size, accumulation in ((4, 1), (2, 2), (1, 4)):
            # two processes leave the last N mod 2 micro-batches out: the short step may differ or be gone
            assert steps(size, accumulation, 2, epoch)[:25] == whole[:25]


def test_backoff_pieces_are_the_fewest_powers_of_two_of_at_most_the_micro_batch():
    """``halve_micro_batch`` rounds up (6, 3, 2): 2 ** halvings pieces, however the size divides."""
    assert [backoff_pieces(6, size) for size in (6, 3, 2, 1)] == [1, 2, 4, 8]
    assert [backoff_pieces(7, size) for size in (7, 4, 2)] == [1, 2, 4]
    assert backoff_pieces(8, 1) == 8


@pytest.mark.parametrize("mode", ["packed", "length_grouped", "dynamic"])
def test_a_configured_batch_of_fewer_rows_than_pieces_ends_in_empty_pieces(tmp_path, mode):
    """Micro-batch 3 halved to 1 (rows of 64 tokens: 3 rows): each configured batch in 4 pieces of one
    sample (row), the fourth empty. Was: refused (`cannot cut a micro-batch of 3 samples in 4`)."""
    data = toy_sequences(60, 0)
    row = {"row_length": 64} if mode == "packed" else {}
    params = toy_params(tmp_path, batching={"mode": mode, "micro_batch_size": 1, **row})
    whole, _ = make_batching(
        toy_params(tmp_path, batching={"mode": mode, "micro_batch_size": 3, **row}),
        data.lengths,
        pad_id=EOS,
        max_length=64,
        seed=0,
    )
    pieces, _ = make_batching(params, data.lengths, pad_id=EOS, max_length=64, seed=0, configured=3)
    configured, cut = whole.epoch_batches(), pieces.epoch_batches()
    assert len(cut) == 4 * len(configured)
    for j, batch in enumerate(configured):
        assert [index for piece in cut[4 * j : 4 * j + 4] for index in piece.tolist()] == batch.tolist()
        assert cut[4 * j + 3].size == 0
        if j < len(configured) - 1:  # a whole batch (60 samples: 20 of 3; packed: 3 rows), one in a piece
            assert all(piece.size for piece in cut[4 * j : 4 * j + 3])
    if mode != "packed":
        assert max(piece.size for piece in cut) == 1


def test_a_packed_backoff_whose_pieces_were_one_row_already_is_refused(tmp_path):
    """Rows of 128 tokens: micro-batch 4 x 64 tokens is 2 rows; halved to 2, pieces of one row; halved to 1
    (4 pieces) they would be that one row again: one line (3 rows in 4 pieces are cut)."""
    data = toy_sequences(60, 0)
    params = toy_params(tmp_path, batching={"mode": "packed", "micro_batch_size": 1, "row_length": 128})
    with pytest.raises(
        ConfigError, match=r"cannot cut a packed micro-batch of 2 row\(s\) of 128 tokens in 4"
    ):
        make_batching(params, data.lengths, pad_id=EOS, max_length=64, seed=0, configured=4)
    halved = params.model_copy(
        update={"batching": params.batching.model_copy(update={"micro_batch_size": 2})}
    )
    sampler, collator = make_batching(halved, data.lengths, pad_id=EOS, max_length=64, seed=0, configured=4)
    assert sampler.split == 2 and collator.budget.rows_per_batch == 1


@pytest.mark.parametrize("mode", ["length_grouped", "dynamic"])
def test_a_backed_off_stream_steps_over_the_configured_batches_empty_pieces_included(tmp_path, mode):
    """30 samples in configured batches of 8 (the last of 6) cut in 8 pieces of one sample: a step of 16
    positions is two configured batches (the short one's empty pieces are counted, not handed out), the
    same samples as the configured stream's step of 2 micro-batches of 8."""
    layout = StreamLayout(pad_id=EOS, max_length=64, sides=None, loader_kwargs={"num_workers": 0})
    data = toy_sequences(30, 0)

    def steps(micro: int, accumulation: int) -> list[list]:
        params = toy_params(tmp_path, batching={"mode": mode, "micro_batch_size": micro})
        stream = micro_batches(data, params, layout, configured=8)
        out = []
        for _ in range(2):
            step, _ = stream.next_step(accumulation, CPU, "sdpa")
            out.append(
                sorted(
                    tuple(row[mask.bool()].tolist())
                    for batch in step
                    for row, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True)
                )
            )
        assert stream.position == {"epoch": 0, "batch_in_epoch": 4 * 8 // micro}
        return out

    pieces, whole = steps(1, 16), steps(8, 2)
    assert pieces == whole  # the same samples in each step (two builds of the same epoch: exact)
    assert sorted(len(step) for step in pieces) == [14, 16]


def _step_samples(streams: list[MicroBatches], accumulation: int) -> list:
    """One step of every rank's stream: the samples it trains, as sorted token tuples."""
    samples = []
    for stream in streams:
        step, _ = stream.next_step(accumulation, CPU, "sdpa")
        samples.extend(
            tuple(row[mask.bool()].tolist())
            for batch in step
            for row, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True)
        )
    return sorted(samples)


def test_a_backed_off_checkpoint_resumed_by_two_processes_trains_the_configured_steps(tmp_path):
    """One process backed off from micro-batch 4 to 1 (each configured batch cut in 4 pieces, accumulation
    2 x 4) and saved after its first step; two processes (accumulation 1 x 4 each) resume it. 29 samples:
    8 configured batches an epoch, the short one of a single sample anywhere in the length-grouped order,
    so rank 1's step could start on one of its empty pieces: skipped, that rank's step slid one position
    into the next step's and both ranks trained another step's samples from then on. Every step holds the
    samples of the two-process run's configured step."""
    data = toy_sequences(29, 0)

    def stream(micro: int, accumulation: int, world: int, rank: int, **start) -> MicroBatches:
        batching = {
            "mode": "length_grouped",
            "micro_batch_size": micro,
            "gradient_accumulation_steps": accumulation,
        }
        params = toy_params(tmp_path, batching=batching, max_steps=None)
        layout = StreamLayout(EOS, 64, None, {"num_workers": 0}, rank=rank, world_size=world)
        return micro_batches(data, params, layout, configured=4, **start)

    whole = [stream(4, 1, 2, rank) for rank in range(2)]
    plan = step_plan(
        data,
        toy_params(
            tmp_path, batching={"mode": "length_grouped", "micro_batch_size": 4}, max_steps=None, epochs=3
        ),
        StreamLayout(EOS, 64, None, {"num_workers": 0}, world_size=2),
    )
    assert plan.difference(1) is None and plan.size(0) == 8  # the step plans agree: the resume goes on
    steps = plan.total_steps
    want = [_step_samples(whole, 1) for _ in range(steps)]
    alone = stream(1, 8, 1, 0)
    got = [_step_samples([alone], 8)]
    saved = alone.position
    ranks = [
        stream(1, 4, 2, rank, epoch=saved["epoch"], batch=saved["batch_in_epoch"] // 2) for rank in range(2)
    ]
    got += [_step_samples(ranks, 4) for _ in range(steps - 1)]
    assert got == want  # the same epochs' batches built twice: exact


@pytest.mark.parametrize("limit", ["epochs", "max_steps"])
def test_a_later_packed_epoch_of_fewer_micro_batches_than_processes_is_refused_before_training(
    tmp_path, limit
):
    """Packed epochs are packed after their own shuffle in windows of 4096 samples, so 5000 samples make
    another number of rows each epoch: with a micro-batch of as many rows as the fewest, epoch 0 makes 2
    micro-batches and a later one 1. Two processes: that epoch's even shards were empty, the plan counted one
    step for it all the same and the streams read the next epoch's micro-batches there (every later step a
    step of the wrong epoch); only epoch 0 was checked. Refused in one line naming the epoch."""
    import numpy as np

    from fastlm.engine.data.packing import TokenBudget, packed_batch_count
    from fastlm.engine.data.samplers import epoch_rng
    from fastlm.engine.data.token_dataset import TokenSequences

    lengths = np.random.default_rng(0).choice([40, 24, 33, 31], size=5000)
    data = TokenSequences(
        np.full(int(lengths.sum()), 5, dtype=np.int64), np.concatenate([[0], np.cumsum(lengths)])
    )
    seed = toy_params(tmp_path).seed
    rows = [packed_batch_count(lengths, TokenBudget(64, 1), rng=epoch_rng(seed, e)) for e in range(4)]
    short = min(range(1, 4), key=lambda e: rows[e])
    assert rows[short] < rows[0] and rows[short] <= min(rows[1:short], default=rows[0])
    batching = {"mode": "packed", "micro_batch_size": rows[short], "row_length": 64}  # rows of 64 tokens
    span = {"epochs": short + 1, "max_steps": None} if limit == "epochs" else {"max_steps": short + 1}
    params = toy_params(tmp_path, batching=batching, **span)
    layout = StreamLayout(EOS, 64, None, {"num_workers": 0}, world_size=2)
    with pytest.raises(
        ConfigError, match=rf"5000 samples make 1 micro-batch\(es\) in epoch {short} .*fewer than the 2"
    ) as caught:
        step_plan(data, params, layout)
    assert "\n" not in str(caught.value) and "Fix: set a smaller train.batching.micro_batch_size" in str(
        caught.value
    )
    one = step_plan(data, params, StreamLayout(EOS, 64, None, {"num_workers": 0}))  # one process: fine
    planned = sum(one.steps(e) for e in range(short + 1)) if limit == "epochs" else short + 1
    assert one.total_steps == planned


@pytest.mark.parametrize("mode", ["packed", "length_grouped", "dynamic"])
def test_an_epoch_of_fewer_micro_batches_than_processes_is_refused_before_training(tmp_path, mode):
    """3 samples make one micro-batch of 4: two processes' even shards are empty, the plan still counted one
    step an epoch, and each rank's stream looked for a micro-batch epoch after epoch (RecursionError). One
    line naming the data, the processes and the fix."""
    params = toy_params(tmp_path, batching={"mode": mode, "micro_batch_size": 4})
    data = toy_sequences(3, 0)
    with pytest.raises(
        ConfigError, match=r"3 samples make 1 micro-batch\(es\) an epoch, fewer than the 2"
    ) as caught:
        step_plan(data, params, StreamLayout(EOS, 64, None, {"num_workers": 0}, world_size=2))
    assert "\n" not in str(caught.value) and "Fix: set a smaller train.batching.micro_batch_size" in str(
        caught.value
    )
    assert (
        step_plan(data, params, StreamLayout(EOS, 64, None, {"num_workers": 0})).total_steps == 30
    )  # one: fine
