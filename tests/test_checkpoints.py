"""Checkpoints beyond the bundled one, against Hugging Face transformers as the oracle.

One tiny random Llama (untied head, Llama-3.1-style ``rope_scaling``) is written by the tests as a
Hugging Face folder (its ``config.json`` in Llama-3.2's own layout) and, the same weights, as GGUF
files with the ``gguf`` package's writer: F32, F16 and Q8_0, untied and tied, with the
``rope_freqs.weight`` tensor llama.cpp's converter writes for Llama-3. Our logits and greedy tokens
must equal transformers' on each. Nothing is downloaded.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from solutions.llm import LLM
from solutions.model import gguf_file, loader
from solutions.model.config import ModelConfig
from solutions.model.llama import LlamaModel
from solutions.sampling_params import SamplingParams

VOCAB, HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, MAX_POS = 320, 64, 96, 2, 4, 2, 128
THETA, EPS = 10000.0, 1e-6
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # With head_dim 16 and theta 1e4 the wavelengths run from 6 to 2e4: 32 puts one frequency in each
    # of llama3's three bands (kept, blended, slowed), so every branch is exercised.
    "original_max_position_embeddings": 32,
}
PROMPT = [5, 77, 140, 9, 250, 31, 31, 188, 64, 2, 100, 290, 17, 43, 43, 201, 99, 7, 160, 12] * 2
NEW_TOKENS = 24
BOS, EOS, EOT = 1, 2, 3
SPECIALS = ["<unk>", "<s>", "</s>", "<eot>"]


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTMODE_CACHE", str(tmp_path / "cache"))


# ---------------------------------------------------------------- building checkpoints


def byte_level_tokenizer():
    """A small byte-level BPE (GPT-2 pre-tokenizer) covering ids [0, VOCAB), trained on a few sentences."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [
        "the quick brown fox jumps over the lazy dog",
        "a stitch in time saves nine, and many hands make light work",
        "pack my box with five dozen liquor jugs; how vexingly quick daft zebras jump",
    ]
    tokenizer.train_from_iterator(corpus * 20, trainer)
    assert tokenizer.get_vocab_size() == VOCAB
    return tokenizer


def hf_model(tie: bool, rope: dict | None = LLAMA3_ROPE):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=MAX_POS,
        rms_norm_eps=EPS,
        tie_word_embeddings=tie,
        initializer_range=0.3,  # peaked logits: greedy choices are far from ties
        bos_token_id=BOS,
        eos_token_id=EOS,
        rope_parameters={"rope_theta": THETA, **(rope or {"rope_type": "default"})},
    )
    return LlamaForCausalLM(config).eval()


def write_hf_folder(folder: Path, model, rope: dict | None, generation_eos: list[int] | None = None) -> Path:
    """save_pretrained, then config.json rewritten in Llama-3.2's layout
    (``rope_scaling`` + ``rope_theta``)."""
    model.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config.pop("rope_parameters")
    config["rope_theta"] = THETA
    if rope:
        config["rope_scaling"] = dict(rope)
    (folder / "config.json").write_text(json.dumps(config))
    if generation_eos is not None:
        (folder / "generation_config.json").write_text(
            json.dumps({"bos_token_id": BOS, "eos_token_id": generation_eos})
        )
    byte_level_tokenizer().save(str(folder / "tokenizer.json"))
    return folder


def llama3_rope_factors(head_dim: int) -> list[float]:
    """What llama.cpp's convert_hf_to_gguf.py writes as ``rope_freqs.weight`` for ``rope_type: llama3``."""
    factor, low, high = LLAMA3_ROPE["factor"], LLAMA3_ROPE["low_freq_factor"], LLAMA3_ROPE["high_freq_factor"]
    old_context = LLAMA3_ROPE["original_max_position_embeddings"]
    factors = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * THETA ** (i / head_dim)
        if wavelen < old_context / high:
            factors.append(1.0)
        elif wavelen > old_context / low:
            factors.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return factors


GGUF_LAYER_NAMES = {v: k for k, v in gguf_file._LAYER_NAMES.items()}


