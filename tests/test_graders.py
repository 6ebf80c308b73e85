"""The graders catch real mistakes, and say what the mistake is.

Each case writes a lab into a scratch copy of the repository the way a learner who solved it would have it
(the reference code in its holes, from ``make_labs.render(..., solved=...)``), changes one line to a mistake a
learner makes, and runs the grader (``tools/grade.py N``, what ``make grade LAB=N`` runs) on the tests that
should catch it: the grader must fail and print the message that names the cause. The other labs stay
unwritten holes throughout, so every case also checks that a lab is graded on its own. Each run is a fresh
process (a lab is chosen once per process), limited to the tests of the mistake (``-k``) to stay quick.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import make_labs  # noqa: E402

MAX_REPORT_LINES = 20


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """A copy of the repository's code with labs/ freshly generated: every hole unwritten."""
    root = tmp_path_factory.mktemp("repo")
    for folder in ("solutions", "tests", "tools"):
        shutil.copytree(ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", root)
    for shared in ("data", "notebooks"):  # read only
        (root / shared).symlink_to(ROOT / shared)
    subprocess.run(
        [sys.executable, "tools/make_labs.py", "--force"], cwd=root, check=True, capture_output=True
    )
    return root


def labs_file(root: Path, rel: str, solved: frozenset[str] = frozenset()) -> str:
    """labs/``rel`` as generated from the scratch copy's solutions/, with the labs in ``solved`` written."""
    return make_labs.render(make_labs.file_parts((root / "solutions" / rel).read_text(), Path(rel)), solved)


def grade(root: Path, lab: str, *pytest_args: str) -> tuple[int, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop(make_labs.LAB_ALONE_ENV, None)
    run = subprocess.run(
        [sys.executable, "tools/grade.py", lab, *pytest_args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return run.returncode, run.stdout + run.stderr


@pytest.fixture
def write_lab(scratch):
    """``write_lab(lab, rel, old, new, more=((rel, old, new), ...))``: every labs/ file of ``lab`` solved, and
    in ``rel`` ``old`` replaced by ``new`` (it must occur once), as in each of ``more``; all of them are back
    to their unwritten holes after the test."""
    files = {h.path.removeprefix("solutions/") for h in make_labs.all_holes()}
    written: list[str] = []

    def write(lab: str, rel: str = "", old: str = "", new: str = "", more: tuple = ()) -> None:
        changes = [(rel, old, new), *more]  # more: further (rel, old, new) mistakes, each in its own function
        for other in sorted(
            f for f in files if labs_file(scratch, f, frozenset({lab})) != labs_file(scratch, f)
        ):
            text = labs_file(scratch, other, frozenset({lab}))
            for path, before, after in changes:
                if other == path and before:
                    assert text.count(before) == 1, (
                        f"the planted mistake no longer matches the reference code: {before!r}"
                    )
                    text = text.replace(before, after)
            (scratch / "labs" / other).write_text(text)
            written.append(other)

    yield write
    for rel in written:
        (scratch / "labs" / rel).write_text(labs_file(scratch, rel))


MISTAKES = [
    pytest.param(
        "4",
        "speculative/rejection.py",
        "    q_next = q_next * rejected[:, None]\n",
        "",
        ["tests/test_spec.py", "-k", "after_the_last_kept"],
        "draw it from p itself, not from the residual max(0, p - q)",
        id="lab4-bonus-token-from-the-residual",
    ),
    pytest.param(
        "4",
        "speculative/rejection.py",
        "accepted = (uniforms * q_draft < p_draft) & valid",
        "accepted = uniforms * q_draft < p_draft",
        ["tests/test_spec.py", "-k", "padding"],
        "positions at or past num_drafts[b] are padding",
        id="lab4-padding-drafts-accepted",
    ),
    pytest.param(
        "4",
        "speculative/tree.py",
        "            mask[i] = mask[parent]",
        "            mask[i, parent] = True",
        ["tests/test_spec.py", "-k", "tree_attention_mask"],
        "a node sees itself and everything its parent sees",
        id="lab4-tree-mask-sees-only-the-parent",
    ),
    pytest.param(
        "3",
        "engine/scheduler.py",
        " and not out.preempted:",
        ":",
        ["tests/test_scheduler.py", "-k", "preempts_admits_nobody"],
        "a step that had to preempt admits nobody",
        id="lab3-admits-in-a-step-that-preempted",
    ),
    pytest.param(
        "3",
        "engine/scheduler.py",
        "            num_new = min(request.num_tokens - prefix.num_tokens, budget)\n"
        "            if not self.kv.allocate_slots(request, num_new, prefix):\n",
        "            num_new = min(request.num_tokens, budget)\n"
        "            if not self.kv.allocate_slots(request, num_new):\n",
        ["tests/test_scheduler.py", "-k", "reuses_the_prefix_cache"],
        "pass the prefix to allocate_slots with the tokens after it",
        id="lab3-prefix-cache-skipped",
    ),
    pytest.param(
        "3",
        "engine/scheduler.py",
        "            if not self.kv.allocate_slots(request, num_new, prefix):\n"
        "                break\n"
        "            request.num_computed = prefix.num_tokens\n",
        "            request.num_computed = prefix.num_tokens\n"
        "            if not self.kv.allocate_slots(request, num_new, prefix):\n"
        "                break\n",
        ["tests/test_scheduler.py", "-k", "failed_admission"],
        "set num_computed = prefix.num_tokens after allocate_slots admits it",
        id="lab3-computed-set-before-the-admission",
    ),
    pytest.param(
        "2",
        "kernels/paged_attention.py",
        "offset = pos % BLOCK_SIZE",
        "offset = (pos + 1) % BLOCK_SIZE",  # off by one, yet inside the cache: safe on a GPU too
        ["tests/test_paged_attention.py", "-k", "head_dim_128_and_scale or poisoned"],
        "block_table[b, p // block_size], offset p % block_size",
        id="lab2-block-table-walk-off-by-one",
    ),
    pytest.param(
        "2",
        "cache/block_allocator.py",
        "        if self.ref_counts[block] == 0:\n"
        '            raise ValueError(f"double free of block {block}: its reference count is already 0")\n',
        "",
        ["tests/test_block_allocator.py", "-k", "double_free"],
        "is a double free, but no ValueError was raised",
        id="lab2-double-free-accepted",
    ),
    pytest.param(
        "2",
        "cache/kv_cache_manager.py",
        "                self.prefix_cache.park(block)",
        "                self.allocator.release(block)",
        ["tests/test_prefix_cache.py", "-k", "reused_then_evicted"],
        "a's full blocks keep their contents in the LRU",
        id="lab2-cached-block-released-not-parked",
    ),
    pytest.param(
        "5",
        "model/moe_router.py",
        "    counts = torch.bincount(routing.experts.flatten(), minlength=num_experts)\n"
        "    fraction = counts.float() / routing.experts.numel()",
        "    counts = torch.bincount(routing.experts[:, 0], minlength=num_experts)\n"
        "    fraction = counts.float() / routing.experts.shape[0]",
        ["tests/test_moe.py", "-k", "hand_computed"],
        "not only each token's first choice",
        id="lab5-balance-loss-counts-first-choices-only",
    ),
    pytest.param(
        "5",
        "kernels/moe_permute.py",
        "order = torch.argsort(flat, stable=True)",
        "order = torch.argsort(flat)",
        ["tests/test_moe.py", "-k", "permutation_invariants"],
        "with a stable sort",
        id="lab5-unstable-sort",
    ),
]


@pytest.mark.parametrize("lab, rel, old, new, tests, message", MISTAKES)
def test_grader_names_the_planted_mistake(scratch, write_lab, lab, rel, old, new, tests, message):
    write_lab(lab, rel, old, new)
    status, report = grade(scratch, lab, *tests)
    assert status == 1, f"the grader passed a planted mistake (exit {status}):\n{report}"
    assert message in report, f"the grader failed without naming the mistake ({message!r}):\n{report}"
    assert len(report.splitlines()) <= MAX_REPORT_LINES, (
        f"the report runs past {MAX_REPORT_LINES} lines:\n{report}"
    )


def test_an_unwritten_lab_reports_one_line_per_hole(scratch):
    holes = [h for h in make_labs.all_holes() if h.lab == "2"]
    status, report = grade(
        scratch, "2", "tests/test_block_allocator.py"
    )  # every hole is listed, whichever tests run
    assert status == 1, report
    lines = report.splitlines()
    assert len(lines) <= MAX_REPORT_LINES, (
        f"an unwritten lab's report runs past {MAX_REPORT_LINES} lines:\n{report}"
    )
    for hole in holes:
        named = [line for line in lines if line.lstrip().startswith("to write:") and hole.function in line]
        assert len(named) == 1, f"{hole.function} should have one 'to write' line:\n{report}"
    assert "FAILED" not in report, (
        f"an unwritten hole is reported as a failure, not as a hole to write:\n{report}"
    )


def test_a_solved_lab_passes_alone_and_says_what_the_engine_still_needs(scratch, write_lab):
    """Lab 3's scheduler drives Lab 2's KV-cache manager, unwritten in labs/: graded alone, it runs on the
    reference manager and passes."""
    write_lab("3", "engine/scheduler.py")
    status, report = grade(scratch, "3", "tests/test_scheduler.py")
    assert status == 0, f"a correctly written Lab 3 failed:\n{report}"
    assert "Lab 3 passes" in report and "03_continuous_batching.ipynb" in report, report
    needs = next((line for line in report.splitlines() if "from labs import LLM" in line), "")
    assert "still to write" in needs and "2" in needs.split("still to write")[1], (
        f"the report must say which labs the engine still needs (Lab 2 is unwritten):\n{report}"
    )


# Mistakes in the precisions and configurations the engine runs (a bfloat16 model, speculative decoding, INT4
# weights, a batch of chains of different lengths, CUDA graphs), which the graders once let pass. One grader
# run per lab plants them all at once, each in its own function, so each must be named in the same report.
ENGINE_MISTAKES = [
    pytest.param(
        "0",
        [
            (
                "model/llama.py",
                "x32.pow(2).mean(dim=-1, keepdim=True)",
                "x32.pow(2).mean(dim=1, keepdim=True)",
                "not dim=1",
            ),
            (
                "model/llama.py",
                "    half = x.shape[-1] // 2\n",
                "    half = x.shape[-1] // 2\n    x = x.float()\n",  # rotated in float32, never cast back
                "apply_rope returned torch.float32 for bfloat16 q/k",
            ),
            (
                "kernels/attention.py",
                "[None, :] + (lens[:, None] - q_len)",
                "[None, :] + (k_len - q_len)",
                "the causal shift is per sequence",
            ),
        ],
        ["tests/test_lab0_model_parts.py", "-k", "any_rank or keeps_bfloat16 or causal_over_padded"],
        id="lab0-dim-1-rope-in-float32-causal-over-padding",
    ),
    pytest.param(
        "1",
        [
            (
                "kernels/flash_attention.py",
                '    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)\n',
                "    m_safe = m_new\n",
                "_online_softmax_step lacks the -inf guard",
            )
        ],
        ["tests/test_flash_attention.py", "-k", "see_no_key"],
        id="lab1-kernel-without-the-guard",
    ),
    pytest.param(
        "1",
        [
            (
                "kernels/flash_attention.py",
                "    alpha = tl.math.exp2(m_i - m_safe)\n",
                "    alpha = tl.math.exp2(m_i - m_new)\n",  # guarded p, unguarded rescale
                "_online_softmax_step lacks the -inf guard",
            )
        ],
        ["tests/test_flash_attention.py", "-k", "see_no_key"],
        id="lab1-kernel-rescale-unguarded",
    ),
    pytest.param(
        "2",
        [
            (
                "cache/kv_cache_manager.py",
                "self._keys[child.request_id] = list(self._keys[parent.request_id])",
                "self._keys[child.request_id] = self._keys[parent.request_id]",
                "the parent's list of chained keys itself, not a copy",
            ),
            (
                "cache/block_allocator.py",
                "        if self.ref_counts[block] == 0:\n"
                '            raise ValueError(f"double free of block {block}: '
                'its reference count is already 0")\n'
                "        self.ref_counts[block] -= 1\n",
                "        self.ref_counts[block] -= 1\n"
                "        if self.ref_counts[block] < 0:\n"
                '            raise ValueError(f"double free of block {block}: '
                'its reference count is already 0")\n',
                "check the count before you decrement it",
            ),
        ],
        ["tests/test_block_allocator.py", "-k", "own_blocks or changes_nothing"],
        id="lab2-fork-shares-keys-decref-checks-after",
    ),
    pytest.param(
        "3",
        [
            (
                "engine/scheduler.py",
                "num_new = min(self._tokens_needed(request), budget)",
                "num_new = min(request.num_tokens - request.num_computed, budget)",
                "self._tokens_needed(request)",
            ),
            (
                "engine/scheduler.py",
                "            request.status = Status.RUNNING\n",
                "",
                "set request.status = Status.RUNNING",
            ),
        ],
        ["tests/test_scheduler.py", "-k", "with_its_drafts or marked_running"],
        id="lab3-drafts-unscheduled-status-unset",
    ),
    pytest.param(
        "4",
        [
            (
                "speculative/rejection.py",
                "rejected = num_accepted < num_drafts.to(device)",
                "rejected = num_accepted < k",
                "'rejected' compared with K instead of num_drafts[b]",
            ),
            (
                "speculative/tree.py",
                "mask = torch.zeros(n, n, dtype=torch.bool)",
                "mask = torch.zeros(n, n)",
                "tree_attention_mask returned torch.float32",
            ),
        ],
        ["tests/test_spec.py", "-k", "drafted_fewer or is_boolean"],
        id="lab4-rejected-against-k-float-tree-mask",
    ),
    pytest.param(
        "5",
        [
            (
                "model/moe_router.py",
                "    probs = torch.softmax(router_logits.float(), dim=-1)\n"
                "    weights, experts = probs.topk(top_k, dim=-1)\n",
                "    probs = torch.softmax(router_logits, dim=-1)\n"  # in the logits' bfloat16, cast after
                "    weights, experts = probs.topk(top_k, dim=-1)\n"
                "    probs, weights = probs.float(), weights.float()\n",
                "compute the softmax and the top-k in float32",
            ),
            (
                "kernels/moe_permute.py",
                "    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)\n"
                "    counts.index_add_(0, flat, torch.ones_like(flat))\n",
                "    counts = torch.bincount(flat, minlength=num_experts)\n",
                "Likely: torch.bincount",
            ),
        ],
        ["tests/test_moe.py", "-k", "bfloat16_logits or no_value_back"],
        id="lab5-routing-in-bf16-counts-by-bincount",
    ),
    pytest.param(
        "6",
        [
            (
                "quant/awq.py",
                "scales = x_mean.pow(alpha).clamp(min=1e-4)",
                "scales = x_mean.pow(alpha)",
                "not clamped (clamp(min=1e-4))",
            ),
            (  # packed with a stride, and unpacked with the same one: the round trip cannot see it
                "quant/pack.py",
                "values.to(torch.int32).reshape(*values.shape[:-1], -1, VALUES_PER_WORD)",
                "values.to(torch.int32).reshape(*values.shape[:-1], VALUES_PER_WORD, -1).transpose(-1, -2)",
                "pack_int4 strides",
            ),
            (
                "quant/pack.py",
                "return fields.reshape(*packed.shape[:-1], -1).to(torch.uint8)",
                "return fields.transpose(-1, -2).reshape(*packed.shape[:-1], -1).to(torch.uint8)",
                "pack_int4 strides",
            ),
        ],
        ["tests/test_quant.py", "-k", "never_fires or neighbours or round_trip or bit_4k"],
        id="lab6-scales-unclamped-packing-strided",
    ),
    pytest.param(
        "7",
        [
            (
                "fast_mode/planner.py",
                "ttft = prompt_tokens / fmt.prefill_tokens_per_s + step",
                "ttft = prompt_tokens / fmt.prefill_tokens_per_s + fmt.step_s(batch)",
                "not a plain decode step",
            ),
            (
                "fast_mode/planner.py",
                "for speculation in profile.drafters(fmt):",
                "for speculation in profile.drafters(profile.formats[0]):",
                "that was measured with another weight format",
            ),
        ],
        ["tests/test_fast_mode.py", "-k", "by_hand and (ttft or drafters)"],
        id="lab7-ttft-after-a-plain-step-drafters-of-another-format",
    ),
    pytest.param(
        "9",
        [
            (
                "parallel/layers.py",
                "        out = self.linear(x)\n",
                "        out = torch.nn.functional.linear(x, self.weight)\n",
                "the local module may hold packed INT4 codes",
            ),
            (
                "parallel/layers.py",
                "out = out.masked_fill(~mine.unsqueeze(-1), 0)",
                "out = out * mine.unsqueeze(-1).float()",
                "a float mask (mine.float())",
            ),
        ],
        ["tests/test_tensor_parallel.py", "-k", "int4_and_bfloat16 or flat_batch"],
        id="lab9-product-from-the-weight-float-mask",
    ),
]


@pytest.mark.parametrize("lab, mistakes, tests", ENGINE_MISTAKES)
def test_grader_names_each_mistake_the_engine_would_meet(scratch, write_lab, lab, mistakes, tests):
    (rel, old, new, _), *more = mistakes
    write_lab(lab, rel, old, new, more=tuple(m[:3] for m in more))
    status, report = grade(scratch, lab, *tests)
    assert status == 1, f"the grader passed the planted mistakes (exit {status}):\n{report}"
    for *_, message in mistakes:
        assert message in report, f"the grader did not name a planted mistake ({message!r}):\n{report}"
    assert len(report.splitlines()) <= MAX_REPORT_LINES, (
        f"the report runs past {MAX_REPORT_LINES} lines:\n{report}"
    )
