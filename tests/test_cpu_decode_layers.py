"""A lone decode's layers without module calls (``model/cpu_decode_layers.py``) and an INT4 model's layer
compiled whole (``quant/cpu_int4_layer.py``): the same math as the model's layers, K/V written into the cache
in place, the engine's greedy tokens unchanged, and every step they cannot run (a batch, a hook, a context in
pieces) left to the modules."""

from __future__ import annotations

import pytest
import torch
from tiny_models import write_tiny_llama

from solutions import LLM, SamplingParams
from solutions.bench.step_split import measure_step_split
from solutions.cache.paged_kv_cache import AttentionMetadata, PagedAttention, PagedKVCache
from solutions.kernels.attention import gqa_attention
from solutions.kernels.cpu_aot import CompileFailed, require_compiler
from solutions.kernels.cpu_linear import cached_decisions, read_decisions
from solutions.model import cpu_decode_layers
from solutions.model.cpu_decode_layers import (
    DecodeLayers,
    compiled_attention,
    rope_store_attend,
    rope_store_attend_rows,
    verify_attention,
)
from solutions.model.llama import PLAIN_OPS
from solutions.quant import cpu_int4_layer
from solutions.quant.cpu_int4_layer import Int4DecodeLayers, decode_layer, layer_shape, layer_weights
from solutions.speculative.tree import TreeAttention, tree_attention_mask


def _has_compiler() -> bool:
    try:
        require_compiler()
    except CompileFailed:
        return False
    return True


needs_compiler = pytest.mark.skipif(not _has_compiler(), reason="AOTInductor needs a C++ compiler")
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
PROMPTS = [[5, 17, 3, 88], [42, 9], [7, 7, 7, 60, 1, 2]]


@pytest.fixture(scope="module")
def int4_llm(tmp_path_factory):
    """The tiny Llama (its vocabulary rounded up to 128 rows, as the int4 kernel needs) quantized to INT4
    (round to nearest, groups of 32) on the CPU, float32 activations."""
    folder = write_tiny_llama(tmp_path_factory.mktemp("tiny-llama-v128"), vocab_size=128)
    llm = LLM(
        model=str(folder),
        device="cpu",
        dtype="float32",
        quantization="rtn",
        group_size=32,
        skip_tokenizer_init=True,
        max_model_len=256,
        max_num_seqs=4,
    )
    yield llm
    llm.shutdown()


def _compiled(llm: LLM) -> Int4DecodeLayers:
    """The engine's compiled layers, built directly: whether they measure faster does not matter here."""
    model = llm.engine.model
    shape = layer_shape(model)
    run, _ = cpu_int4_layer.compiled_layer(
        layer_weights(model.layers[0]), shape, llm.engine.runner.cache.k.dtype
    )
    return Int4DecodeLayers(model, run)


def _float_layers(llm: LLM) -> DecodeLayers:
    """The engine's layers without module calls, attention compiled, built directly (whatever it measures)."""
    model, config = llm.engine.model, llm.engine.model.config
    heads = (config.num_heads, config.num_kv_heads, config.head_dim)
    run, _ = compiled_attention(*heads, model.norm.weight.dtype, llm.engine.runner.cache.k.dtype)
    return DecodeLayers(model, run)


class Counting:
    """Wraps a ``fused_decode``: counts the steps it ran (returned a result), those of them whose context it
    gathered (not one run of the cache), and the steps it declined."""

    def __init__(self, fused: Int4DecodeLayers | DecodeLayers):
        self.fused, self.ran, self.gathered, self.declined = fused, 0, 0, 0

    def __call__(self, hidden, cos, sin, attend):
        out = self.fused(hidden, cos, sin, attend)
        self.ran += out is not None
        one_token = hidden.shape[0] == 1
        self.gathered += out is not None and one_token and attend.decode_context().rows is not None
        self.declined += out is None
        return out


def _modules_then(
    fused: Counting, llm: LLM, prompts: list[list[int]]
) -> tuple[list[list[int]], list[list[int]]]:
    """Greedy tokens of ``prompts`` one at a time, first through the modules, then with ``fused`` as the
    model's ``fused_decode`` (None again after)."""
    model = llm.engine.model
    try:
        model.fused_decode = None
        expected = _tokens(llm, prompts)
        model.fused_decode = fused
        return expected, _tokens(llm, prompts)
    finally:
        model.fused_decode = None