def gguf_name(hf: str) -> str:
    globals_ = {v: k for k, v in gguf_file._GLOBAL_NAMES.items()}
    if hf in globals_:
        return globals_[hf]
    _, _, layer, *module, param = hf.split(".")
    return f"blk.{layer}.{GGUF_LAYER_NAMES['.'.join(module)]}.{param}"


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's Q/K row order: per head, the two rotary halves interleaved."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def write_gguf(
    path: Path,
    model,
    qtype: str,
    tie: bool,
    rope_freqs: bool = True,
    architecture: str = "llama",
    extra_tensors: dict[str, np.ndarray] | None = None,
    pre: str = "gpt-2",
    eot: int | None = EOT,
    extra_strings: dict[str, str] | None = None,
) -> Path:
    """The model's weights as llama.cpp lays them out: names, Q/K row order, norms in F32,
    ``qtype`` for matrices."""
    import gguf
    from gguf.quants import quantize

    tokenizer = byte_level_tokenizer()
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_context_length(MAX_POS)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_rope_freq_base(THETA)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_vocab_size(VOCAB)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    if eot is not None:
        writer.add_eot_token_id(eot)
    writer.add_add_bos_token(False)
    for key, value in (extra_strings or {}).items():
        writer.add_string(key, value)
    for name, tensor in model.state_dict().items():
        if tie and name == "lm_head.weight":
            continue
        weight = tensor.detach().float().numpy()
        if name.endswith("q_proj.weight"):
            weight = llama_cpp_permute(weight, HEADS)
        elif name.endswith("k_proj.weight"):
            weight = llama_cpp_permute(weight, KV_HEADS)
        if weight.ndim == 1 or qtype == "F32":
            writer.add_tensor(gguf_name(name), np.ascontiguousarray(weight, dtype=np.float32))
        elif qtype == "F16":
            writer.add_tensor(gguf_name(name), weight.astype(np.float16))
        else:
            kind = gguf.GGMLQuantizationType[qtype]
            writer.add_tensor(gguf_name(name), quantize(weight, kind), raw_dtype=kind)
    if rope_freqs:
        writer.add_tensor(
            "rope_freqs.weight", np.array(llama3_rope_factors(HIDDEN // HEADS), dtype=np.float32)
        )
    for name, tensor in (extra_tensors or {}).items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# ---------------------------------------------------------------- the oracle


def hf_from_gguf(path: Path, rope: dict | None):
    """transformers loading our GGUF: it reads no RoPE scaling for llama GGUFs, so it is told
    (from config.json)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()
    rope_parameters = {"rope_theta": THETA, **(rope or {"rope_type": "default"})}
    return AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, rope_parameters=rope_parameters
    ).eval()


def hf_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(new_tokens):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def assert_matches_hf(model_path: Path, hf) -> None:
    """Logits at every prompt position (relative error < 1e-4) and greedy tokens through the engine."""
    llm = LLM(model=str(model_path), device="cpu", dtype="float32", max_num_seqs=2, max_model_len=MAX_POS)
    ids = torch.tensor(PROMPT)
    with torch.inference_mode():
        expected = hf(ids[None]).logits[0].double()
        ours = llm.engine.model.sequence_logits(ids).double()
    rel = float((ours - expected).norm() / expected.norm())
    assert rel < 1e-4, f"relative logit error {rel:.2e}"
    greedy = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    assert llm.generate(PROMPT, greedy)[0].outputs[0].token_ids == hf_greedy(hf, PROMPT, NEW_TOKENS)


# ---------------------------------------------------------------- the tests


@pytest.mark.parametrize("rope_type", ["llama3", "linear", "dynamic", None])
def test_hf_folder_with_rope_scaling_and_untied_head_matches_transformers(tmp_path, rope_type):
    rope = {"llama3": LLAMA3_ROPE, "linear": {"rope_type": "linear", "factor": 4.0}}.get(rope_type)
    if rope_type == "dynamic":
        rope = {"rope_type": "dynamic", "factor": 2.0}
    hf = hf_model(tie=False, rope=rope)
    folder = write_hf_folder(tmp_path / "hf", hf, rope)
    weights = loader.load_weights(folder)
    assert not weights.config.tie_word_embeddings
    assert (weights.config.rope_scaling.rope_type if rope else None) == rope_type
    assert_matches_hf(folder, hf)


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("qtype", ["F32", "F16", "Q8_0"])
def test_gguf_matches_transformers(tmp_path, qtype, tie):
    path = write_gguf(tmp_path / f"tiny-{qtype}.gguf", hf_model(tie=tie), qtype, tie)
    weights = loader.load_weights(path)
    assert weights.config.tie_word_embeddings is tie
    assert weights.config.rope_scaling.freq_factors == pytest.approx(llama3_rope_factors(HIDDEN // HEADS))
    assert_matches_hf(path, hf_from_gguf(path, LLAMA3_ROPE))


def test_gguf_rope_freqs_reproduce_the_hf_folder_llama3_rope(tmp_path):
    """The F32 GGUF (RoPE from rope_freqs) against transformers on the HF folder (RoPE from rope_scaling)."""
    hf = hf_model(tie=False)
    assert_matches_hf(write_gguf(tmp_path / "tiny.gguf", hf, "F32", tie=False), hf)


def test_untied_gguf_head_is_not_the_embedding(tmp_path):
    """The bug this guards against: an untied file's own output.weight silently replaced by the embeddings."""
    hf = hf_model(tie=False)
    weights = loader.load_weights(write_gguf(tmp_path / "tiny.gguf", hf, "F32", tie=False), use_cache=False)
    model = LlamaModel.from_state_dict(weights.config, weights.state_dict, "cpu", torch.float32)
    assert torch.equal(model.lm_head.weight, hf.lm_head.weight)
    assert not torch.equal(model.lm_head.weight, model.embed_tokens.weight)


def test_gguf_cache_round_trips_config_tokenizer_and_weights(tmp_path):
    path = write_gguf(tmp_path / "tiny.gguf", hf_model(tie=False), "Q8_0", tie=False)
    first = loader.load_weights(path)
    assert list((tmp_path / "cache").glob("*.safetensors")), "the dequantized weights were not cached"
    second = loader.load_weights(path)
    direct = loader.load_weights(path, use_cache=False)
    assert first.config == second.config == direct.config
    assert second.tokenizer.eos_token_ids == direct.tokenizer.eos_token_ids == (EOS, EOT)
    assert second.tokenizer.bos_token_id == BOS
    for name in direct.state_dict:
        assert torch.equal(second.state_dict[name], direct.state_dict[name]), name


# ---------------------------------------------------------------- EOS sets and stop_token_ids


def test_eos_sets_come_from_the_metadata(tmp_path):
    hf = hf_model(tie=False)
    gguf_config = loader.load_weights(
        write_gguf(tmp_path / "t.gguf", hf, "F32", tie=True), use_cache=False
    ).config
    assert (gguf_config.eos_token_id, gguf_config.eos_token_ids) == (EOS, (EOS, EOT))
    folder = write_hf_folder(tmp_path / "hf", hf, LLAMA3_ROPE, generation_eos=[EOS, 7, EOT])
    weights = loader.load_weights(folder)
    assert (weights.config.eos_token_id, weights.config.eos_token_ids) == (EOS, (EOS, 7, EOT))
    assert weights.tokenizer.eos_token_ids == (EOS, 7, EOT) and weights.tokenizer.eos_token_id == EOS


def test_generation_stops_on_any_eos_id_and_on_stop_token_ids(tmp_path):
    """Llama-3 Instruct's case: the turn ends with an id that is not config.json's eos_token_id."""
    hf = hf_model(tie=False)
    greedy = hf_greedy(hf, PROMPT, NEW_TOKENS)
    stop_at = next(i for i in range(3, NEW_TOKENS) if greedy[i] not in greedy[:i])  # first occurrence
    folder = write_hf_folder(tmp_path / "hf", hf, LLAMA3_ROPE, generation_eos=[EOS, greedy[stop_at]])
    llm = LLM(model=str(folder), device="cpu", dtype="float32", max_num_seqs=2, max_model_len=MAX_POS)

    def run(**options) -> tuple[list[int], str]:
        out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=NEW_TOKENS, **options))[
            0
        ].outputs[0]
        return out.token_ids, out.finish_reason

    assert run() == (greedy[: stop_at + 1], "stop")  # the second EOS id of the set
    assert run(ignore_eos=True) == (greedy, "length")
    stop_token = greedy[2]
    assert run(ignore_eos=True, stop_token_ids=[stop_token]) == (
        greedy[: greedy.index(stop_token) + 1],
        "stop",
    )


