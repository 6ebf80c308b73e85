"""Medusa heads (Cai et al., 2024, Medusa-1): K extra heads on the target's last feature, no draft model.

The target's feature ``f_i`` (its final-norm hidden state at position ``i``, what the LM head reads) already
predicts token ``i + 1`` through the LM head. Head ``k`` (``k = 1 .. K``) learns to predict token
``i + 1 + k`` from the same ``f_i``, through one residual block and the target's own frozen LM head:

    h_k    = SiLU(W_k f_i + b_k) + f_i
    draft  = softmax(h_k @ lm_head[draft_vocab].T)             the token k places after the root

So all K drafts come from one feature in one batched product: unlike an EAGLE head, no head pass waits for
the previous draft. The price is that head ``k`` never sees the tokens drafted before it: it must guess
token ``i + 1 + k`` without knowing tokens ``i + 2 .. i + k``, so later heads are right less often. ``W_k``
starts at zero, so an untrained head ``k`` repeats the LM head's own guess for token ``i + 1``.

Drafts run over a reduced vocabulary (the most frequent tokens of the training data, as the EAGLE head's);
a token outside it is only ever emitted by the target itself.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..model.config import ModelConfig
from ..model.llama import LlamaModel
from .drafter import Draft
from .eagle import SPEC_DIR, sha256_of, vocab_slice
from .tree import DraftTree, grow_tree

MEDUSA_PATH = SPEC_DIR / "medusa_heads.safetensors"


class MedusaHeads(nn.Module):
    """``weight [K, H, H]``, ``bias [K, H]``: head ``k``'s residual block; the target's LM head is attached,
    not owned. ``draft_vocab [Vd]``: token ids the heads may draft, most frequent first; ``use_vocab(n)``
    drafts over the first ``n`` (None: the whole vocabulary)."""

    def __init__(self, config: ModelConfig, num_heads: int, draft_vocab: torch.Tensor):
        super().__init__()
        if num_heads < 1:
            raise ValueError(f"num_heads must be >= 1, got {num_heads}")
        self.config = config
        hidden = config.hidden_size
        self.weight = nn.Parameter(torch.zeros(num_heads, hidden, hidden))
        self.bias = nn.Parameter(torch.zeros(num_heads, hidden))
        self.register_buffer("draft_vocab", draft_vocab.long())
        self.lm_head_weight: torch.Tensor | None = None
        self.vocab_ids: torch.Tensor | None = None  # the token ids the draft's logits index
        self.vocab_rows: torch.Tensor | None = None  # lm_head rows of vocab_ids

    @property
    def num_heads(self) -> int:
        return self.weight.shape[0]

    def attach(self, target: LlamaModel) -> MedusaHeads:
        """Borrow the target's frozen LM head (dequantized once when packed). Raises ValueError if the
        heads were trained for a model of another shape."""
        config = target.config
        if self.config.hidden_size != config.hidden_size or int(self.draft_vocab.max()) >= config.vocab_size:
            raise ValueError(
                f"the Medusa heads do not fit the model: hidden size {self.config.hidden_size} and largest "
                f"draft token id {int(self.draft_vocab.max())}, model hidden size {config.hidden_size} and "
                f"vocabulary {config.vocab_size}"
            )
        lm_head = target.lm_head
        self.lm_head_weight = (
            lm_head.dequantize() if hasattr(lm_head, "dequantize") else lm_head.weight
        ).detach()
        self.use_vocab(len(self.draft_vocab))
        return self

    def use_vocab(self, size: int | None) -> None:
        """Draft over the ``size`` most frequent tokens of the training data, or all of them (None)."""
        if self.lm_head_weight is None:
            raise RuntimeError("attach(target) the heads before choosing their vocabulary")
        self.vocab_ids, self.vocab_rows = vocab_slice(self.lm_head_weight, self.draft_vocab, size)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Features ``[T, H]`` -> every head's hidden state ``[T, K, H]`` (one batched product)."""
        blocks = torch.einsum("th,kgh->tkg", features, self.weight) + self.bias
        return F.silu(blocks) + features[:, None]

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits ``[..., len(vocab_ids)]`` over the draft vocabulary."""
        return (hidden @ self.vocab_rows.T).float()


def save_heads(heads: MedusaHeads, path: str | Path, metadata: dict[str, str]) -> str:
    """Write the heads in float16 plus their draft vocabulary (int32); returns the file's sha256."""
    from safetensors.torch import save_file

    tensors = {
        "weight": heads.weight.detach().to(torch.float16).contiguous(),
        "bias": heads.bias.detach().to(torch.float16).contiguous(),
        "draft_vocab": heads.draft_vocab.to(torch.int32).contiguous(),
    }
    save_file(tensors, str(path), metadata={"hidden_size": str(heads.config.hidden_size), **metadata})
    return sha256_of(path)


