"""Paged KV kernels (Lab 2): ``store_kv`` and ``paged_attention`` against float64 references, compiled on a
GPU and through the Triton interpreter on CPU (``kernel_device.KERNEL_DEVICE``).

Every batch is laid out the way the engine lays it out: blocks handed out in shuffled order (block 0 is the
null block), block tables padded with 0, the last block of a sequence partly full. Every cache row that holds
no live token is NaN, so a kernel that reads a row it must not read (past a sequence's end, or through a
padding entry of its block table) puts NaN into the output. (The torch path, which gathers whole blocks and
masks, is tested with large finite values there instead.)
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from kernel_device import KERNEL_DEVICE

from solutions.kernels.reference import reference_paged_attention, reference_store_kv

pytestmark = pytest.mark.lab2

DEVICE = KERNEL_DEVICE
# Relative error bounds: fp32 is near exact on both devices (its tl.dot runs in IEEE float32, not TF32); half
# types round P to 8 or 11 mantissa bits before P @ V.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}
WRONG_ROWS = (
    "position p's K/V live at block_table[b, p // block_size], offset p % block_size; "
    "check the block-table walk and the bottom-right causal alignment (queries are the LAST q_len positions)"
)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    return ((out - ref).norm() / ref.norm()).item()


@dataclass
class PagedBatch:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor

    def args(self) -> tuple[torch.Tensor, ...]:
        return self.q, self.k_cache, self.v_cache, self.block_table, self.query_start_loc, self.seq_lens

    def lengths(self) -> dict[str, int]:
        q_lens = self.query_start_loc.diff()
        return {"max_query_len": int(q_lens.max()), "max_seq_len": int(self.seq_lens.max())}


def paged_batch(
    seq_lens: list[int],
    q_lens: list[int],
    *,
    block_size: int = 16,
    q_heads: int = 9,
    kv_heads: int = 3,
    head_dim: int = 64,
    dtype: torch.dtype = torch.float32,
    device: str = DEVICE,
    stale: float = float("nan"),
    consecutive: bool = False,
) -> PagedBatch:
    """Random queries and caches for sequences of ``seq_lens`` tokens whose last ``q_lens`` are queries; cache
    rows that hold no token are ``stale``. Blocks are handed out in random order, or in order
    (``consecutive``, as a fresh engine's allocator does)."""
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3  # the null block 0 and two never handed out
    physical = list(range(1, num_blocks)) if consecutive else (torch.randperm(num_blocks - 1) + 1).tolist()
    block_table = torch.zeros(len(seq_lens), max(blocks_per_seq) + 1, dtype=torch.int32)
    k_cache, v_cache = torch.full((2, num_blocks, block_size, kv_heads, head_dim), stale, dtype=dtype)
    for b, (n, n_blocks) in enumerate(zip(seq_lens, blocks_per_seq)):
        block_table[b, :n_blocks] = torch.tensor(physical[:n_blocks], dtype=torch.int32)
        physical = physical[n_blocks:]
        for p in range(n):
            row = int(block_table[b, p // block_size]), p % block_size
            k_cache[row], v_cache[row] = torch.randn(2, kv_heads, head_dim, dtype=dtype)
    query_start_loc = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(q_lens), q_heads, head_dim, dtype=dtype)
    seq_lens = torch.tensor(seq_lens, dtype=torch.int32)
    return PagedBatch(*(t.to(device) for t in (q, k_cache, v_cache, block_table, query_start_loc, seq_lens)))


def reference(batch: PagedBatch, **kwargs) -> torch.Tensor:
    return reference_paged_attention(*(t.cpu() for t in batch.args()), **kwargs)


def check_against_reference(out: torch.Tensor, batch: PagedBatch, dtype: torch.dtype) -> float:
    assert out.shape == batch.q.shape and out.dtype == dtype, (
        f"output must be [T, Hq, D] {dtype}, got {out.shape}"
    )
    assert torch.isfinite(out).all(), (
        "NaN/inf in the output: the kernel read a cache row that holds none of the sequence's tokens (every "
        "such row is NaN here): a wrong block or offset in the block-table walk (position p: block_table[b, "
        "p // block_size], offset p % block_size), or a load past the sequence's end left unmasked"
    )
    error = rel_err(out.cpu(), reference(batch))
    assert error < TOLERANCE[dtype], f"relative error {error:.2e}: {WRONG_ROWS}"
    return error


@pytest.fixture
def pa(load):
    return load("kernels.paged_attention")


@pytest.fixture
def skv(load):
    return load("kernels.store_kv")


# Decode: odd context lengths, last blocks partly full, a context of one token, GQA ratio 3, several splits
# (short sequences leave some splits empty).
@pytest.mark.parametrize(
    "dtype, block_size, num_splits",
    [
        (torch.float32, 16, 1),
        (torch.float32, 32, 4),
        (torch.float16, 16, 3),
        (torch.bfloat16, 16, 5),
    ],
)
def test_decode_matches_reference(pa, dtype, block_size, num_splits):
    batch = paged_batch([37, 1, 70, 16], [1, 1, 1, 1], block_size=block_size, dtype=dtype)
    out = pa.paged_attention(*batch.args(), **batch.lengths(), num_splits=num_splits)
    check_against_reference(out, batch, dtype)


@pytest.mark.parametrize("q_heads, kv_heads, head_dim", [(4, 4, 32), (6, 2, 128), (9, 3, 32), (4, 2, 16)])
def test_decode_head_dims_and_groups(pa, q_heads, kv_heads, head_dim):
    batch = paged_batch([21, 50], [1, 1], q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim)
    out = pa.paged_attention(*batch.args(), **batch.lengths(), num_splits=2)
    check_against_reference(out, batch, torch.float32)


def test_long_context_is_split_and_merged(pa):
    """A context past the interpreter's split length runs as several programs merged by log-sum-exp."""
    batch = paged_batch([1100, 9], [1, 1], q_heads=3, kv_heads=1, head_dim=32, block_size=32)
    assert pa.decode_num_splits(2, 1, 1100, batch.q.device) > 1
    check_against_reference(pa.paged_attention(*batch.args(), **batch.lengths()), batch, torch.float32)


def test_graph_bucket_decode_with_padding_rows(pa):
    """A decode as a CUDA graph replays it: the splits and max_seq_len fixed for the engine's max_model_len
    (far above this batch's contexts), and two padding rows (seq_len 0, block table all null block 0, whose
    rows are NaN here): the real rows match the reference, the padding rows come out exactly 0."""
    batch = paged_batch([37, 0, 70, 5, 0], [1, 1, 1, 1, 1], q_heads=6, kv_heads=2)
    max_model_len = 2048
    splits = pa.decode_num_splits(5, 2, max_model_len, batch.q.device)
    assert splits > 1, "the interpreter splits a 2048-token capacity too"
    out = pa.paged_attention(*batch.args(), max_query_len=1, max_seq_len=max_model_len, num_splits=splits)
    check_against_reference(out, batch, torch.float32)
    assert not out[[1, 4]].any(), "a padding row (seq_len 0) must output zeros and read no cache row"
    prefill = pa.paged_attention(*batch.args(), max_query_len=2, max_seq_len=max_model_len)
    check_against_reference(prefill, batch, torch.float32)
    assert not prefill[[1, 4]].any(), "the prefill kernel must also give a padding row zeros"


def test_decode_num_splits_fills_the_gpu(pa, monkeypatch):
    """On a GPU (its SM count stubbed here, so this runs anywhere): enough (sequence, KV head, split) programs
    for every SM when the context allows it, each reading at least MIN_SPLIT_LEN positions, at most
    MAX_SPLITS."""
    monkeypatch.setattr(pa, "_sm_count", lambda index: 132)
    gpu = torch.device("cuda", 0)
    shapes = [(1, 3, 8192), (1, 32, 2048), (16, 3, 2048), (64, 3, 512), (256, 8, 8192)]
    for batch, kv_heads, context in shapes:
        splits = pa.decode_num_splits(batch, kv_heads, context, gpu)
        assert 1 <= splits <= pa.MAX_SPLITS and splits <= -(-context // pa.MIN_SPLIT_LEN)
        programs = batch * kv_heads * splits
        fills = programs >= pa.PROGRAMS_PER_SM * 132
        assert fills or splits in (pa.MAX_SPLITS, -(-context // pa.MIN_SPLIT_LEN)), (
            f"batch {batch} x {kv_heads} KV heads at {context} tokens: {splits} splits leave SMs idle"
        )
    assert pa.decode_num_splits(1, 3, 100, gpu) == 1, "a context under MIN_SPLIT_LEN needs no split"


@pytest.mark.interpreter
def test_the_interpreter_never_autotunes(pa, load, monkeypatch):
    """Timing means nothing in the interpreter: every kernel runs its fixed interpreter configuration."""
    fa = load("kernels.flash_attention")
    for tuned in (pa._paged_decode_tuned, pa._paged_prefill_tuned, fa._flash_fwd_tuned):
        monkeypatch.setattr(tuned, "autotuned", None)  # calling it would fail
    for q_lens in ([1, 4], [1, 1]):  # a mixed step (the prefill kernel), then decodes
        batch = paged_batch([20, 33], q_lens, q_heads=3, kv_heads=1)
        pa.paged_attention(*batch.args(), **batch.lengths())
    fa.flash_attention(*torch.randn(3, 1, 1, 5, 32).unbind(0), causal=True)
    pa.tune_decode(batch.k_cache, batch.v_cache, batch=2, max_seq_len=64, num_splits=2, q_heads=3)


def test_tuned_launch_path_keys_and_refuses_an_untuned_capture(pa, load, monkeypatch):
    """The CUDA launch path, here on CPU tensors: the autotuner gets the call without tuned meta-parameters,
    a key (the key arguments, bucketed, and the tensors' dtypes) is recorded, and while a graph is being
    captured a key never seen is refused with the warm-up that would tune it, a seen one runs."""
    tuning = load("kernels.tuning")
    launches = []

    class Autotuner:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append((grid({"BLOCK_N": 64}), kwargs))

    monkeypatch.setattr(tuning, "autotunes_on", lambda device: True)
    monkeypatch.setattr(pa._paged_decode_tuned, "autotuned", Autotuner())
    monkeypatch.setattr(pa._paged_decode_tuned, "tuned_keys", set())
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    batch = paged_batch([40, 7], [1, 1], q_heads=6, kv_heads=2, device="cpu")
    decode = {"max_query_len": 1, "num_splits": 1}  # one split: no merge kernel after the (fake) launch
    pa.paged_attention(*batch.args(), max_seq_len=512, **decode)
    (grid, kwargs), key = launches[0], next(iter(pa._paged_decode_tuned.tuned_keys))
    assert grid == (2, 2, 1) and "BLOCK_N" not in kwargs and "num_warps" not in kwargs
    assert key[:4] == (64, 4, 16, False) and "torch.float32" in key, f"key {key}: D, BLOCK_H, block, split"
    capturing[0] = True
    pa.paged_attention(*batch.args(), max_seq_len=512, **decode)  # tuned: runs
    with pytest.raises(RuntimeError, match="tune_decode"):
        pa.paged_attention(*batch.args(), max_seq_len=4096, **decode)
    assert len(launches) == 2
    monkeypatch.setenv("FASTMODE_AUTOTUNE", "0")  # the first fitting candidate, untimed, and no capture check
    here = paged_batch([40, 7], [1, 1], q_heads=6, kv_heads=2)  # a real launch: on the kernel device
    check_against_reference(pa.paged_attention(*here.args(), max_seq_len=4096, **decode), here, torch.float32)
    assert len(launches) == 2, "FASTMODE_AUTOTUNE=0 must not reach the autotuner"


@pytest.mark.requires_cuda
def test_tuned_decode_is_captured_and_replayed_in_a_cuda_graph(pa, monkeypatch):
    """tune_decode tunes a bucket before capture; the captured decode then replays new inputs (new queries,
    shorter contexts) as an eager call computes them. A bucket never tuned is refused during capture."""
    monkeypatch.setenv("FASTMODE_AUTOTUNE", "1")
    batch = paged_batch([37, 1, 70, 0], [1, 1, 1, 1])
    max_model_len = 512
    splits = pa.decode_num_splits(4, 3, max_model_len, batch.q.device)
    bucket = {"max_seq_len": max_model_len, "num_splits": splits}
    pa.tune_decode(batch.k_cache, batch.v_cache, batch=4, q_heads=9, **bucket)

    def decode():
        return pa.paged_attention(*batch.args(), max_query_len=1, **bucket)

    decode()  # the eager warm-up an engine runs: compiles for these exact arguments
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = decode()
    batch.q.copy_(torch.randn_like(batch.q))
    batch.seq_lens.copy_(torch.tensor([30, 1, 70, 0], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    check_against_reference(out, batch, torch.float32)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="tune_decode"):
        pa.paged_attention(*batch.args(), max_query_len=1, max_seq_len=max_model_len, num_splits=splits + 1)


# Prefill and mixed steps: two decodes, a first chunk (no cache before it), a later chunk over a cached
# prefix longer than its queries, and a prefix-cache hit (many cached tokens, three new queries).
@pytest.mark.parametrize(
    "dtype, block_size", [(torch.float32, 16), (torch.float16, 32), (torch.bfloat16, 16)]
)
def test_prefill_and_mixed_batch_match_reference(pa, dtype, block_size):
    batch = paged_batch(
        [29, 19, 45, 67, 1], [1, 19, 7, 3, 1], block_size=block_size, q_heads=6, kv_heads=2, dtype=dtype
    )
    check_against_reference(pa.paged_attention(*batch.args(), **batch.lengths()), batch, dtype)


def test_prefill_head_dim_16(pa):
    """The smallest head dim a tensor-core product takes (the engine tests' tiny model has it)."""
    batch = paged_batch([40, 23], [17, 23], q_heads=4, kv_heads=2, head_dim=16)
    check_against_reference(pa.paged_attention(*batch.args(), **batch.lengths()), batch, torch.float32)


def test_prefill_head_dim_128_and_scale(pa):
    batch = paged_batch([40, 23], [17, 23], q_heads=4, kv_heads=2, head_dim=128)
    out = pa.paged_attention(*batch.args(), **batch.lengths(), sm_scale=0.3)
    error = rel_err(out.cpu(), reference(batch, sm_scale=0.3))
    if not error < TOLERANCE[torch.float32]:
        ignored = (
            rel_err(out.cpu(), reference(batch)) < TOLERANCE[torch.float32]
        )  # right for D ** -0.5 instead
        likely = (
            "sm_scale is ignored: the scores must use it in place of D ** -0.5" if ignored else WRONG_ROWS
        )
        raise AssertionError(f"relative error {error:.2e} with sm_scale=0.3: {likely}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "seq_lens, q_lens",
    [
        ([37, 1, 70, 16], [1, 1, 1, 1]),
        ([29, 19, 45, 67, 1], [1, 19, 7, 3, 1]),
        ([12, 50, 33], [1, 1, 33]),
        ([5, 90, 33, 17, 64, 2, 48, 71, 16, 40, 9, 33], [1] * 12),
        ([44, 3, 81, 16, 16, 16, 16, 27, 60], [1] * 8 + [12]),
    ],
)
def test_torch_path_matches_reference(load, seq_lens, q_lens, dtype):
    """The CPU path (``kernels.paged_torch.paged_attention_torch``) on the same layouts: decodes only, a mixed
    step with a decode after the prefills, decodes first then a whole prompt, many decodes of mixed lengths
    (attended in length buckets), with and without a prefill after them. Stale rows are large finite garbage:
    it gathers whole blocks and relies on the mask (a NaN there would reach the output through 0 * NaN)."""
    torch_path = load("kernels.paged_torch")
    batch = paged_batch(seq_lens, q_lens, block_size=16, q_heads=9, kv_heads=3, dtype=dtype, stale=1e4)
    out = torch_path.paged_attention_torch(*batch.args(), **batch.lengths())
    check_against_reference(out, batch, dtype)


@pytest.mark.parametrize("seq_lens, q_lens", [([70], [1]), ([45], [45]), ([67], [19]), ([33, 70], [1, 1])])
def test_torch_path_reads_consecutive_blocks_in_place(load, seq_lens, q_lens):
    """A lone sequence whose blocks are consecutive in the cache is read as a view, not gathered: one decode,
    a whole prompt, a prompt's later chunk (and two decodes, which are gathered), against the reference."""
    torch_path = load("kernels.paged_torch")
    batch = paged_batch(seq_lens, q_lens, block_size=16, q_heads=9, kv_heads=3, stale=1e4, consecutive=True)
    out = torch_path.paged_attention_torch(*batch.args(), **batch.lengths())
    check_against_reference(out, batch, torch.float32)


def test_decode_and_prefill_kernels_agree_on_decodes(pa):
    """The same one-query sequences through both kernels (a max_query_len above 1 selects the prefill one)."""
    batch = paged_batch([33, 5, 64], [1, 1, 1], q_heads=3, kv_heads=1)
    lengths = batch.lengths()
    decode = pa.paged_attention(*batch.args(), **lengths, num_splits=3)
    prefill = pa.paged_attention(*batch.args(), max_query_len=2, max_seq_len=lengths["max_seq_len"])
    error = rel_err(decode, prefill.double())
    assert error < TOLERANCE[torch.float32], (
        "the decode and prefill kernels differ on the same decodes "
        f"(relative error {error:.2e}): {WRONG_ROWS}"
    )


def nan_filled(allocate):
    def allocate_poisoned(*args, **kwargs):
        t = allocate(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    return allocate_poisoned


def test_poisoned_outputs_are_overwritten(pa, monkeypatch):
    """Every output row and every split's partial result must be written: NaN-filled buffers expose misses."""
    for name in ("empty", "empty_like"):
        monkeypatch.setattr(torch, name, nan_filled(getattr(torch, name)))
    decode = paged_batch([3, 40], [1, 1], q_heads=6, kv_heads=2)
    out = pa.paged_attention(*decode.args(), **decode.lengths(), num_splits=4)
    if not torch.isfinite(out).all():
        monkeypatch.undo()  # without poisoned buffers: is the NaN read from the cache instead?
        read = not torch.isfinite(pa.paged_attention(*decode.args(), **decode.lengths(), num_splits=4)).all()
        raise AssertionError(
            f"NaN in the output even from unpoisoned buffers: {WRONG_ROWS}"
            if read
            else "a decode split or output row was left unwritten (or an empty split got weight)"
        )
    mixed = paged_batch([18, 20], [1, 20], q_heads=6, kv_heads=2)
    out = pa.paged_attention(*mixed.args(), **mixed.lengths())
    assert torch.isfinite(out).all(), "a prefill output row was left unwritten (rows past a tile edge?)"


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda b: {"block_table": b.block_table.long()}, "int32"),
        (lambda b: {"seq_lens": torch.tensor([2, 9], dtype=torch.int32)}, "more queries than tokens"),
        (lambda b: {"block_table": b.block_table[:, :1]}, "needs 2 blocks"),
        (lambda b: {"k_cache": b.k_cache.half()}, "dtype"),
        (lambda b: {"q": b.q[:, :4]}, "multiple"),
        (lambda b: {"query_start_loc": torch.tensor([0, 3, 5], dtype=torch.int32)}, "rise from 0"),
    ],
)
def test_clear_errors(pa, change, match):
    batch = paged_batch([20, 9], [3, 1], device="cpu")  # lengths are checked on CPU only
    args = dict(zip(["q", "k_cache", "v_cache", "block_table", "query_start_loc", "seq_lens"], batch.args()))
    args.update(change(batch))
    with pytest.raises(ValueError, match=match):
        pa.paged_attention(*args.values(), max_query_len=3, max_seq_len=20)


@pytest.mark.parametrize("impl", ["store_kv", "store_kv_torch"])
@pytest.mark.parametrize(
    "dtype, block_size, slot_dtype",
    [(torch.float32, 16, torch.int64), (torch.bfloat16, 32, torch.int32), (torch.float16, 16, torch.int32)],
)
def test_store_kv_writes_exactly_its_slots(skv, load, impl, dtype, block_size, slot_dtype):
    num_blocks, kv_heads, head_dim, tokens = 5, 3, 64, 11
    caches = torch.full((2, num_blocks, block_size, kv_heads, head_dim), float("nan"), dtype=dtype)
    slots = torch.randperm(num_blocks * block_size)[:tokens].to(slot_dtype)
    slots[[2, 7]] = -1  # padding tokens: no cache row
    k, v = torch.randn(2, tokens, kv_heads, head_dim, dtype=dtype)
    k_ref, v_ref = reference_store_kv(k, v, *caches, slots)
    k_cache, v_cache, k, v, slots = (t.to(DEVICE) for t in (*caches, k, v, slots))
    store = skv.store_kv if impl == "store_kv" else load("kernels.paged_torch").store_kv_torch
    store(k, v, k_cache, v_cache, slots)
    for name, got, want in (("k_cache", k_cache, k_ref), ("v_cache", v_cache, v_ref)):
        written = torch.isfinite(got).flatten(2).all(-1)
        assert written.sum() == tokens - 2, (
            f"{name}: {int(written.sum())} rows written for {tokens - 2} tokens with a slot (negative slots "
            "must be skipped; a row is block = slot // block_size, offset = slot % block_size)"
        )
        assert torch.equal(got.cpu().nan_to_num(7.0), want.nan_to_num(7.0)), (
            f"{name}: a token's K/V landed in the wrong row"
        )


def test_store_kv_casts_to_the_cache_dtype_and_checks_slots(skv):
    k_cache, v_cache = torch.zeros(2, 2, 16, 1, 32, dtype=torch.float16, device=DEVICE)
    k, v = torch.randn(2, 3, 1, 32, device=DEVICE)
    skv.store_kv(k, v, k_cache, v_cache, torch.tensor([0, 17, 31], device=DEVICE))
    assert torch.equal(k_cache[1, 1, 0], k[1, 0].half()) and torch.equal(v_cache[1, 15, 0], v[2, 0].half())
    k_cache, v_cache, k, v = (
        t.cpu() for t in (k_cache, v_cache, k, v)
    )  # slot values are checked on CPU only
    with pytest.raises(ValueError, match="past the cache's last row"):
        skv.store_kv(k, v, k_cache, v_cache, torch.tensor([0, 1, 32]))
    with pytest.raises(ValueError, match="one slot per token"):
        skv.store_kv(k, v, k_cache, v_cache, torch.tensor([0, 1]))


def test_gpu_benchmark_code_runs_through_the_interpreter(load):
    """``bench kv`` calls ``decode_kernel_bandwidth`` on a GPU;
    here the same code runs on a tiny CPU shape."""
    bench = load("bench.paged_attention")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="needs CUDA"):
            bench.decode_kernel_bandwidth()
    figures = bench.decode_kernel_bandwidth(
        batch=2, context=21, q_heads=3, kv_heads=1, device=DEVICE, copy_bytes=1 << 20
    )
    assert figures["bytes"] == (2 * 2 * 21 * 64 + 2 * 2 * 3 * 64) * 2 and figures["gbps"] > 0
    assert figures["rel_err"] < TOLERANCE[torch.bfloat16], (
        "the benchmarked kernel disagrees with the reference"
    )


def test_cpu_step_attention_checks_slots_once_per_step():
    """The engine's CPU ``PagedAttention`` checks the step's slots when it is built, with the same message."""
    from solutions.cache.paged_kv_cache import AttentionMetadata, PagedAttention, PagedKVCache

    cache = PagedKVCache(1, 2, 16, 1, 32, torch.float32, "cpu")
    meta = AttentionMetadata(
        slot_mapping=torch.tensor([31, 32]),
        block_table=torch.tensor([[1, 2]], dtype=torch.int32),
        query_start_loc=torch.tensor([0, 2], dtype=torch.int32),
        seq_lens=torch.tensor([18], dtype=torch.int32),
        max_query_len=2,
        max_seq_len=18,
    )
    with pytest.raises(ValueError, match="slot 32 is past the cache's last row"):
        PagedAttention(cache, meta, backend="torch")


def test_bench_paged_attention_smoke(load, capsys):
    """``bench paged_attention --smoke`` runs the GPU benchmark's code on tiny shapes (interpreter on CPU)."""
    assert load("cli.bench.paged_attention").main(["--smoke"]) == 0
    out = capsys.readouterr().out
    assert "graph ms" in out and "ours/sdpa" in out, "the decode and prefill tables must both print"
