"""Markdown for a ``bench gpu`` document (see ``gpu_report``): one block per section, the run in order."""

from __future__ import annotations

from collections.abc import Callable

SHAPE_SECTIONS = ("model", "decode", "profile", "sweep", "throughput")


def _num(value, digits: int = 1, suffix: str = "") -> str:
    return "-" if value is None else f"{value:,.{digits}f}{suffix}"


def _share(value) -> str:
    return "-" if value is None else f"{value:.1%}"


def _table(columns: list[str], rows: list[list[str]]) -> list[str]:
    aligns = ["---"] + ["---:"] * (len(columns) - 1)
    return [f"| {' | '.join(columns)} |", f"| {' | '.join(aligns)} |"] + [
        f"| {' | '.join(r)} |" for r in rows
    ]


def render(data: dict) -> str:
    h = data["header"]
    lines = [
        f"# `bench gpu` on {h['machine']}, {h['date']}",
        "",
        f"command: `{h['command']}`  ",
        f"commit {h['commit']}; torch {h['torch']}, triton {h['triton']}, transformers {h['transformers']}, "
        f"Python {h['python']}; device {h['device']}; preset {h['preset']}, "
        f"time limit {h['time_limit_s']:.0f} s",
        "",
    ]
    if "bandwidth" in data:
        lines.append(render_section("bandwidth", data["bandwidth"]))
    for sections in data.get("shapes", {}).values():
        lines += [render_section(key, sections[key]) for key in SHAPE_SECTIONS if key in sections]
    if "speculative" in data:
        lines.append(render_section("speculative", data["speculative"]))
    return "\n".join(lines) + "\n"


# Per section: its heading (the model's is its shape's name), and the key its body needs measured.
HEADINGS = {
    "bandwidth": (None, "copy_GBps"),
    "model": (None, "config"),
    "decode": ("### Batch-1 decode", "rows"),
    "profile": ("### One decode step", "rows"),
    "sweep": ("### Batch sweep: per-request speed vs total throughput", "rows"),
    "throughput": ("### Offline throughput", "workload"),
    "speculative": ("## Speculative decoding at batch 1", "rows"),
}


def render_section(key: str, s: dict) -> str:
    heading, needs = HEADINGS[key]
    lines = [f"## {s.get('shape', '?')}", ""] if key == "model" else [heading, ""] if heading else []
    if needs in s:
        body = {"bandwidth": _bandwidth, "model": _model, "decode": _decode, "profile": _profile,
                "sweep": _sweep, "throughput": _throughput, "speculative": _speculative}[key]  # fmt: skip
        lines += body(s)
    if s["status"] != "ok":
        why = s.get("error") or s.get("reason", "")
        lines.append(f"*{key}: {s['status']} after {s['seconds']} s: {why}*")
    return "\n".join(lines) + "\n"


def _bandwidth(s: dict) -> list[str]:
    return [
        f"Copy bandwidth: {_num(s['copy_GBps'], 0)} GB/s (device-to-device copy of a "
        f"{s['bytes'] / 2**30:.2f} GiB buffer, bytes read + written, {s['timer']})"
    ]


def _model(s: dict) -> list[str]:
    c = s["config"]
    return [
        f"{s['source']}: hidden {c['hidden_size']}, {c['num_hidden_layers']} layers, "
        f"{c['num_attention_heads']} heads / {c['num_key_value_heads']} KV heads, intermediate "
        f"{c['intermediate_size']}, vocab {c['vocab_size']}, "
        f"{'tied' if c['tie_word_embeddings'] else 'untied'} head, RoPE theta {c['rope_theta']:g}"
        f"{' (llama3 scaling)' if c.get('rope_scaling') else ''}; {s['weights']}, "
        f"{s['weight_bytes'] / 1e9:.2f} GB, written in {s['write_s']:.1f} s. Engines run {s['dtype']} "
        f"with {s['kv_cache_bytes'] / 2**30:.1f} GiB of KV cache each, "
        f"max_model_len {s['max_model_len']}."
    ]


def _columns(records: list[dict], columns: dict[str, Callable[[dict], str]]) -> list[str]:
    """A table of one row per record, each column's cell ``columns[name](record)``."""
    return _table(list(columns), [[cell(r) for cell in columns.values()] for r in records])


def _decode(s: dict) -> list[str]:
    caption = (
        f"Prompt {s['prompt_tokens']} tokens, (t({s['new_tokens']} tokens) - t(1 token)) / "
        f"{s['new_tokens'] - 1}, median of {s['repeats']}, engines alternating. Roofline: "
        f"{s['weight_bytes_per_token'] / 1e9:.3f} GB of weights per token at the copy bandwidth = "
        f"{_num(s.get('roofline_tok_s'), 0)} tok/s."
    )
    table = _columns(s["rows"], {
        "engine": lambda r: r["label"], "tok/s": lambda r: _num(r["tok_s"]),
        "ms/token": lambda r: _num(r["ms_per_token"], 2),
        "of roofline": lambda r: _share(r.get("roofline_share")),
    })  # fmt: skip
    lines = [caption, "", *table]
    if s.get("ratios"):
        ratios = [f"{k.replace('_vs_', ' / ').replace('hf', 'HF')} {v:.2f}x" for k, v in s["ratios"].items()]
        lines += ["", "tok/s ratios: " + ", ".join(ratios)]
    return lines