def _tokens(llm: LLM, prompts: list[list[int]], together: bool = False) -> list[list[int]]:
    if together:
        return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, GREEDY)]
    return [list(llm.generate([p], GREEDY)[0].outputs[0].token_ids) for p in prompts]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_float_layers_give_the_same_greedy_tokens(tiny_folder, dtype):
    """A float model: no INT4 layer for it; its layers run as plain calls with the attention compiled give
    the modules' greedy tokens, batch 1, and they ran every decode step."""
    llm = LLM(model=str(tiny_folder), device="cpu", dtype=dtype, skip_tokenizer_init=True, max_model_len=256)
    model = llm.engine.model
    assert layer_shape(model) is None and not isinstance(model.fused_decode, Int4DecodeLayers)
    if not _has_compiler():
        return llm.shutdown()
    counting = Counting(_float_layers(llm))
    expected, got = _modules_then(counting, llm, PROMPTS)
    assert got == expected
    assert counting.ran == len(PROMPTS) * (GREEDY.max_tokens - 1), (counting.ran, counting.declined)
    llm.shutdown()


@torch.inference_mode()
def test_decode_layer_is_the_models_layer(int4_llm):
    """Run eagerly, ``decode_layer`` gives what ``DecoderLayer`` gives with ``PLAIN_OPS`` for one token over
    a 20-token context, and stores the token's K/V at its row."""
    model = int4_llm.engine.model
    layer, shape, config = model.layers[1], layer_shape(model), model.config
    generator = torch.Generator().manual_seed(1)
    hidden, residual = torch.randn(2, 1, config.hidden_size, generator=generator)
    position = torch.tensor([19])
    cos, sin = model.rope_cos[position], model.rope_sin[position]
    keys, values = torch.randn(2, 20, config.num_kv_heads, config.head_dim, generator=generator)
    stored = {}

    def attend(index, q, k, v):  # the eager layer's attention: the token's K/V last in its context
        stored["k"], stored["v"] = k, v
        context = [torch.cat([c[:19], new]).transpose(0, 1)[None] for c, new in ((keys, k), (values, v))]
        return gqa_attention(q.transpose(0, 1)[None], *context, causal=False)[0].transpose(0, 1)

    ops = model.ops
    model.use_ops(PLAIN_OPS)
    try:
        expected = layer(hidden, residual, cos, sin, attend)
    finally:
        model.use_ops(ops)
    got = decode_layer(
        hidden, residual, cos, sin, *layer_weights(layer), keys, values, torch.tensor([19]), shape=shape
    )
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(keys[19], stored["k"][0])
    torch.testing.assert_close(values[19], stored["v"][0])


@needs_compiler
@torch.inference_mode()
def test_compiled_layer_writes_the_cache_in_place(int4_llm):
    """Through views of a larger cache (as the engine passes them), the library gives the eager layer's
    outputs and writes row ``row`` of the cache itself, nothing else."""
    model = int4_llm.engine.model
    shape, weights = layer_shape(model), layer_weights(model.layers[0])
    run, _ = cpu_int4_layer.compiled_layer(weights, shape, torch.float32)
    inputs = cpu_int4_layer.example_inputs(weights, shape, torch.float32, context=40, gathered=False)
    big = [torch.randn(100, *t.shape[1:]) for t in inputs[-3:-1]]  # the context is rows 30:70 of these
    for cache, context in zip(big, inputs[-3:-1], strict=True):
        cache[30:70] = context
    before = [cache.clone() for cache in big]
    got = run([*inputs[:-3], big[0][30:70], big[1][30:70], torch.tensor([25])])
    expected = decode_layer(*inputs[:-1], torch.tensor([25]), shape=shape)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for cache, old, written in zip(big, before, inputs[-3:-1], strict=True):
        changed = (cache != old).any(dim=(1, 2)).nonzero().flatten().tolist()
        assert changed == [55], changed
        torch.testing.assert_close(cache[55], written[25])


