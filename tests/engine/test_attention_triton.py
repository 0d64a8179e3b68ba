"""The Triton decode-attention kernel (engine/attention_triton.py): under the interpreter on
the CPU at awkward shapes (cache not a multiple of the block, grouped heads that do not fill a
block, several steps per row as in verification), and on a GPU when there is one."""

from __future__ import annotations

import attention_interp_runner as runner
import interp_harness
import pytest
import torch

interpreter_verdicts = interp_harness.verdicts_fixture(__file__, "attention_interp_runner.py")


@pytest.mark.parametrize("case", list(runner.CASES))
def test_interpreted_kernel_within_budget(interpreter_verdicts, case):
    assert interpreter_verdicts[case] == "ok", interpreter_verdicts[case]


@pytest.mark.parametrize("case", list(runner.KV_CASES))
def test_interpreted_kv_write_equals_scatter(interpreter_verdicts, case):
    assert interpreter_verdicts[case] == "ok", interpreter_verdicts[case]


def test_budget_catches_a_wrong_mask():
    """The check used above fails on attention that sees one slot too many."""
    q, k, v, pos = runner.inputs(2, 1, 8, 2, 64, 100, [[37], [60]])
    want = runner.reference(q, k, v, pos)
    wrong = runner.reference(q, k, v, pos + 1)
    assert runner.rel_err(wrong, want) > 0.05


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", list(runner.CASES))
def test_kernel_on_the_gpu(case):
    b, t, hq, hkv, d, s, positions = runner.CASES[case]
    from engine import ops
    from engine.attention_triton import decode_attention

    q, k, v, pos = runner.inputs(b, t, hq, hkv, d, s, positions)
    want = runner.reference(q, k, v, pos)
    got = decode_attention(q.cuda(), k.cuda(), v.cuda(), pos.cuda()).cpu()
    visible = torch.arange(s)[None, None, :] <= pos[:, :, None]
    torch_path = ops.cached_attention(q.cuda(), k.cuda(), v.cuda(), visible.cuda()).cpu()
    assert torch.isfinite(got.float()).all()
    assert runner.rel_err(got, want) <= 2 * runner.rel_err(torch_path, want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", list(runner.KV_CASES))
def test_kv_write_on_the_gpu(case):
    runner.check_kv_case(*runner.KV_CASES[case], device="cuda")
