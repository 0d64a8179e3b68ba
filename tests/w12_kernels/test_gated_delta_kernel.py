"""The gated-delta path kernel (w12_kernels/gated_delta): under the Triton interpreter against
the float64 reference, decode steps' bits equal to path verify's, commit; shape checks."""

from __future__ import annotations

import gated_delta_interp_runner as runner
import interp_harness
import pytest
import torch

from w12_kernels.gated_delta.launcher import check_inputs, walk_plan

interpreter_verdicts = interp_harness.verdicts_fixture(__file__, "gated_delta_interp_runner.py")


@pytest.mark.parametrize("case", list(runner.CASES))
def test_interpreted_kernel(interpreter_verdicts, case):
    assert interpreter_verdicts[case] == "ok", interpreter_verdicts[case]


def test_walk_plan_visits_depth_first_and_reuses_slots():
    # 0 -> {1, 2, 9}, 1 -> {3, 4}, 2 -> {5}, 3 -> {8}, 5 -> {6}, 6 -> {7}; then a padding row
    parents = [-1, 0, 0, 1, 1, 2, 5, 6, 3, 0]
    nodes = torch.cat([runner.paths(parents, 1), torch.full((1, 1, 10), -1, dtype=torch.int32)],
                      dim=1)
    nodes = torch.cat([nodes, torch.full((1, 11, 1), -1, dtype=torch.int32)], dim=2)
    order, parent, slot = walk_plan(nodes)
    assert order.tolist() == [[0, 1, 3, 8, 4, 2, 5, 6, 7, 9, -1]]
    assert parent.tolist()[0][:10] == parents
    # a node keeps its parent's slot when it is the parent's last child, else takes one more
    assert slot.tolist() == [[0, 1, 1, 2, 1, 1, 1, 1, 2, 0, 0]]
    chain = runner.paths(list(range(-1, 15)), 2)
    assert walk_plan(chain)[2].max() == 0  # a chain needs one slot


def test_bad_shapes_are_named():
    state, q, k, v, decay, beta = runner.inputs(1, 2, 16, 32, 3)
    nodes = runner.paths([-1, 0, 1], 1)
    assert check_inputs(state, q, k, v, decay, beta, nodes) == (1, 3, 2, 16, 32, 3)
    with pytest.raises(ValueError, match="state"):
        check_inputs(state.double(), q, k, v, decay, beta, nodes)
    with pytest.raises(ValueError, match="v "):
        check_inputs(state, q, k, v[..., :16], decay, beta, nodes)
    with pytest.raises(ValueError, match="DK"):
        s, q2, k2, v2, d2, b2 = runner.inputs(1, 2, 24, 32, 3)
        check_inputs(s, q2, k2, v2, d2, b2, nodes)
    with pytest.raises(ValueError, match="nodes"):
        check_inputs(state, q, k, v, decay, beta, nodes.float())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", list(runner.CASES))
def test_gpu_kernel(case):
    runner.check(*runner.CASES[case], device="cuda")