@needs_compiler
@torch.inference_mode()
def test_compiled_layer_gathers_a_context_in_pieces(int4_llm):
    """Given the context's rows (scattered over the cache, in token order), the library gives the eager
    layer's outputs and writes the token's row of the cache, nothing else."""
    model = int4_llm.engine.model
    shape, weights = layer_shape(model), layer_weights(model.layers[0])
    run, _ = cpu_int4_layer.compiled_layer(weights, shape, torch.float32)
    inputs = cpu_int4_layer.example_inputs(weights, shape, torch.float32, context=40, gathered=True)
    fresh = [t.clone() for t in inputs]
    got = run(fresh)
    expected = decode_layer(*inputs, shape=shape)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    untouched = cpu_int4_layer.example_inputs(weights, shape, torch.float32, 40, gathered=True)
    for compiled, eager, before in zip(fresh[-4:-2], inputs[-4:-2], untouched[-4:-2], strict=True):
        torch.testing.assert_close(compiled, eager)  # the same row written, with the same values
        assert (compiled != before).any(dim=(1, 2)).nonzero().flatten().tolist() == inputs[-2].tolist()


@needs_compiler
@pytest.mark.parametrize("layers", ["int4", "float"])
def test_engine_greedy_tokens_unchanged(int4_llm, layers):
    """Batch-1 greedy decoding gives the same tokens with the INT4 layers compiled whole (or run as
    ``DecodeLayers``, as where the whole layer does not pay) as with the modules, and they ran."""
    counting = Counting(_compiled(int4_llm) if layers == "int4" else _float_layers(int4_llm))
    expected, got = _modules_then(counting, int4_llm, PROMPTS)
    assert got == expected
    assert counting.ran == len(PROMPTS) * (GREEDY.max_tokens - 1), (counting.ran, counting.declined)


@needs_compiler
@pytest.mark.parametrize("layers", ["int4", "float"])
def test_a_shared_prefix_is_gathered_with_the_same_tokens(int4_llm, layers):
    """Prompts that share a cached first block: each later context is two pieces of the cache, gathered by
    its rows; the tokens are the modules' still."""
    prefix = list(range(3, 23))  # 20 tokens: one full block of 16 shared
    prompts = [prefix + [40, 41], prefix + [50], prefix + [60, 61, 62]]
    counting = Counting(_compiled(int4_llm) if layers == "int4" else _float_layers(int4_llm))
    expected, got = _modules_then(counting, int4_llm, prompts)
    assert got == expected
    assert counting.ran == len(prompts) * (GREEDY.max_tokens - 1) and counting.gathered > 0, vars(counting)


@needs_compiler
def test_steps_it_cannot_run_are_left_to_the_layers(int4_llm):
    """Several sequences in a step, and a hook on a module the call replaces, run the eager layers: the
    tokens are the same and the hook sees every step."""
    model = int4_llm.engine.model
    counting = Counting(_compiled(int4_llm))
    seen = []
    try:
        model.fused_decode = None
        expected = _tokens(int4_llm, PROMPTS, together=True)
        model.fused_decode = counting
        assert _tokens(int4_llm, PROMPTS, together=True) == expected
        assert counting.ran == 0  # three sequences a step: declined, the modules run
        hook = model.layers[1].mlp.down_proj.register_forward_hook(lambda *args: seen.append(1))
        try:
            ran, declined = counting.ran, counting.declined
            assert _tokens(int4_llm, PROMPTS[:1]) == expected[:1]
        finally:
            hook.remove()
        assert counting.ran == ran and counting.declined == declined + GREEDY.max_tokens  # prompt, decodes
        assert len(seen) == GREEDY.max_tokens  # the prompt's step and every decode step
    finally:
        model.fused_decode = None


def _paged_step(blocks: list[int], length: int, slots: list[int], sequences: int = 1) -> PagedAttention:
    """A step of ``len(slots)`` new tokens (their cache rows) at the end of a ``length``-token sequence whose
    blocks are ``blocks`` (``sequences`` copies of it), in a 3-layer cache of 8 blocks of 4 rows."""
    cache = PagedKVCache(
        num_layers=3,
        num_blocks=8,
        block_size=4,
        num_kv_heads=2,
        head_dim=8,
        dtype=torch.float32,
        device="cpu",
    )
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots * sequences),
        block_table=torch.tensor([blocks] * sequences, dtype=torch.int32),
        query_start_loc=torch.arange(sequences + 1, dtype=torch.int32) * len(slots),
        seq_lens=torch.full((sequences,), length, dtype=torch.int32),
        max_query_len=len(slots),
        max_seq_len=length,
    )
    return PagedAttention(cache, meta, "torch")


