"""The tokenizer a GGUF file describes, rebuilt per ``tokenizer.ggml.pre``, against ``AutoTokenizer``.

For each pre-tokenizer we claim, the test trains a small byte-level BPE, writes it twice: as a
Hugging Face ``tokenizer.json`` whose pre-tokenizer is that family's own definition (as published
in SmolLM2's and Llama-3's tokenizer.json), and as GGUF tokenizer metadata with the ``gguf``
package's writer. Our tokenizer, rebuilt from the GGUF alone, must give ``AutoTokenizer``'s ids on
varied text, decode back to the text, add BOS exactly when the file says so, and render the chat
template with ``bos_token``. Nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from solutions.model import gguf_file
from solutions.model.tokenizer import TextTokenizer

GPT2_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.json "pre_tokenizer" of each family, and whether its BPE model sets ignore_merges.
FAMILIES = {
    "gpt-2": (GPT2_BYTE_LEVEL, False),
    "smollm": (
        {
            "type": "Sequence",
            "pretokenizers": [{"type": "Digits", "individual_digits": True}, GPT2_BYTE_LEVEL],
        },
        False,
    ),
    "llama-bpe": (
        {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": LLAMA3_REGEX},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
            ],
        },
        True,
    ),
}
SPECIALS = ["<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]
BOS_TEXT, EOS_TEXT = "<|begin_of_text|>", "<|eot_id|>"
TEXTS = [
    "Hello, world! It's 2024 and I'VE got 1234567 apples.",
    "  leading spaces, and trailing ones   ",
    "line one\nline two\r\n\n\tindented\t tab\n\n\n",
    "naïve café — déjà vu; Ελληνικά, русский, 日本語のテキスト, 한국어",
    'emoji 🤖🚀 and symbols $%^&*() <tag attr="x"> {json: [1, 2.5e-3]}',
    "def f(x):\n    return x**2  # square it\n",
    "don't won't they'll we'd SHE'S I'm",
    "numbers: 3.14159 1,000,000 ½ Ⅻ ١٢٣ 00007",
    f"text around {EOS_TEXT} a special token {BOS_TEXT}!",
    "a zyzzyva, seen",  # "Ġzyzzyva" is in the vocabulary but no merges lead to it: ignore_merges decides
]
UNMERGED_WORD = "Ġzyzzyva"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def train_vocab():
    """A byte-level BPE whose merges include multi-digit numbers and whole words,
    plus one word no merge reaches."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=900,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [t for t in TEXTS if "zyzzyva" not in t]
    corpus += ["The year 2024 had 365 days, 12 months and 52 weeks; 1000000 seconds pass in 11 days."]
    tokenizer.train_from_iterator(corpus * 30, trainer)
    spec = json.loads(tokenizer.to_str())
    spec["model"]["vocab"][UNMERGED_WORD] = tokenizer.get_vocab_size()
    return Tokenizer.from_str(json.dumps(spec))


def write_hf_folder(folder: Path, tokenizer, family: str, add_bos: bool) -> Path:
    pre_tokenizer, ignore_merges = FAMILIES[family]
    spec = json.loads(tokenizer.to_str())
    spec["pre_tokenizer"] = pre_tokenizer
    spec["model"]["ignore_merges"] = ignore_merges
    bos_id = tokenizer.token_to_id(BOS_TEXT)
    if add_bos:
        spec["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": BOS_TEXT, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {BOS_TEXT: {"id": BOS_TEXT, "ids": [bos_id], "tokens": [BOS_TEXT]}},
        }
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TEXT,
        "eos_token": EOS_TEXT,
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def gguf_metadata(path: Path, tokenizer, pre: str, add_bos: bool) -> dict:
    """Write the tokenizer as GGUF metadata (llama.cpp's 'gpt2' model) and read it back from the file."""
    import gguf

    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
    writer.add_bos_token_id(vocab[BOS_TEXT])
    writer.add_eos_token_id(vocab["<|endoftext|>"])
    writer.add_eot_token_id(vocab[EOS_TEXT])
    writer.add_add_bos_token(add_bos)
    writer.add_chat_template(CHAT_TEMPLATE)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return gguf_file.read_metadata(gguf.GGUFReader(str(path)))


@pytest.fixture(scope="module")
def vocab():
    return train_vocab()


def family_pair(tmp_path, vocab, family: str):
    from transformers import AutoTokenizer

    add_bos = family == "llama-bpe"  # as in Llama-3's GGUFs; SmolLM2's say add_bos_token = false
    hf = AutoTokenizer.from_pretrained(write_hf_folder(tmp_path / "hf", vocab, family, add_bos))
    ours = TextTokenizer.from_gguf_metadata(gguf_metadata(tmp_path / "t.gguf", vocab, family, add_bos))
    return ours, hf


@pytest.mark.parametrize("family", list(FAMILIES))
def test_gguf_tokenizer_matches_autotokenizer(tmp_path, vocab, family):
    ours, hf = family_pair(tmp_path, vocab, family)
    for text in TEXTS:
        expected = hf(text).input_ids
        assert ours.encode(text) == expected, text
        assert ours.decode(expected) == hf.decode(expected, skip_special_tokens=True)
        assert ours.decode(expected, skip_special_tokens=False) == hf.decode(expected)
    plain = TEXTS[0]
    assert ours.decode(ours.encode(plain)) == plain
    assert (ours.encode(plain)[0] == ours.bos_token_id) is (family == "llama-bpe")


@pytest.mark.parametrize("family", ["smollm", "llama-bpe"])
def test_the_pre_tokenizer_matters(tmp_path, vocab, family):
    """GPT-2's split on the same vocabulary gives other ids: the round trip above is not vacuous."""
    _, hf = family_pair(tmp_path, vocab, family)
    gpt2 = TextTokenizer.from_gguf_metadata(gguf_metadata(tmp_path / "g.gguf", vocab, "gpt-2", False))
    differs = [t for t in TEXTS if gpt2.encode(t) != hf(t, add_special_tokens=False).input_ids]
    assert len(differs) >= 2, differs


def test_chat_template_gets_bos_token_and_one_bos(tmp_path, vocab):
    ours, hf = family_pair(tmp_path, vocab, "llama-bpe")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 12 + 30?"}]
    rendered = ours.apply_chat_template(messages)
    assert rendered.startswith(BOS_TEXT)
    assert rendered == hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    expected = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    expected = expected["input_ids"] if isinstance(expected, dict) or hasattr(expected, "keys") else expected
    assert ours.encode(rendered) == list(expected)
    assert ours.encode(rendered).count(ours.bos_token_id) == 1


def test_gguf_eos_set_and_unknown_pre_tokenizer(tmp_path, vocab):
    ours = TextTokenizer.from_gguf_metadata(gguf_metadata(tmp_path / "t.gguf", vocab, "smollm", False))
    assert ours.eos_token_ids == (vocab.token_to_id("<|endoftext|>"), vocab.token_to_id(EOS_TEXT))
    assert ours.eos_token_id == vocab.token_to_id("<|endoftext|>")
    meta = gguf_metadata(tmp_path / "q.gguf", vocab, "qwen2", False)
    with pytest.raises(
        ValueError, match="pre-tokenizer .* 'qwen2' is not supported; supported: gpt-2, smollm, llama-bpe"
    ):
        TextTokenizer.from_gguf_metadata(meta)