def test_stop_token_ids_end_generation_and_leave_their_text_out(llm):
    prompt = "Count: 1, 2, 3,"
    free = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0].outputs[0]
    stop_id = free.token_ids[4]
    first = free.token_ids.index(stop_id)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop_token_ids=[stop_id])
    out = llm.generate(prompt, params)[0].outputs[0]
    assert out.token_ids == free.token_ids[: first + 1], (
        "generation ends on the stop token, which is kept as an id"
    )
    assert (out.finish_reason, out.stop_reason) == ("stop", stop_id)
    assert out.text == llm.tokenizer.decode(free.token_ids[:first]), "the stop token's text is left out"
    for bad in ([-1], ["3"], [True], [1.5]):
        with pytest.raises(ValueError, match="stop_token_ids"):
            SamplingParams(stop_token_ids=bad)


def test_every_eos_id_of_the_model_ends_generation(llm):
    assert llm.engine.eos_token_ids == frozenset(llm.tokenizer.eos_token_ids)
    chat = llm.chat(
        [{"role": "user", "content": "Say hello."}], SamplingParams(temperature=0, max_tokens=200)
    )
    assert chat[0].outputs[0].stop_reason in llm.tokenizer.eos_token_ids


# ---------------------------------------------------------------- what is refused, by name


