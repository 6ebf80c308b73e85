"""Markdown for a ``bench gpu`` document (see ``gpu_report``): one block per section, the run in order."""

from __future__ import annotations

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


def _decode(s: dict) -> list[str]:
    caption = (
        f"Prompt {s['prompt_tokens']} tokens, (t({s['new_tokens']} tokens) - t(1 token)) / "
        f"{s['new_tokens'] - 1}, median of {s['repeats']}, engines alternating. Roofline: "
        f"{s['weight_bytes_per_token'] / 1e9:.3f} GB of weights per token at the copy bandwidth = "
        f"{_num(s.get('roofline_tok_s'), 0)} tok/s."
    )
    rows = [
        [r["label"], _num(r["tok_s"]), _num(r["ms_per_token"], 2), _share(r.get("roofline_share"))]
        for r in s["rows"]
    ]
    lines = [caption, "", *_table(["engine", "tok/s", "ms/token", "of roofline"], rows)]
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
    columns = ["engine", "batch", "wall ms", "GPU busy ms", "busy share", "kernels/step", "kernels/layer",
               "host syncs/step", "H2D copies/step (pageable)", "D2H copies/step"]  # fmt: skip
    rows = [
        [r["engine"], str(r["batch"]), _num(r["wall_ms"], 2), _num(r["gpu_busy_ms"], 2),
         _share(r["busy_share"]), _num(r["kernels"], 0), _num(r["kernels_per_layer"], 1),
         _num(r["host_syncs"], 1), f"{_num(r['h2d_copies'], 1)} ({_num(r['h2d_pageable'], 1)})",
         _num(r["d2h_copies"], 1)]
        for r in s["rows"]
    ]  # fmt: skip
    return [caption, "", *_table(columns, rows)]


def _sweep(s: dict) -> list[str]:
    caption = (
        f"Steady-state decode: {s['prompt_tokens']}-token prompts all prefilled, then the median of "
        f"{s['timed_steps']} decode steps timed one by one (prefill excluded)."
    )
    engines = list(dict.fromkeys(r["engine"] for r in s["rows"]))
    by_key = {(r["engine"], r["batch"]): r for r in s["rows"]}
    columns = ["batch"] + [
        f"{e} {c}" for e in engines for c in ("step ms", "tok/s per request", "aggregate tok/s")
    ]
    rows = []
    for b in sorted({r["batch"] for r in s["rows"]}):
        row = [str(b)]
        for r in (by_key.get((e, b), {}) for e in engines):
            row += [
                _num(r.get("step_ms"), 2),
                _num(r.get("per_request_tok_s")),
                _num(r.get("aggregate_tok_s"), 0),
            ]
        rows.append(row)
    return [caption, "", *_table(columns, rows)]


def _throughput(s: dict) -> list[str]:
    w = s["workload"]
    caption = (
        f"{w['description']}: {w['requests']} requests, {w['prompt_tokens']:,} prompt and "
        f"{w['output_tokens']:,} output tokens."
    )
    rows = [
        [
            r["label"],
            str(r["requests"]),
            f"{r['output_tokens']:,}",
            _num(r["wall_s"], 2),
            _num(r["output_tok_s"]),
        ]
        for r in s.get("rows", [])
    ]
    lines = [caption, "", *_table(["engine", "requests", "output tokens", "wall s", "output tok/s"], rows)]
    if s.get("ratio_vs_hf"):
        lines += ["", f"This engine / HF static batches: {s['ratio_vs_hf']:.2f}x output tok/s."]
    return lines


def _speculative(s: dict) -> list[str]:
    caption = (
        f"{s['model']}: {s['prompts']} held-back prompts x {s['max_tokens']} tokens, greedy, methods "
        "interleaved prompt by prompt; tok/s over whole requests (prefill included)."
    )
    rows = [
        [
            r["method"],
            _num(r["tok_s"]),
            f"{r['speedup']:.2f}x",
            _num(r["tau"], 2),
            str(r["outputs_differing"]),
        ]
        for r in s["rows"]
    ]
    lines = [
        caption,
        "",
        *_table(["method", "tok/s", "vs plain", "tau", "outputs differing from plain"], rows),
    ]
    if s.get("breakdown"):
        lines += [
            "",
            "Where a decode step's time goes (the first prompt alone, after its prefill; the device "
            "synchronised at each part, so the steps are slower than above): ms a step.",
            "",
        ]
        parts = ("step_ms", "draft_ms", "forward_ms", "other_ms")
        rows = [
            [r["method"], str(r["steps"]), *(_num(r[part], 2) for part in parts), _share(r["graph_share"])]
            for r in s["breakdown"]
        ]
        header = ["method", "steps", "step", "drafting", "forward", "the rest", "forwards from a graph"]
        lines += _table(header, rows)
    return lines