def _one_decode(blocks: list[int], length: int, slot: int) -> PagedAttention:
    return _paged_step(blocks, length, [slot])


def test_decode_context_views_one_run_of_the_cache():
    attend = _one_decode([3, 4, 5], length=10, slot=5 * 4 + 1)  # tokens 0-9 in rows 12-21, the new one at 21
    run = attend.decode_context()
    assert (
        run.keys.shape == run.values.shape == (3, 10, 2, 8) and run.row.tolist() == [9] and run.rows is None
    )
    run.keys[2, 9] = 1.0  # a view: writes reach the cache itself
    assert attend.cache.k[2].view(-1, 2, 8)[21].eq(1.0).all()
    assert attend.cache.k.ne(0).sum() == 16


@pytest.mark.parametrize(
    "blocks, length, rows, why",
    [
        ([5, 4, 3], 10, [20, 21, 22, 23, 16, 17, 18, 19, 12, 13], "descending: stale rows inside the run"),
        ([3, 6], 6, [12, 13, 14, 15, 24, 25], "two runs"),
    ],
)
def test_decode_context_names_the_rows_of_a_context_in_pieces(blocks, length, rows, why):
    """The whole caches, the token's cache row, and the context's rows in token order (the token's last)."""
    context = _one_decode(blocks, length, rows[-1]).decode_context()
    assert context.keys.shape == context.values.shape == (3, 32, 2, 8), why
    assert context.row.tolist() == rows[-1:] and context.rows.tolist() == rows, why


def test_decode_context_is_none_for_a_token_without_a_slot():
    assert _one_decode([3, 4], 6, -1).decode_context() is None


def test_decisions_cache_keeps_its_own_regimes(tmp_path):
    """A cache of one-regime decisions (the decode layer's) is read back under those regimes only."""
    path, regimes, paths = tmp_path / "decisions.json", {"decode": 1}, ("plain", "compiled")
    entry = {"decode": {"path": "compiled", "us": {"plain": 9.0, "compiled": 3.0}}}
    assert cached_decisions({"k": lambda: entry}, True, path, {"m": 1}, paths, regimes) == {"k": entry}
    assert read_decisions(path, {"m": 1}, paths, regimes) == {"k": entry}
    assert read_decisions(path, {"m": 1}, paths) == {}  # not an entry for the three-regime caches


@needs_compiler
def test_step_split_times_the_compiled_layers_as_one_part(int4_llm):
    """``bench quant``'s split: with the layers compiled whole, their calls are one part, the eager layers'
    parts (attention, the layers' products) take no time, and the timer comes off after."""
    model = int4_llm.engine.model
    fused = model.fused_decode = _compiled(int4_llm)
    try:
        split = measure_step_split(int4_llm, PROMPTS[0], new_tokens=4, repeats=1)
        assert model.fused_decode is fused
    finally:
        model.fused_decode = None
    assert split.ms["compiled layers"] > 0 and split.ms["attention"] == 0, split.ms


@needs_compiler
def test_step_split_times_the_float_layers_by_part(tiny_folder):
    """``DecodeLayers``' products and chains are the model's own (timed as such), its compiled attention
    is timed as attention, and its attribute is restored after."""
    llm = LLM(
        model=str(tiny_folder), device="cpu", dtype="float32", skip_tokenizer_init=True, max_model_len=64
    )
    model = llm.engine.model
    fused = model.fused_decode = _float_layers(llm)
    attention = fused.attention
    split = measure_step_split(llm, PROMPTS[0], new_tokens=4, repeats=1)
    assert model.fused_decode is fused and fused.attention is attention
    assert split.ms["compiled layers"] == 0, split.ms
    assert all(split.ms[part] > 0 for part in ("matrix products", "attention", "elementwise")), split.ms
    llm.shutdown()