def test_unknown_gguf_tensor_is_an_error_naming_it(tmp_path):
    extra = {"blk.0.ffn_gate_inp.weight": np.zeros((4, HIDDEN), np.float32)}
    path = write_gguf(tmp_path / "moe.gguf", hf_model(tie=True), "F32", tie=True, extra_tensors=extra)
    with pytest.raises(ValueError, match=r"does not understand: blk\.0\.ffn_gate_inp\.weight"):
        loader.load_weights(path)


def test_unknown_hf_tensor_is_an_error_naming_it(tmp_path):
    from safetensors.torch import save_file

    folder = write_hf_folder(tmp_path / "hf", hf_model(tie=False), LLAMA3_ROPE)
    save_file(
        {"model.layers.0.self_attn.q_proj.bias": torch.zeros(HIDDEN)}, str(folder / "extra.safetensors")
    )
    weights = loader.load_weights(folder)
    with pytest.raises(
        ValueError, match=r"does not understand \['model\.layers\.0\.self_attn\.q_proj\.bias'\]"
    ):
        LlamaModel.from_state_dict(weights.config, weights.state_dict, "cpu", torch.float32)


def test_unsupported_architectures_and_rope_types_are_named(tmp_path):
    with pytest.raises(ValueError, match="GGUF architecture 'qwen2' is not supported; supported: llama"):
        loader.load_weights(
            write_gguf(tmp_path / "q.gguf", hf_model(tie=True), "F32", tie=True, architecture="qwen2")
        )
    base = hf_model(tie=False).config.to_dict()
    with pytest.raises(ValueError, match="model_type 'gemma' is not supported; supported: llama, mistral"):
        ModelConfig.from_hf_config({**base, "model_type": "gemma"})
    with pytest.raises(ValueError, match=r"sliding-window attention \(sliding_window=64\) is not supported"):
        ModelConfig.from_hf_config({**base, "model_type": "mistral", "sliding_window": 64})
    yarn = {**base, "rope_parameters": None, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    with pytest.raises(
        ValueError, match="RoPE type 'yarn' is not supported; supported: default, linear, dynamic, llama3"
    ):
        ModelConfig.from_hf_config(yarn)
    yarn_gguf = write_gguf(
        tmp_path / "y.gguf",
        hf_model(tie=True),
        "F32",
        tie=True,
        extra_strings={"llama.rope.scaling.type": "yarn"},
    )
    with pytest.raises(
        ValueError, match="GGUF RoPE scaling 'yarn' is not supported; supported: none, linear"
    ):
        loader.load_weights(yarn_gguf)
