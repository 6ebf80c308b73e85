"""Tensor parallelism (Lesson 9): the sharded layers against the whole ones, the split rules, and the engine
over gloo (CPU processes) against the one-process engine; failures, and no process left behind.

Lab 9's graders (``lab9``) run the layers in this process: ``two_pass`` plays N ranks one after another, first
recording what each rank hands to each collective, then replaying the sums, so each rank's contribution can be
checked and blamed on its own. The engine tests start real worker processes (gloo on 127.0.0.1); the same
tests run over NCCL on a machine with two GPUs or more and are skipped elsewhere.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from solutions.model.config import ModelConfig
from solutions.quant.linear import QuantLinear

GPUS = torch.cuda.device_count()
needs_two_gpus = pytest.mark.skipif(
    GPUS < 2, reason=f"NCCL tensor parallelism needs 2 GPUs or more, found {GPUS}"
)
ROOT = Path(__file__).resolve().parent.parent


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float(
        (actual.detach().double() - expected.double()).norm() / expected.double().norm().clamp_min(1e-30)
    )


# ---- N ranks in one process --------------------------------------------------------------------------------


class RecordingGroup:
    """One rank's group for ``two_pass``: pass 1 records each collective's input (and leaves it as it is);
    pass 2 writes the sums recorded over every rank in pass 1 (``totals``) into it, as the real collective
    would."""

    def __init__(self, rank: int, world_size: int, totals: list[torch.Tensor] | None = None):
        self.rank, self.world_size, self.totals = rank, world_size, totals
        self.sent: list[torch.Tensor] = []

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        self.sent.append(tensor.detach().clone())
        if self.totals is not None:
            tensor.copy_(self.totals[len(self.sent) - 1])
        return tensor

    def gather_to_first(self, tensor: torch.Tensor) -> torch.Tensor | None:
        self.sent.append(tensor.detach().clone())
        if self.totals is None or self.rank != 0:
            return None
        return self.totals[len(self.sent) - 1]


class NoCollectives:
    """The group of a single rank: any collective is a mistake."""

    rank, world_size = 0, 1

    def all_reduce(self, tensor):
        raise AssertionError("a collective ran with world_size 1: on one rank there is nothing to add")

    gather_to_first = all_reduce


def two_pass(world: int, run, combine=lambda parts: sum(parts)):
    """``run(group)`` on every rank twice (see ``RecordingGroup``): returns (each rank's output in pass 2,
    each rank's collective inputs of pass 1). ``combine`` makes a collective's result from the ranks'
    inputs."""
    first = [RecordingGroup(r, world) for r in range(world)]
    for group in first:
        run(group)
    counts = {len(g.sent) for g in first}
    assert len(counts) == 1, f"ranks ran different numbers of collectives: {[len(g.sent) for g in first]}"
    totals = [combine([g.sent[k] for g in first]) for k in range(counts.pop())]
    outputs = [run(RecordingGroup(r, world, totals)) for r in range(world)]
    return outputs, [g.sent for g in first]


# ---- Lab 9: the row-parallel linear ------------------------------------------------------------------------


def row_parallel_case(world: int, bias: bool):
    gen = torch.Generator().manual_seed(world)
    x = torch.randn(5, 12 * world, generator=gen, dtype=torch.float64)
    w = torch.randn(7, 12 * world, generator=gen, dtype=torch.float64)
    b = torch.randn(7, generator=gen, dtype=torch.float64) if bias else None
    return x, w, b


@pytest.mark.lab9
@pytest.mark.parametrize("world", [2, 3], ids=["2-ranks", "3-ranks"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_row_parallel_linear_sums_the_partial_products(load, world, bias):
    layers = load("parallel.layers")
    x, w, b = row_parallel_case(world, bias)
    cols = w.shape[1] // world
    expected = x @ w.T + (0 if b is None else b)

    def run(group):
        local = nn.Linear(cols, 7, bias=False, dtype=torch.float64)
        local.weight.data = w[:, group.rank * cols : (group.rank + 1) * cols].clone()
        layer = layers.RowParallelLinear(local, group, None if b is None else b.clone())
        return layer(x[:, group.rank * cols : (group.rank + 1) * cols])

    outputs, sent = two_pass(world, run)
    what = f"RowParallelLinear over {world} ranks ({'with' if bias else 'no'} bias)"
    assert sent[0], (
        f"{what} ran no all-reduce: each rank's linear(x) is only a partial sum; group.all_reduce it"
    )
    for rank, out in enumerate(outputs):
        err = rel_err(out, expected)
        if err < 1e-12:
            continue
        if b is not None and rel_err(out, expected + (world - 1) * b) < 1e-12:
            raise AssertionError(
                f"{what}: rank {rank}'s output holds the bias {world} times. Likely: the bias was added "
                "before the all-reduce, so every rank's copy was summed; add it once, after"
            )
        partial = x[:, rank * cols : (rank + 1) * cols] @ w[:, rank * cols : (rank + 1) * cols].T
        if rel_err(out, partial + (0 if b is None else b)) < 1e-12:
            raise AssertionError(
                f"{what}: rank {rank} returned its own partial product. Likely: the all-reduce's result was "
                "not used (group.all_reduce sums in place, into the tensor you pass: return that tensor)"
            )
        raise AssertionError(
            f"{what}: rank {rank}'s output is off by relative error {err:.3g} from x W^T + b"
        )


@pytest.mark.lab9
def test_row_parallel_linear_on_one_rank_runs_no_collective(load):
    layers = load("parallel.layers")
    x, w, b = row_parallel_case(1, bias=True)
    local = nn.Linear(w.shape[1], 7, bias=False, dtype=torch.float64)
    local.weight.data = w.clone()
    out = layers.RowParallelLinear(local, NoCollectives(), b.clone())(x)
    err = rel_err(out, x @ w.T + b)
    assert err < 1e-12, f"RowParallelLinear on one rank: relative error {err:.3g} from x W^T + b"


@pytest.mark.lab9
def test_row_parallel_linear_runs_the_local_module_int4_and_bfloat16(load):
    """An AWQ engine's o_proj and down_proj are INT4 ``QuantLinear``s on each rank, in a bfloat16 model: the
    layer must run its local module (it holds packed codes, not a weight matrix) and keep bfloat16."""
    layers = load("parallel.layers")
    gen = torch.Generator().manual_seed(15)
    x = torch.randn(3, 2 * 128, generator=gen).to(torch.bfloat16)
    w = (torch.randn(64, 2 * 128, generator=gen) * 0.05).to(torch.bfloat16)
    bias = torch.randn(64, generator=gen).to(torch.bfloat16)
    locals_ = [QuantLinear.from_float(w[:, r * 128 : (r + 1) * 128].contiguous(), 4, 32) for r in range(2)]
    partials = [locals_[r](x[:, r * 128 : (r + 1) * 128].contiguous()).double() for r in range(2)]
    expected = sum(partials) + bias.double()

    def run(group):
        layer = layers.RowParallelLinear(locals_[group.rank], group, bias.clone())
        try:
            return layer(x[:, group.rank * 128 : (group.rank + 1) * 128].contiguous())
        except AttributeError as error:
            raise AssertionError(
                f"RowParallelLinear around an INT4 QuantLinear failed ({error}). Likely: the product was "
                "computed from a weight matrix (x @ self.weight.T); the local module may hold packed INT4 "
                "codes, so call it: self.linear(x)"
            ) from None

    outputs, _ = two_pass(2, run)
    for rank, out in enumerate(outputs):
        assert out.dtype == torch.bfloat16, (
            f"RowParallelLinear returned {out.dtype} on rank {rank} for a bfloat16 model: keep the partial "
            "sums and the result in the activations' dtype"
        )
        err = rel_err(out, expected)
        assert err < 2e-2, (
            f"RowParallelLinear around INT4 QuantLinears, rank {rank}: relative error {err:.3g} from the sum "
            "of the ranks' local products plus the bias. Likely: not self.linear(x) on each rank"
        )


# ---- Lab 9: the vocabulary-parallel embedding --------------------------------------------------------------


def embedding_case(vocab: int, world: int):
    gen = torch.Generator().manual_seed(vocab)
    table = torch.randn(vocab, 8, generator=gen, dtype=torch.float64)
    rows = -(-vocab // world)
    # Every rank's first and last ids, id 0 and the largest, and ids in between, twice over in a 2-D batch.
    ids = sorted(
        {0, vocab - 1} | {min(r * rows + d, vocab - 1) for r in range(world) for d in (0, 1, rows - 1)}
    )
    ids = torch.tensor(ids + ids[::-1]).view(2, -1)
    return table, rows, ids


def shard_table(table: torch.Tensor, rank: int, rows: int) -> nn.Embedding:
    piece = table[rank * rows : (rank + 1) * rows]
    padded = torch.cat([piece, piece.new_zeros(rows - piece.shape[0], piece.shape[1])])
    return nn.Embedding.from_pretrained(padded, freeze=True)


@pytest.mark.lab9
@pytest.mark.parametrize("vocab, world", [(96, 2), (101, 3)], ids=["even-2-ranks", "padded-3-ranks"])
def test_vocab_parallel_embedding_looks_up_each_id_on_its_own_rank(load, vocab, world):
    layers = load("parallel.layers")
    table, rows, ids = embedding_case(vocab, world)

    def run(group):
        start, end = group.rank * rows, min((group.rank + 1) * rows, vocab)
        layer = layers.VocabParallelEmbedding(shard_table(table, group.rank, rows), start, end, group)
        return layer(ids)

    what = f"VocabParallelEmbedding, vocabulary {vocab} over {world} ranks of {rows} rows"
    try:
        outputs, sent = two_pass(world, run)
    except (IndexError, RuntimeError) as error:
        if "index" not in str(error).lower():
            raise
        raise AssertionError(
            f"{what}: a lookup went past this rank's {rows} rows ({error}). Likely: an id of another rank "
            "was looked up; give every id a valid row first (torch.where(mine, ids - vocab_start, 0)), then "
            "zero those rows"
        ) from None
    assert sent[0], f"{what} ran no all-reduce: each rank holds only its own ids' rows; sum over the ranks"
    for rank, contributions in enumerate(sent):
        start, end = rank * rows, min((rank + 1) * rows, vocab)
        mine = (ids >= start) & (ids < end)
        local = contributions[0]
        assert local.shape == (*ids.shape, 8), f"{what}: rank {rank} all-reduced shape {tuple(local.shape)}"
        foreign = float(local[~mine].abs().max()) if (~mine).any() else 0.0
        assert foreign == 0.0, (
            f"{what}: rank {rank} contributed nonzero rows (up to {foreign:.3g}) for ids outside [{start}, "
            f"{end}). Likely: those rows were not zeroed before the all-reduce (mask them: "
            "out.masked_fill(~mine[..., None], 0))"
        )
        err = rel_err(local[mine], table[ids[mine]])
        assert err < 1e-12, (
            f"{what}: rank {rank}'s rows for its own ids [{start}, {end}) are off by relative error "
            f"{err:.3g}. "
            "Likely: the ids were not shifted: row i of a rank's table is id vocab_start + i"
        )
    for rank, out in enumerate(outputs):
        err = rel_err(out, table[ids])
        assert err < 1e-12, (
            f"{what}: rank {rank}'s output is off by relative error {err:.3g}. Likely: the all-reduce's "
            "result was not returned (group.all_reduce sums in place, into the tensor you pass)"
        )


@pytest.mark.lab9
def test_vocab_parallel_embedding_of_a_bfloat16_model_over_a_flat_batch(load):
    """What the engine feeds: the step's token ids flattened to one dimension, a bfloat16 table."""
    layers = load("parallel.layers")
    table, rows, ids = embedding_case(101, 3)
    table, ids = table.to(torch.bfloat16), ids.flatten()

    def run(group):
        start, end = group.rank * rows, min((group.rank + 1) * rows, 101)
        layer = layers.VocabParallelEmbedding(shard_table(table, group.rank, rows), start, end, group)
        try:
            return layer(ids)
        except (IndexError, RuntimeError) as error:
            raise AssertionError(
                f"VocabParallelEmbedding on 1-D ids [{len(ids)}] (the engine's flat batch) failed: {error}. "
                "Likely: the mask given a trailing axis for 2-D ids only (mine[:, :, None]); "
                "mine.unsqueeze(-1) works for ids of any shape"
            ) from None

    outputs, _ = two_pass(3, run)
    for rank, out in enumerate(outputs):
        assert out.dtype == torch.bfloat16, (
            f"VocabParallelEmbedding returned {out.dtype} on rank {rank} from a bfloat16 table: zero the "
            "foreign rows in the table's dtype (masked_fill, or a bool mask); a float mask (mine.float()) "
            "turns a bfloat16 model's hidden states into float32"
        )
        err = rel_err(out, table[ids])
        assert err < 1e-12, f"VocabParallelEmbedding on a flat batch, rank {rank}: relative error {err:.3g}"


@pytest.mark.lab9
def test_vocab_parallel_embedding_on_one_rank_is_the_embedding(load):
    layers = load("parallel.layers")
    table, rows, ids = embedding_case(50, 1)
    out = layers.VocabParallelEmbedding(shard_table(table, 0, rows), 0, 50, NoCollectives())(ids)
    err = rel_err(out, table[ids])
    assert err < 1e-12, f"VocabParallelEmbedding on one rank: relative error {err:.3g} from the table's rows"


def test_lm_head_gathers_every_rank_logits_to_rank_0_and_drops_the_padding():
    from solutions.parallel.layers import ParallelLMHead

    vocab, world = 101, 3
    table, rows, _ = embedding_case(vocab, world)
    hidden = torch.randn(4, 8, dtype=torch.float64)

    def run(group):
        local = nn.Linear(8, rows, bias=False, dtype=torch.float64)
        local.weight.data = shard_table(table, group.rank, rows).weight.clone()
        return ParallelLMHead(local, vocab, group)(hidden)

    outputs, sent = two_pass(world, run, combine=lambda parts: torch.cat(parts, dim=-1))
    assert [len(s) for s in sent] == [1] * world, "the LM head runs one gather per forward"
    assert outputs[0].shape == (4, vocab) and rel_err(outputs[0], hidden @ table.T) < 1e-12
    assert outputs[1].shape == (4, rows)  # the other ranks only send


# ---- the split rules ---------------------------------------------------------------------------------------


def small_config(**changes) -> ModelConfig:
    values = dict(
        vocab_size=101, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=6, num_kv_heads=3,
        head_dim=16, rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=256,
        tie_word_embeddings=False,
    )  # fmt: skip
    return ModelConfig(**{**values, **changes})


def test_a_size_that_does_not_divide_the_heads_is_named():
    from solutions.parallel.shard import check_shardable, supported_sizes

    config = small_config(num_heads=9, num_kv_heads=3, intermediate_size=1536)  # SmolLM2-135M's counts
    assert supported_sizes(config) == [1, 3]
    check_shardable(config, 3)
    with pytest.raises(
        ValueError, match=r"tensor_parallel_size=2 .* 9 query heads and 3 KV heads.*fit: 1, 3"
    ):
        check_shardable(config, 2)
    with pytest.raises(ValueError, match="Mixture-of-Experts"):
        check_shardable(small_config(num_local_experts=4, num_experts_per_tok=2), 3)


def test_unsupported_combinations_fail_at_construction():
    from solutions.config import EngineConfig

    with pytest.raises(ValueError, match="speculative decoding"):
        EngineConfig(device="cpu", tensor_parallel_size=3, speculative="ngram")
    with pytest.raises(ValueError, match="tensor_parallel_size must be an integer >= 1"):
        EngineConfig(device="cpu", tensor_parallel_size=0)


def test_the_shards_of_every_weight_put_back_together_give_the_whole():
    """Rows of Q/K/V by whole heads, gate/up by channels, columns of o/down, vocabulary rows padded."""
    from solutions.parallel.shard import ShardedStateDict, shard_config

    config, world = small_config(), 3
    gen = torch.Generator().manual_seed(0)
    d, q, kv, inter = (
        config.head_dim,
        config.num_heads * 16,
        config.num_kv_heads * 16,
        config.intermediate_size,
    )
    shapes = {
        "model.embed_tokens.weight": (101, 64), "lm_head.weight": (101, 64), "model.norm.weight": (64,),
        "model.layers.0.self_attn.q_proj.weight": (q, 64), "model.layers.0.self_attn.k_proj.weight": (kv, 64),
        "model.layers.0.self_attn.o_proj.weight": (64, q), "model.layers.0.mlp.up_proj.weight": (inter, 64),
        "model.layers.0.mlp.down_proj.weight": (64, inter),
    }  # fmt: skip
    whole = {name: torch.randn(shape, generator=gen) for name, shape in shapes.items()}
    shards = [ShardedStateDict(whole, config, rank, world) for rank in range(world)]
    part = shard_config(config, world)
    assert (part.num_heads, part.num_kv_heads, part.intermediate_size, part.vocab_size) == (2, 1, 32, 34)
    for name, tensor in whole.items():
        pieces = [shard[name] for shard in shards]
        dim = 1 if name.endswith(("o_proj.weight", "down_proj.weight")) else 0
        if tensor.dim() == 1:
            assert all(torch.equal(p, tensor) for p in pieces), f"{name} must be whole on every rank"
            continue
        joined = torch.cat(pieces, dim=dim)
        if "embed_tokens" in name or "lm_head" in name:
            assert joined.shape[0] == 3 * 34 and not joined[101:].any(), (
                "vocabulary padding rows must be zero"
            )
            joined = joined[:101]
        assert torch.equal(joined, tensor), f"{name}: the ranks' pieces do not make the whole"
    # Rank 1 owns query heads 2-3 and KV head 1: whole heads, in order.
    assert torch.equal(shards[1]["model.layers.0.self_attn.q_proj.weight"], whole[
        "model.layers.0.self_attn.q_proj.weight"][2 * d : 4 * d])  # fmt: skip


@pytest.mark.slow
@pytest.mark.needs_model
def test_awq_shards_are_the_pieces_of_the_whole_models_packed_weights(bundled_model, monkeypatch):
    """Quantizing rank 1's shard (of 3) with its cut of AWQ's scales packs exactly the codes, scales and zero
    points of the whole quantized model's rows (column-parallel) or columns (row-parallel): groups stay
    whole."""
    from solutions.config import EngineConfig
    from solutions.model.llama import LlamaModel
    from solutions.model.loader import load_weights
    from solutions.parallel.group import TensorParallelGroup
    from solutions.parallel.shard import head_part, vocab_range
    from solutions.parallel.sharded_model import build_shard
    from solutions.quant.model import quantize_named_model

    monkeypatch.setenv("FASTMODE_CPU_LINEAR", "linear")  # the paths are not what this test is about
    weights = load_weights()
    config = EngineConfig(device="cpu", dtype="float32", quantization="awq", tensor_parallel_size=3)
    whole = LlamaModel.from_state_dict(weights.config, weights.state_dict, "cpu", torch.float32)
    quantize_named_model(whole, weights.source.stem, "awq", config.w_bit, config.group_size)
    rank = 1
    shard = build_shard(
        config, weights, TensorParallelGroup(rank, 3, torch.device("cpu"))
    )  # no collective runs
    c = weights.config
    q, kv = head_part(c.num_heads, c.head_dim, rank, 3), head_part(c.num_kv_heads, c.head_dim, rank, 3)
    q_size, kv_size, inter = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size
    mlp = slice(rank * inter // 3, (rank + 1) * inter // 3)
    shift = lambda part, offset: slice(part.start + offset, part.stop + offset)  # noqa: E731
    rows = lambda matrix, parts: torch.cat([matrix[p] for p in parts])  # noqa: E731
    for i in (0, c.num_layers - 1):
        w, s = whole.layers[i], shard.layers[i]
        qkv, gate_up = w.self_attn.qkv_proj.dequantize(), w.mlp.gate_up_proj.dequantize()
        expected = {
            "qkv_proj": (
                s.self_attn.qkv_proj,
                rows(qkv, [q, shift(kv, q_size), shift(kv, q_size + kv_size)]),
            ),
            "o_proj": (s.self_attn.o_proj.linear, w.self_attn.o_proj.dequantize()[:, q]),
            "gate_up_proj": (s.mlp.gate_up_proj, rows(gate_up, [mlp, shift(mlp, inter)])),
            "down_proj": (s.mlp.down_proj.linear, w.mlp.down_proj.dequantize()[:, mlp]),
        }
        for name, (packed, want) in expected.items():
            assert torch.equal(packed.dequantize(), want), (
                f"layer {i} {name}: the shard's INT4 weights differ"
            )
    start, end = vocab_range(c.vocab_size, rank, 3)
    assert torch.equal(shard.lm_head.linear.dequantize(), whole.lm_head.dequantize()[start:end])
    ids = torch.tensor([start, end - 1])
    assert torch.equal(shard.embed_tokens.embedding(ids - start), whole.embed_tokens(ids)), (
        "tied INT4 embedding"
    )


# ---- the engine over gloo (and NCCL) -----------------------------------------------------------------------


def gone(pid: int) -> bool:
    """The process has ended (a zombie counts: it runs nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def assert_all_gone(pids: list[int], within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in pids if not gone(pid)]
    assert not left, f"worker processes {left} still run {within:.0f} s after the engine ended"
    ours = [p for p in multiprocessing.active_children() if p.name.startswith("fastmode-tp")]
    assert not ours, f"multiprocessing still lists workers {ours}"


TINY_BLOCK_BYTES = 2 * 2 * 16 * 2 * 16 * 4  # K and V x layers x block_size x KV heads x head_dim x float32
TINY_BLOCKS = 13  # 12 usable: fewer than the workload below needs at once, so it preempts


def tiny_llm(load, folder: Path, size: int, device: str = "cpu"):
    """The tiny model at ``size`` ranks, the same number of KV blocks at every size (each rank's block holds
    ``2 / size`` KV heads), so both engines schedule, preempt and copy blocks alike; 16 tokens per step, so
    longer prompts are prefilled in chunks (some steps want no logits at all)."""
    return load("llm").LLM(
        model=str(folder), device=device, tensor_parallel_size=size, skip_tokenizer_init=True,
        dtype="float32", max_num_seqs=8, max_model_len=80, max_num_batched_tokens=16,
        kv_cache_memory=TINY_BLOCKS * TINY_BLOCK_BYTES // size,
    )  # fmt: skip


def run_recording(llm, batches) -> tuple[list, list[torch.Tensor], int]:
    """Generate each ``(prompts, params)`` batch in turn; returns the outputs, every step's logits (rank 0's,
    gathered) and the number of blocks copied on write."""
    runner, steps, copies = llm.engine.runner, [], []
    execute = runner.execute

    def recording(plan, **options):
        out = execute(plan, **options)
        steps.append(out.logits.clone())
        copies.append(len(plan.block_copies))
        return out

    runner.execute = recording
    try:
        outputs = [out for prompts, params in batches for out in llm.generate(prompts, params)]
    finally:
        del runner.execute
    return outputs, steps, sum(copies)


def tiny_workload(load) -> list[tuple[list[list[int]], object]]:
    """Six greedy prompts that need more blocks than there are (so some are preempted and recomputed), then a
    new 21-token prompt alone, sampled n=3 times: its first chunk of 16 wants no logits, and the completions
    share its blocks and copy the last one on write."""
    sampling = load("sampling_params").SamplingParams
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 101, (n,), generator=gen).tolist() for n in (5, 17, 33, 2, 40, 9, 21)]
    greedy = sampling(temperature=0, max_tokens=24, ignore_eos=True)
    forked = sampling(temperature=0.8, top_p=0.9, seed=7, n=3, max_tokens=20, ignore_eos=True)
    return [(prompts[:6], greedy), (prompts[6:], forked)]


def check_tiny_engine_matches_one_process(load, folder: Path, device: str) -> None:
    batches = tiny_workload(load)
    single = tiny_llm(load, folder, 1, device)
    want, want_logits, want_copies = run_recording(single, batches)
    llm = tiny_llm(load, folder, 2, device)
    pids = llm.engine.workers.worker_pids
    try:
        got, got_logits, got_copies = run_recording(llm, batches)
    finally:
        llm.shutdown()
    assert_all_gone(pids)
    assert len(got_logits) == len(want_logits), "the two engines scheduled different steps"
    shapes = [tuple(g.shape) == tuple(w.shape) for g, w in zip(got_logits, want_logits)]
    assert all(shapes), "the two engines' steps wanted different logits rows"
    worst = max(
        (float((g - w).abs().max()) for g, w in zip(got_logits, want_logits) if g.numel()), default=0.0
    )
    assert worst < 1e-5, f"logits at 2 ranks differ from 1 rank by up to {worst:.3g} (float32; allowed 1e-5)"
    tokens = lambda outs: [[c.token_ids for c in out.outputs] for out in outs]  # noqa: E731
    assert tokens(got) == tokens(want), "greedy and seeded tokens at 2 ranks differ from 1 rank"
    assert sum(out.metrics.num_preemptions for out in got) > 0, "the workload was meant to preempt"
    assert got_copies == want_copies and got_copies > 0, "n=3 completions were meant to copy a block on write"
    assert any(len(step) == 0 for step in got_logits), (
        "a step of prefill chunks alone was meant to want no logits"
    )


@pytest.mark.lab9
def test_two_ranks_give_the_one_process_logits_with_preemption_and_n_completions(load, tiny_folder):
    """Gloo, 2 CPU processes: every step's logits within 1e-5 of the one-process engine (float32), through
    prefill chunks, batched decodes, preemption (recompute) and n=3 sampled completions sharing blocks."""
    check_tiny_engine_matches_one_process(load, tiny_folder, "cpu")


@needs_two_gpus
def test_two_gpus_give_the_one_gpu_logits_over_nccl(load, tiny_folder):
    check_tiny_engine_matches_one_process(load, tiny_folder, "cuda")


def test_a_worker_that_dies_makes_generate_raise_and_leaves_no_process(load, tiny_folder):
    llm = tiny_llm(load, tiny_folder, 2)
    pids = llm.engine.workers.worker_pids
    params = load("sampling_params").SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    error = load("parallel.group").TensorParallelError
    stream = llm.stream([[1, 2, 3], [4, 5]], params)
    next(stream)
    os.kill(pids[0], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(error, match="rank 1"):
        for _ in stream:
            pass
    assert time.monotonic() - start < 30, "generate took too long to notice the dead worker"
    with pytest.raises(error, match="cannot run"):
        llm.generate([[1, 2]], params)
    llm.shutdown()
    assert_all_gone(pids)


def test_an_error_in_rank_0s_forward_stops_the_workers_instead_of_desynchronising_them(load, tiny_folder):
    """Rank 0 raises half-way through a step (the workers wait in that step's collectives): the error reaches
    the caller, and the next call raises too rather than send a step the workers are not ready for."""
    llm = tiny_llm(load, tiny_folder, 2)
    pids = llm.engine.workers.worker_pids
    params = load("sampling_params").SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    mlp = llm.engine.model.layers[1].mlp

    def fail_once(module, args):
        module._forward_pre_hooks.clear()
        raise RuntimeError("injected failure in rank 0's MLP")

    mlp.register_forward_pre_hook(fail_once)
    with pytest.raises(RuntimeError, match="injected failure"):
        llm.generate([[1, 2, 3]], params)
    with pytest.raises(load("parallel.group").TensorParallelError, match="previous step stopped"):
        llm.generate([[1, 2, 3]], params)
    llm.shutdown()
    assert_all_gone(pids)


def test_workers_end_when_rank_0_is_killed(tiny_folder):
    """Rank 0 dies without a chance to clean up (SIGKILL): each worker sees its pipe close and exits."""
    script = textwrap.dedent(
        f"""
        import os, signal
        if __name__ == "__main__":
            from solutions import LLM

            llm = LLM(model={str(tiny_folder)!r}, device="cpu", tensor_parallel_size=2,
                      skip_tokenizer_init=True, dtype="float32", max_model_len=64, kv_cache_memory=1 << 20)
            print(*llm.engine.workers.worker_pids, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    assert_all_gone([int(pid) for pid in result.stdout.split()])


@pytest.mark.slow
@pytest.mark.needs_model
def test_the_bundled_model_at_3_ranks_gives_the_one_process_greedy_tokens(load, llm, bundled_model):
    """SmolLM2-135M (9 query, 3 KV heads) at 3 ranks over gloo: token-identical greedy output to the
    one-process engine on four prompts batched and streamed; 2 ranks fail at construction, naming the head
    counts, with no process started."""
    LLM, sampling = load("llm").LLM, load("sampling_params").SamplingParams
    with pytest.raises(ValueError, match="9 query heads and 3 KV heads"):
        LLM(device="cpu", tensor_parallel_size=2)
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("fastmode-tp")]
    prompts = ["The capital of France is", "def fibonacci(n):", "Write a haiku about the sea.", "1, 2, 3, 4,"]
    params = sampling(temperature=0, max_tokens=20)
    want = [out.outputs[0].text for out in llm.generate(prompts, params)]
    parallel = LLM(
        device="cpu", dtype="float32", max_num_seqs=8, max_model_len=1024, kv_cache_memory=64 << 20,
        tensor_parallel_size=3,
    )  # fmt: skip
    pids = parallel.engine.workers.worker_pids
    deltas: dict[str, list[str]] = {}
    try:  # one batch of four, streamed: each snapshot carries its request's new text
        for snapshot in parallel.stream(prompts, params):
            deltas.setdefault(snapshot.request_id, []).append(snapshot.outputs[0].delta_text)
            if snapshot.finished:
                assert "".join(deltas[snapshot.request_id]) == snapshot.outputs[0].text
    finally:
        parallel.shutdown()
    assert_all_gone(pids)
    got = ["".join(deltas[request_id]) for request_id in sorted(deltas, key=int)]
    assert got == want, f"3 ranks gave {got}, one process {want}"