def test_no_compiler_or_fused_off_keeps_the_modules(int4_llm, monkeypatch, caplog):
    """Where the libraries cannot be built, one warning says why and the modules run; ``FASTMODE_FUSED=0``
    keeps the modules without trying."""
    model, dtype = int4_llm.engine.model, int4_llm.engine.runner.cache.k.dtype

    def no_compiler(*args, **kwargs):
        raise CompileFailed("no C++ compiler: g++ is not on PATH (set $CXX to one)")

    monkeypatch.setattr(cpu_decode_layers, "compiled_attention", no_compiler)
    monkeypatch.setattr(cpu_int4_layer, "compiled_layer", no_compiler)
    with caplog.at_level("WARNING", logger="fastmode"):
        assert cpu_int4_layer.int4_decode_layers(model, dtype) is None
        assert cpu_decode_layers.decode_layers(model, dtype) is None
    assert [r.getMessage().count("no C++ compiler") for r in caplog.records] == [1, 1]
    monkeypatch.undo()  # compilers back, then fused ops off: still the modules
    monkeypatch.setenv("FASTMODE_FUSED", "0")
    assert cpu_int4_layer.int4_decode_layers(model, dtype) is None
    assert cpu_decode_layers.decode_layers(model, dtype) is None


def _verify_step(blocks: list[int], length: int, new: int, sequences: int = 1) -> PagedAttention:
    """A step of a sequence's last ``new`` tokens (``sequences`` copies of it)."""
    slots = [blocks[p // 4] * 4 + p % 4 for p in range(length - new, length)]
    return _paged_step(blocks, length, slots, sequences)


def test_verify_context_names_the_new_tokens_rows_and_the_whole_context():
    """One sequence's 3 new tokens after 7 others: their cache rows, and the context's rows in token order
    (theirs last); a step of two sequences, of one token, or of more rows than asked for is not one."""
    context = _verify_step([5, 2, 6], length=10, new=3).verify_context(16)
    assert context.keys.shape == context.values.shape == (3, 32, 2, 8)
    assert context.rows.tolist() == [20, 21, 22, 23, 8, 9, 10, 11, 24, 25]
    assert context.row.tolist() == [11, 24, 25]
    assert context.visible.tolist() == [[True] * (8 + i) + [False] * (2 - i) for i in range(3)], (
        "token i of the 3 new ones sees the 7 before them and the new ones up to itself"
    )
    assert _verify_step([5, 2, 6], length=10, new=3, sequences=2).verify_context(16) is None
    assert _verify_step([5, 2, 6], length=10, new=3).verify_context(2) is None
    assert _verify_step([5, 2, 6], length=10, new=1).verify_context(16) is None


@torch.inference_mode()
def test_rows_attention_is_each_token_attending_alone_over_its_own_prefix():
    """``rope_store_attend_rows`` over 5 new tokens: each row equals ``rope_store_attend`` of that token alone
    over the context up to it, and the cache holds the same rows after."""
    heads, kv_heads, dim, context, new = 6, 2, 16, 21, 5
    generator = torch.Generator().manual_seed(3)
    qkv = torch.randn(new, heads + 2 * kv_heads, dim, generator=generator)
    angles = torch.rand(new, dim, generator=generator) * 6.3
    keys, values = torch.randn(2, 2 * context, kv_heads, dim, generator=generator)
    rows = torch.randperm(2 * context, generator=generator)[:context]
    together_cache = [keys.clone(), values.clone()]
    causal = torch.arange(context)[None, :] <= torch.arange(context - new, context)[:, None]
    together = rope_store_attend_rows(
        qkv, angles.cos(), angles.sin(), *together_cache, rows[-new:], rows, causal,
        heads=heads, kv_heads=kv_heads,
    )  # fmt: skip
    for i in range(new):
        position = context - new + i
        alone = rope_store_attend(
            qkv[i : i + 1], angles[i : i + 1].cos(), angles[i : i + 1].sin(), keys, values,
            rows[position : position + 1], rows[: position + 1], heads=heads, kv_heads=kv_heads,
        )  # fmt: skip
        assert torch.allclose(together[i : i + 1], alone, atol=1e-5), f"new token {i}"
    assert torch.equal(together_cache[0], keys) and torch.equal(together_cache[1], values)


@torch.inference_mode()
def test_rows_attention_under_a_tree_mask_is_each_node_over_its_own_path():
    """A tree's nodes verified in one call (``rope_store_attend_rows`` with the tree mask beside the context):
    node ``i`` equals ``rope_store_attend`` of its token alone over the context then its path, as if its path
    had been accepted; a node that attended to a sibling's or a cousin's row would differ."""
    parents = [-1, 0, 0, 1, 1, 2, 3]  # root; a, b; c, d under a; e under b; f under c
    heads, kv_heads, dim, before, new = 6, 2, 16, 9, len(parents)
    generator = torch.Generator().manual_seed(4)
    qkv = torch.randn(new, heads + 2 * kv_heads, dim, generator=generator)
    angles = torch.rand(new, dim, generator=generator) * 6.3
    keys, values = torch.randn(2, 3 * (before + new), kv_heads, dim, generator=generator)
    rows = torch.randperm(3 * (before + new), generator=generator)[: before + new]
    mask = tree_attention_mask(parents)
    visible = torch.cat([torch.ones(new, before, dtype=torch.bool), mask], dim=1)
    cache = [keys.clone(), values.clone()]
    together = rope_store_attend_rows(
        qkv, angles.cos(), angles.sin(), *cache, rows[before:], rows, visible, heads=heads, kv_heads=kv_heads
    )
    for node in range(new):
        path = rows[before:][mask[node]]  # the node's ancestors then itself, in depth order
        alone = rope_store_attend(
            qkv[node : node + 1], angles[node : node + 1].cos(), angles[node : node + 1].sin(), *cache,
            rows[before + node : before + node + 1], torch.cat([rows[:before], path]),
            heads=heads, kv_heads=kv_heads,
        )  # fmt: skip
        assert torch.allclose(together[node : node + 1], alone, atol=1e-5), (
            f"tree node {node} (parent {parents[node]}) does not equal its token over its own path"
        )


def test_a_tree_step_alone_gives_its_context_with_the_tree_mask():
    """``TreeAttention.verify_context``: a step verifying one tree and nothing else names the nodes' rows, the
    context's then the nodes' rows, and the tree mask beside an all-visible context; a step where a tree
    shares the batch gives None."""
    parents = [-1, 0, 0, 1]
    blocks, length = [5, 2, 6], 10  # 6 tokens of context, then the tree's 4 nodes
    slots = [blocks[p // 4] * 4 + p % 4 for p in range(length - 4, length)]
    paged = _paged_step(blocks, length, slots)
    context_slots = torch.tensor([blocks[p // 4] * 4 + p % 4 for p in range(6)])
    tree = TreeAttention(
        paged, paged.cache.k, paged.cache.v, [(slice(0, 4), context_slots, tree_attention_mask(parents))]
    )
    context = tree.verify_context(16)
    assert context.row.tolist() == slots and context.rows.tolist() == context_slots.tolist() + slots
    assert context.visible.tolist() == [[True] * 6 + row for row in tree_attention_mask(parents).tolist()], (
        "the tree's nodes see all of the context and their own path"
    )
    assert context.keys.shape == (3, 32, 2, 8)
    assert tree.verify_context(3) is None, "a tree of more nodes than asked for"
    shared = _paged_step(blocks, length, slots, sequences=2)
    in_a_batch = TreeAttention(
        shared, shared.cache.k, shared.cache.v, [(slice(0, 4), context_slots, tree_attention_mask(parents))]
    )
    assert in_a_batch.verify_context(16) is None, "a tree sharing its step with another sequence"


@needs_compiler
def test_verify_steps_run_through_the_layers_with_the_same_tokens(tiny_folder):
    """n-gram drafts verified through the layers without module calls (the verify attention compiled where
    it measures faster): the modules' greedy tokens, and the layers served verify passes of several rows."""
    llm = LLM(
        model=str(tiny_folder), device="cpu", dtype="float32", skip_tokenizer_init=True, max_model_len=256,
        speculative="ngram", num_speculative_tokens=3,
    )  # fmt: skip
    model, config = llm.engine.model, llm.engine.model.config
    heads = (config.num_heads, config.num_kv_heads, config.head_dim)
    cache_dtype = llm.engine.runner.cache.k.dtype
    layers = DecodeLayers(
        model,
        compiled_attention(*heads, torch.float32, cache_dtype)[0],
        verify_attention(*heads, torch.float32, cache_dtype),
    )
    served, rows_context = [], layers.rows_context
    layers.rows_context = lambda *args: (lambda got: served.append(got is not None) or got)(
        rows_context(*args)
    )
    repeating = [[5, 17, 3, 88] * 4, [42, 9, 42, 9, 42, 9]]
    expected, got = _modules_then(Counting(layers), llm, repeating)
    assert got == expected
    assert sum(served) > 5, f"the layers served {sum(served)} steps of several rows"
    llm.shutdown()