def _profile(s: dict) -> list[str]:
    caption = (
        f"Prompts of {s['prompt_tokens']} tokens, all prefilled; wall: median of {s['timed_steps']} steps "
        f"timed one by one; the rest per step from torch.profiler over {s['profiled_steps']} more steps."
        + ("" if s.get("on_cuda") else " No CUDA here: device columns are not measured.")
    )
    return [caption, "", *_columns(s["rows"], {
        "engine": lambda r: r["engine"], "batch": lambda r: str(r["batch"]),
        "wall ms": lambda r: _num(r["wall_ms"], 2), "GPU busy ms": lambda r: _num(r["gpu_busy_ms"], 2),
        "busy share": lambda r: _share(r["busy_share"]), "kernels/step": lambda r: _num(r["kernels"], 0),
        "kernels/layer": lambda r: _num(r["kernels_per_layer"], 1),
        "host syncs/step": lambda r: _num(r["host_syncs"], 1),
        "H2D copies/step (pageable)": lambda r: f"{_num(r['h2d_copies'], 1)} ({_num(r['h2d_pageable'], 1)})",
        "D2H copies/step": lambda r: _num(r["d2h_copies"], 1),
    })]  # fmt: skip


def _sweep(s: dict) -> list[str]:
    caption = (
        f"Steady-state decode: {s['prompt_tokens']}-token prompts all prefilled, then the median of "
        f"{s['timed_steps']} decode steps timed one by one (prefill excluded)."
    )
    engines = list(dict.fromkeys(r["engine"] for r in s["rows"]))
    by_key = {(r["engine"], r["batch"]): r for r in s["rows"]}
    figures = {"step ms": ("step_ms", 2), "tok/s per request": ("per_request_tok_s", 1),
               "aggregate tok/s": ("aggregate_tok_s", 0)}  # fmt: skip
    columns = {"batch": lambda b: str(b)} | {
        f"{e} {name}": lambda b, e=e, key=key, digits=digits: _num(by_key.get((e, b), {}).get(key), digits)
        for e in engines
        for name, (key, digits) in figures.items()
    }
    return [caption, "", *_columns(sorted({r["batch"] for r in s["rows"]}), columns)]


def _throughput(s: dict) -> list[str]:
    w = s["workload"]
    caption = (
        f"{w['description']}: {w['requests']} requests, {w['prompt_tokens']:,} prompt and "
        f"{w['output_tokens']:,} output tokens."
    )
    table = _columns(s.get("rows", []), {
        "engine": lambda r: r["label"], "requests": lambda r: str(r["requests"]),
        "output tokens": lambda r: f"{r['output_tokens']:,}", "wall s": lambda r: _num(r["wall_s"], 2),
        "output tok/s": lambda r: _num(r["output_tok_s"]),
    })  # fmt: skip
    lines = [caption, "", *table]
    if s.get("ratio_vs_hf"):
        lines += ["", f"This engine / HF static batches: {s['ratio_vs_hf']:.2f}x output tok/s."]
    return lines


def _speculative(s: dict) -> list[str]:
    caption = (
        f"{s['model']}: {s['prompts']} held-back prompts x {s['max_tokens']} tokens, greedy, methods "
        "interleaved prompt by prompt; tok/s over whole requests (prefill included)."
    )
    lines = [caption, "", *_columns(s["rows"], {
        "method": lambda r: r["method"], "tok/s": lambda r: _num(r["tok_s"]),
        "vs plain": lambda r: f"{r['speedup']:.2f}x", "tau": lambda r: _num(r["tau"], 2),
        "outputs differing from plain": lambda r: str(r["outputs_differing"]),
    })]  # fmt: skip
    if s.get("breakdown"):
        lines += [
            "",
            "Where a decode step's time goes (the first prompt alone, after its prefill; the device "
            "synchronised at each part, so the steps are slower than above): ms a step.",
            "",
            *_columns(s["breakdown"], {
                "method": lambda r: r["method"], "steps": lambda r: str(r["steps"]),
                "step": lambda r: _num(r["step_ms"], 2), "drafting": lambda r: _num(r["draft_ms"], 2),
                "forward": lambda r: _num(r["forward_ms"], 2), "the rest": lambda r: _num(r["other_ms"], 2),
                "forwards from a graph": lambda r: _share(r["graph_share"]),
            }),
        ]  # fmt: skip
    return lines
