"""The EAGLE draft head (Li et al., 2024): draft from the target's own features, not from tokens alone.

The target's feature ``f_i`` (its last hidden state after the final norm: what the LM head reads) holds
nearly everything needed to predict ``f_{i+1}``, once the token actually sampled at ``i + 1`` is known.
The head learns that step with one decoder layer:

    pair i = (f_i, token_{i+1})  at position i
    h_i    = DecoderLayer(fc([f_i ; embed(token_{i+1})]))      ≈ f_{i+1}
    draft  = softmax(h_i @ lm_head[draft_vocab].T)             the token at i + 2

``embed`` and ``lm_head`` are the target's own, frozen. Drafting continues from its own ``h`` in place of
the missing target features. The LM head is the expensive part for a small model (49152 x 576 here,
more than the decoder layer), so the head drafts over a reduced vocabulary: the most frequent tokens of
its training data (as EAGLE-3 and FR-Spec do); a token outside it is never drafted, only ever emitted
by the target itself.

The head keeps its own small KV cache (``DraftKV``), one contiguous tensor pair per sequence.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from torch import nn

from ..kernels.cpu_linear import fastest_linear, use_fastest_linears
from ..model.config import ModelConfig
from ..model.llama import Attend, DecoderLayer, LlamaModel, use_layer_ops
from ..paths import DATA_DIR
from .tree import masked_attention

SPEC_DIR = DATA_DIR / "spec"
HEAD_PATH = SPEC_DIR / "eagle_head.safetensors"


class EagleHead(nn.Module):
    """fc ``[2H -> H]`` and one decoder layer; the target's embedding and LM head are attached, not owned.

    ``draft_vocab`` ``[Vd]``: target token ids the head may draft, most frequent first; ``use_vocab(n)``
    drafts over the first ``n`` (None: the target's whole vocabulary).
    """

    def __init__(self, config: ModelConfig, draft_vocab: torch.Tensor):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=True)
        self.layer = DecoderLayer(config, 0)
        self.register_buffer("draft_vocab", draft_vocab.long())
        self.embed_weight: torch.Tensor | None = None
        self.lm_head_weight: torch.Tensor | None = None
        self.vocab_ids: torch.Tensor | None = None  # the token ids the draft's logits index
        self.vocab_rows: torch.Tensor | None = None  # lm_head rows of vocab_ids
        # Inference on a CPU (``load_head``): the draft's vocabulary projection through the matrix product
        # measured fastest for its shape (``kernels/cpu_linear.py``). Made by ``use_vocab``, never saved.
        self.cpu_paths = False
        self.vocab_linear: nn.Module | None = None
        self.rope_cos: torch.Tensor | None = None
        self.rope_sin: torch.Tensor | None = None

    def attach(self, target: LlamaModel) -> EagleHead:
        """Borrow the target's frozen embedding, LM head and RoPE tables. Raises ValueError if the head
        was trained for a model of another shape."""
        config = target.config
        mine = self.config
        if (mine.hidden_size, mine.num_heads, mine.num_kv_heads, mine.head_dim) != (
            config.hidden_size,
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
        ):
            raise ValueError(
                f"the EAGLE head does not fit the model: head hidden/heads/kv heads/head dim "
                f"{mine.hidden_size}/{mine.num_heads}/{mine.num_kv_heads}/{mine.head_dim}, model "
                f"{config.hidden_size}/{config.num_heads}/{config.num_kv_heads}/{config.head_dim}"
            )
        if int(self.draft_vocab.max()) >= config.vocab_size:
            raise ValueError(
                f"the EAGLE head does not fit the model: its draft vocabulary holds token id "
                f"{int(self.draft_vocab.max())}, the model's vocabulary has {config.vocab_size}"
            )
        # A quantized target (Lesson 6) keeps its LM head packed: the head reads it dequantized, once, and a
        # tied embedding that reads the same packed table shares that copy.
        lm_head, embed = target.lm_head, target.embed_tokens
        self.lm_head_weight = (
            lm_head.dequantize() if hasattr(lm_head, "dequantize") else lm_head.weight
        ).detach()
        tied = getattr(embed, "table", None) is lm_head
        self.embed_weight = self.lm_head_weight if tied else embed.weight.detach()
        self.rope_cos, self.rope_sin = target.rope_cos, target.rope_sin
        self.use_vocab(len(self.draft_vocab))
        return self

    def use_vocab(self, size: int | None) -> None:
        """Draft over the ``size`` most frequent tokens of the training data,
        or the full vocabulary (None)."""
        if self.lm_head_weight is None:
            raise RuntimeError("attach(target) the head before choosing its vocabulary")
        self.vocab_ids, self.vocab_rows = vocab_slice(self.lm_head_weight, self.draft_vocab, size)
        self.vocab_linear = fastest_linear(self.vocab_rows) if self.cpu_paths else None

    def forward(
        self, features: torch.Tensor, next_token_ids: torch.Tensor, positions: torch.Tensor, attend: Attend
    ) -> torch.Tensor:
        """Pairs ``(features [T, H], next_token_ids [T])`` at
        ``positions [T]`` -> predicted next features ``[T, H]``."""
        x = self.fc(torch.cat([features, self.embed_weight[next_token_ids]], dim=-1))
        hidden, residual = self.layer(x, None, self.rope_cos[positions], self.rope_sin[positions], attend)
        return hidden + residual

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits ``[T, len(vocab_ids)]`` over the draft vocabulary."""
        logits = self.vocab_linear(hidden) if self.vocab_linear is not None else hidden @ self.vocab_rows.T
        return logits.float()


def target_features(model: LlamaModel, hidden: torch.Tensor) -> torch.Tensor:
    """The feature EAGLE reads: the target's hidden state after its final norm, i.e. the LM head's input."""
    return model.norm(hidden)


class DraftKV:
    """The head's KV cache: per sequence, K and V ``[length, Hkv, D]``,
    grown by appending, cut by ``truncate``."""

    def __init__(self) -> None:
        self.keys: dict[str, torch.Tensor] = {}
        self.values: dict[str, torch.Tensor] = {}

    def length(self, seq_id: str) -> int:
        return self.keys[seq_id].shape[0] if seq_id in self.keys else 0

    def truncate(self, seq_id: str, length: int) -> None:
        if seq_id in self.keys:
            self.keys[seq_id] = self.keys[seq_id][:length]
            self.values[seq_id] = self.values[seq_id][:length]

    def keep(self, seq_id: str, rows: list[int]) -> None:
        """Keep only the entries at ``rows``, in that order
        (a tree's accepted path, moved behind its context)."""
        index = torch.tensor(rows, dtype=torch.long, device=self.keys[seq_id].device)
        self.keys[seq_id] = self.keys[seq_id].index_select(0, index)
        self.values[seq_id] = self.values[seq_id].index_select(0, index)

    def free(self, seq_id: str) -> None:
        self.keys.pop(seq_id, None)
        self.values.pop(seq_id, None)

    def attend(
        self, seq_ids: list[str], query_lens: list[int], masks: list[torch.Tensor | None] | None = None
    ) -> Attend:
        """An ``Attend`` for one head forward: sequence ``b`` owns the next ``query_lens[b]`` query rows.

        Its new K/V are appended; a query sees the sequence's earlier entries and, among the new ones,
        the causal prefix; or, when given, what ``masks[b]`` ``[q_len, earlier + q_len]`` allows (a tree).
        """
        masks = masks or [None] * len(seq_ids)

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            outs, start = [], 0
            for seq_id, q_len, mask in zip(seq_ids, query_lens, masks):
                rows = slice(start, start + q_len)
                start += q_len
                keys = torch.cat([self.keys[seq_id], k[rows]]) if seq_id in self.keys else k[rows]
                values = torch.cat([self.values[seq_id], v[rows]]) if seq_id in self.values else v[rows]
                self.keys[seq_id], self.values[seq_id] = keys, values
                if mask is None:  # causal: query i sees every earlier entry and the new ones up to itself
                    past = keys.shape[0] - q_len
                    mask = torch.ones(q_len, past + q_len, dtype=torch.bool, device=q.device).tril(past)
                outs.append(masked_attention(q[rows], keys, values, mask))
            return torch.cat(outs)

        return attend


def most_frequent_tokens(token_lists: list[list[int]], size: int) -> torch.Tensor:
    """The ``size`` most frequent token ids across ``token_lists``, most frequent first (ties: lower id)."""
    counts = torch.bincount(torch.tensor([t for ids in token_lists for t in ids], dtype=torch.long))
    order = sorted(range(len(counts)), key=lambda t: (-int(counts[t]), t))
    return torch.tensor([t for t in order if counts[t] > 0][:size], dtype=torch.long)


def sha256_of(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def vocab_slice(
    lm_head_weight: torch.Tensor, draft_vocab: torch.Tensor, size: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft vocabulary's token ids and their LM-head rows: the ``size`` most frequent tokens of the
    training data (``draft_vocab`` is sorted by frequency), or the whole vocabulary (None)."""
    if size is None:
        return torch.arange(lm_head_weight.shape[0], device=lm_head_weight.device), lm_head_weight
    if not 1 <= size <= len(draft_vocab):
        raise ValueError(f"draft vocabulary size must be in [1, {len(draft_vocab)}] or None, got {size}")
    ids = draft_vocab[:size].to(lm_head_weight.device)
    return ids, lm_head_weight[ids].contiguous()


def save_head(head: EagleHead, path: str | Path, metadata: dict[str, str]) -> str:
    """Write the head's own weights in float16 plus its draft vocabulary; returns the file's sha256."""
    from safetensors.torch import save_file

    tensors = {name: t.detach().to(torch.float16).contiguous() for name, t in head.state_dict().items()}
    tensors["draft_vocab"] = head.draft_vocab.to(torch.int32).contiguous()
    config = head.config
    shape = {
        "hidden_size": config.hidden_size,
        "num_heads": config.num_heads,
        "num_kv_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.intermediate_size,
    }
    save_file(tensors, str(path), metadata={**{k: str(v) for k, v in shape.items()}, **metadata})
    return sha256_of(path)


def load_head(target: LlamaModel, path: str | Path = HEAD_PATH) -> EagleHead:
    """Load a saved head onto ``target`` (in the target's device and dtype) and attach it, for inference: its
    decoder layer runs the target's layer ops (the fused kernels the engine chose), and on a CPU its linears
    run the paths measured fastest there (``kernels/cpu_linear.py``).
    To train, make a fresh ``EagleHead``.

    Raises FileNotFoundError if there is no file, ValueError if the head does not fit the model.
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no EAGLE head at {path}: train one with `python -m solutions train-eagle`")
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    config = target.config
    fields = ("hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size")
    saved = {name: int(meta[name]) for name in fields if name in meta}
    wanted = {name: getattr(config, name) for name in fields}
    if saved != wanted:
        raise ValueError(f"the EAGLE head at {path} does not fit the model: head {saved}, model {wanted}")
    head = EagleHead(config, tensors.pop("draft_vocab").long())
    device, dtype = target.norm.weight.device, target.norm.weight.dtype
    missing, unexpected = head.load_state_dict({k: v.to(dtype) for k, v in tensors.items()}, strict=False)
    if set(missing) != {"draft_vocab"} or unexpected:
        raise ValueError(f"the EAGLE head at {path} does not fit: missing {missing}, unexpected {unexpected}")
    head = head.to(device=device, dtype=dtype).eval().requires_grad_(False).attach(target)
    use_layer_ops(head, target.ops)  # its layer's chains run as the target's do (fused where they pay)
    if device.type == "cpu":  # inference only: fc, the layer's linears and (from use_vocab on) the draft's
        use_fastest_linears(head)  # vocabulary projection take the paths measured fastest here
        head.cpu_paths = True
    # The vocabulary it was trained to draft over (the file ranks more tokens).
    head.use_vocab(min(int(meta.get("draft_vocab_size", len(head.draft_vocab))), len(head.draft_vocab)))
    return head