def load_heads(target: LlamaModel, path: str | Path = MEDUSA_PATH) -> MedusaHeads:
    """Load saved heads onto ``target`` (its device and dtype) for inference, attached to its LM head.

    Raises FileNotFoundError if there is no file, ValueError if the heads do not fit the model.
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"no Medusa heads at {path}: train them with `python -m solutions train-medusa`"
        )
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    if set(tensors) != {"weight", "bias", "draft_vocab"}:
        raise ValueError(f"the Medusa heads at {path} hold {sorted(tensors)}, not weight, bias, draft_vocab")
    if int(meta.get("hidden_size", -1)) != target.config.hidden_size:
        raise ValueError(
            f"the Medusa heads at {path} do not fit the model: hidden size {meta.get('hidden_size')}, "
            f"model {target.config.hidden_size}"
        )
    heads = MedusaHeads(target.config, tensors["weight"].shape[0], tensors["draft_vocab"].long())
    device, dtype = target.norm.weight.device, target.norm.weight.dtype
    with torch.no_grad():
        heads.weight.copy_(tensors["weight"].to(dtype))
        heads.bias.copy_(tensors["bias"].to(dtype))
    heads = heads.to(device=device, dtype=dtype).eval().requires_grad_(False).attach(target)
    heads.use_vocab(min(int(meta.get("draft_vocab_size", len(heads.draft_vocab))), len(heads.draft_vocab)))
    return heads


class MedusaDrafter:
    """Chains (``propose``: each head's argmax, or a sample for a sampled request) and trees
    (``propose_tree``: the heads' top-k combined, most probable paths kept) from ``MedusaHeads``.

    Per request it keeps the target's newest feature and its position. Invariant when ready: that position
    is ``num_computed - 1``, the one just before the root (the newest token, its K/V not computed yet), so
    head ``k``'s guess is the token ``k`` places after the root.
    """

    needs_features = True

    def __init__(self, heads: MedusaHeads, num_tokens: int, tree_depth: int = 0, tree_top_k: int = 4):
        if not 1 <= num_tokens <= heads.num_heads or tree_depth > heads.num_heads:
            raise ValueError(
                f"{heads.num_heads} Medusa heads draft at most {heads.num_heads} tokens deep, got "
                f"num_tokens {num_tokens}, tree depth {tree_depth}"
            )
        self.heads = heads
        self.num_tokens = num_tokens
        self.tree_depth, self.tree_top_k = tree_depth, tree_top_k
        self.latest: dict[str, tuple[int, torch.Tensor]] = {}

    def observe(self, request_id: str, features: torch.Tensor, first_position: int) -> None:
        """Real target features ``[m, H]`` for positions ``first_position ..``: only the newest is kept."""
        self.latest[request_id] = (first_position + features.shape[0] - 1, features[-1])

    def ready(self, request_id: str, num_computed: int) -> bool:
        return request_id in self.latest and self.latest[request_id][0] == num_computed - 1

    def free(self, request_id: str) -> None:
        self.latest.pop(request_id, None)

    def _logits(self, request_ids: list[str], token_ids: list[list[int]]) -> torch.Tensor:
        """Every head's logits ``[B, K, Vd]`` from each request's newest feature."""
        for request_id, ids in zip(request_ids, token_ids):
            if not self.ready(request_id, len(ids) - 1):
                held = self.latest.get(request_id, (None,))[0]
                raise RuntimeError(
                    f"request {request_id}: the drafter holds the feature of position {held}, but the "
                    f"sequence has {len(ids) - 1} computed tokens"
                )
        features = torch.stack([self.latest[r][1] for r in request_ids])
        return self.heads.draft_logits(self.heads(features))

    @torch.inference_mode()
    def propose(
        self, request_ids: list[str], token_ids: list[list[int]], limits: list[int], temperatures: list[float]
    ) -> list[Draft]:
        """Up to ``min(num_tokens, limits[b])`` drafts per request, all heads at once. Greedy requests take
        each head's argmax; others sample from ``softmax(logits / T)`` and return that ``q`` (each head's
        ``q`` ignores the drafts before it, which rejection sampling allows: it stays exact for any ``q``)."""
        logits = self._logits(request_ids, token_ids)[:, : self.num_tokens]  # [B, k, Vd]
        heads, vocab_size = self.heads, self.heads.lm_head_weight.shape[0]
        choices = logits.argmax(dim=-1)
        probs: list[torch.Tensor | None] = [None] * len(request_ids)
        for b, temperature in enumerate(temperatures):
            if temperature > 0:
                q = torch.softmax(logits[b] / temperature, dim=-1)  # [k, Vd]
                choices[b] = torch.multinomial(q, 1)[:, 0]
                full = torch.zeros(q.shape[0], vocab_size, device=q.device)
                probs[b] = full.index_copy_(1, heads.vocab_ids, q)
        drafted = heads.vocab_ids[choices].tolist()  # the drafts' one read
        drafts = []
        for ids, p, limit in zip(drafted, probs, limits):
            num = max(0, min(self.num_tokens, limit))
            drafts.append(Draft(ids[:num], p[:num] if p is not None and num else None))
        return drafts

    @torch.inference_mode()
    def propose_tree(self, request_id: str, token_ids: list[int], num_nodes: int) -> DraftTree:
        """A tree of ``num_nodes`` drafts below the newest token, ``tree_depth`` deep: head ``d``'s top-k
        tokens hang at depth ``d`` below every kept node of depth ``d - 1`` (the same ones under every
        parent: the heads never see the path), scored by the product of the heads' probabilities along
        the path, as EAGLE-2 scores its trees (``tree.grow_tree``)."""
        log_probs = torch.log_softmax(self._logits([request_id], [token_ids])[0], dim=-1).cpu()  # [K, Vd]
        depth = [1]  # the depth of the frontier grow_tree expands next

        def expand(frontier: list[int], tokens: list[int], parents: list[int]) -> torch.Tensor:
            rows = log_probs[depth[0]].expand(len(frontier), -1)
            depth[0] += 1
            return rows

        tree = grow_tree(token_ids[-1], log_probs[0], expand, self.tree_depth, self.tree_top_k, num_nodes)
        ids = self.heads.vocab_ids.cpu()
        tree.token_ids = [tree.token_ids[0]] + [int(ids[t]) for t in tree.token_ids[1:]]
        return tree


def heads_loss(
    heads: MedusaHeads, features: torch.Tensor, labels: torch.Tensor, start: int, decay: float = 0.8
) -> tuple[torch.Tensor, torch.Tensor]:
    """Medusa-1's loss on one sequence, and each head's agreement with the target ``[K]``.

    ``features [L, H]`` and ``labels [L]`` (the target's greedy choice after each position) come from one
    target pass (``train_eagle.features_and_labels``). Head ``k`` at position ``i >= start`` is trained
    toward ``labels[i + k]``: the target's own choice ``k`` tokens after the root, given the right tokens
    before it, which is what a greedy verify pass accepts. Its cross-entropy (over the draft vocabulary;
    tokens outside it do not count) is weighted ``decay ** k``, as the paper's ``lambda_k``.
    """
    length = features.shape[0]
    index_of = torch.full((int(heads.lm_head_weight.shape[0]),), -100, dtype=torch.long)
    index_of[heads.vocab_ids] = torch.arange(len(heads.vocab_ids))
    logits = heads.draft_logits(heads(features[start:]))  # [T, K, Vd]
    total, hits = torch.zeros(()), torch.zeros(heads.num_heads)
    for k in range(1, heads.num_heads + 1):
        count = length - start - k  # positions whose label exists
        if count <= 0:
            break
        head_logits, head_labels = logits[:count, k - 1], labels[start + k : start + k + count]
        total = total + decay**k * F.cross_entropy(head_logits, index_of[head_labels], ignore_index=-100)
        hits[k - 1] = (heads.vocab_ids[head_logits.argmax(-1)] == head_labels).float().mean()
    return total, hits
