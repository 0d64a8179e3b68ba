"""The certified INT8 LM head's reference: its bounds hold and its choice is the exact head's."""

from __future__ import annotations

import int8_head_interp_runner as runner
import interp_harness
import pytest
import torch

from engine.sampling import gumbel_noise, row_keys
from w12.errors import W12Error
from w12_kernels.int8_head import candidates, certified_choice, logit_bounds, quantize


def _case(v, k, rows, seed, *, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(v, k, generator=g) * 0.05).to(torch.bfloat16)
    h = (torch.randn(rows, k, generator=g) * spread).to(torch.bfloat16)
    h[0, 3] = 40.0  # an outlier channel, as real hidden states have
    return w, h


def _exact(w, h):
    return (h @ w.T).float()  # the exact head as the engine computes it: BF16 out, then float


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_exact_logit_lies_inside_its_bounds(seed):
    w, h = _case(3000, 576, 16, seed)
    head = quantize(w)
    approx, lo, hi = logit_bounds(head, h)
    exact = _exact(w, h).double()
    assert (lo <= exact).all() and (exact <= hi).all()
    assert (lo <= approx).all() and (approx <= hi).all()
    # not vacuous: a small part of the trivial interval |h.w| <= ||h|| ||w||
    trivial = 2 * h.double().norm(dim=1)[:, None] * w.double().norm(dim=1)[None, :]
    assert float(((hi - lo) / trivial).median()) < 0.05


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_the_certified_choice_is_the_exact_heads(temperature):
    w, h = _case(5000, 256, 64, 3, spread=3.0)
    exact = _exact(w, h)
    _, lo, hi = logit_bounds(quantize(w), h)
    noise = None
    if temperature:
        keys = row_keys(7, torch.arange(h.shape[0]), torch.full((h.shape[0],), 11))
        noise = gumbel_noise(keys, w.shape[0])
        want = (exact / temperature + noise).argmax(dim=1)
    else:
        want = exact.argmax(dim=1)
    asked = []

    def exact_rows(r, ids):
        asked.append(len(ids))
        return exact[r, ids]

    tokens, counts = certified_choice(exact_rows, lo, hi, temperature=temperature, noise=noise)
    assert torch.equal(tokens, want)
    assert counts.tolist() == asked and counts.min() >= 1
    assert counts.float().mean() < 0.2 * w.shape[0]  # the recompute is a small part


def test_ties_go_to_the_first_maximal_entry_as_argmax():
    w = torch.zeros(6, 8, dtype=torch.bfloat16)
    w[2, 0] = w[4, 0] = 1.0  # two equal best rows
    h = torch.ones(1, 8, dtype=torch.bfloat16)
    exact = _exact(w, h)
    _, lo, hi = logit_bounds(quantize(w), h)
    tokens, counts = certified_choice(lambda r, ids: exact[r, ids], lo, hi)
    assert tokens.tolist() == [2] and candidates(lo, hi)[0, 2:5:2].all()


def test_bad_inputs_are_refused():
    w, h = _case(10, 16, 2, 0)
    with pytest.raises(W12Error, match="non-finite"):
        quantize(torch.full((2, 3), float("inf")))
    with pytest.raises(W12Error, match="hidden states"):
        logit_bounds(quantize(w), h[:, :8])
    _, lo, hi = logit_bounds(quantize(w), h)
    with pytest.raises(W12Error, match="sampling needs"):
        candidates(lo, hi, temperature=0.5)


interpreter_verdicts = interp_harness.verdicts_fixture(__file__, "int8_head_interp_runner.py")


@pytest.mark.parametrize("case", [*runner.CASES, *(f"greedy_{c}" for c in runner.CASES)])
def test_interpreted_kernel(interpreter_verdicts, case):
    """The Triton kernel's product is the reference's to float32 sums, and bounds built on it
    still hold the exact head's logits; its certifying epilogue keeps the exact argmax."""
    assert interpreter_verdicts[case] == "ok", interpreter_verdicts[case]



@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [1, 20, 64])
def test_gpu_kernel_product_and_bounds(rows):
    """On the GPU (BF16 tensor-core sums): the product within float32 sums of the reference's,
    and bounds built on it hold the exact head's logits."""
    from w12_kernels.int8_head.launcher import approx_logits

    w, h = _case(4099, 576, rows, 5, spread=2.0)
    head = quantize(w)
    got = approx_logits(h.cuda(), head.q.cuda(), head.scale.cuda()).cpu()
    want, _, _ = logit_bounds(head, h)
    slack = 1e-5 * (h.double().abs() @ head.q.double().abs().T) * head.scale.double()
    assert ((got.double() - want).abs() <= slack).all()
    _, lo, hi = logit_bounds(head, h, approx=got)
    exact = _exact(w.cuda(), h.cuda()).cpu().double()
    assert ((lo <= exact) & (exact <= hi)).all()


@pytest.mark.parametrize("k, seed", [(576, 0), (5120, 1)])
def test_float32_bounds_contain_the_float64_ones(k, seed):
    """``certify.bounds32`` (float32 on the device) widens past ``logit_bounds`` (float64):
    every interval contains the reference's, however large the logits."""
    from w12_kernels.int8_head.certify import DeviceHead, bounds32

    w, h = _case(700, k, 8, seed, spread=4.0)
    h[1] *= 64  # large hidden states: large logits and radii
    head = quantize(w)
    approx = (h.float() @ head.q.float().T) * head.scale[None, :]
    _, lo64, hi64 = logit_bounds(head, h, approx=approx)
    lo, hi = bounds32(DeviceHead.of(head), h, approx)
    assert lo.dtype == torch.float32
    assert (lo.double() <= lo64).all() and (hi.double() >= hi64).all()
    # and not much wider
    assert ((hi.double() - lo.double()) <= (hi64 - lo64) * 1.001 + 1e-30).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [1, 20, 64, 128])
def test_linear_rows_have_the_whole_products_bits(rows):
    """The certified head's recompute: the candidate rows of a W12 head, gathered by tile, get
    the bits the whole head gives them (escapes included), at every row count it takes."""
    import w12
    from w12_kernels.gemm import prepare_weight, w12_linear
    from w12_kernels.gemm.rows import linear_rows

    w, h = _case(4099, 576, rows, 6, spread=2.0)
    w[17, 5], w[4000, 100], w[9, 9] = 1e-30, 3e30, 0.0  # escapes
    pw = prepare_weight(w12.encode(w), device="cuda")
    assert pw.num_escapes > 0
    x = h.cuda()
    whole = w12_linear(x, pw, None)
    ids = torch.tensor([0, 9, 17, 18, 500, 4000, 4098], device="cuda")
    got = linear_rows(x, pw, ids)
    assert torch.equal(got.view(torch.int16), whole[:, ids].view(torch.int16))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [1, 20, 64])
def test_gpu_fused_certification_keeps_the_exact_argmax(rows):
    """The bounds in the product's epilogue (BF16 tensor cores): every row's candidates hold
    the exact head's argmax, and they are a small part of the vocabulary."""
    from w12_kernels.int8_head import DeviceHead, greedy_candidates

    w, h = _case(4099, 576, rows, 7, spread=2.0)
    mask = greedy_candidates(h.cuda(), DeviceHead.of(quantize(w), "cuda")).cpu()
    exact = _exact(w.cuda(), h.cuda()).cpu()
    assert mask.gather(1, exact.argmax(1, keepdim=True)).all()
    assert mask.sum(1).max() < w.shape[0] // 4


def test_candidate_tiles_are_the_first_flagged_tiles_in_order():
    from w12_kernels.int8_head import candidate_tiles

    cand = torch.zeros(2, 100, dtype=torch.bool)
    cand[0, 3] = cand[0, 33] = cand[1, 50] = cand[1, 99] = True  # tiles 0, 2, 3, 6
    tiles, needed = candidate_tiles(cand, 5)
    assert tiles.tolist() == [0, 2, 3, 6, 0] and int(needed) == 4
    tiles, needed = candidate_tiles(cand, 2)  # too few: the first two, and the count
    assert tiles.tolist() == [0, 2] and int(needed) == 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [1, 20, 64])
def test_gpu_certified_picks_are_the_exact_heads(rows):
    """The fixed-shape certified choice (candidates' tiles recomputed, no read-back) picks the
    exact head's argmax on every row, and, captured in a CUDA graph and replayed on other
    hidden states, still does."""
    import w12
    from w12_kernels.gemm import prepare_weight, w12_linear
    from w12_kernels.gemm.rows import linear_tiles, tile_escapes
    from w12_kernels.int8_head import DeviceHead, certified_picks, greedy_candidates

    w, h = _case(4099, 576, rows, 8, spread=2.0)
    w[17, 5], w[4000, 100] = 1e-30, 3e30  # escapes
    pw = prepare_weight(w12.encode(w), device="cuda")
    head = DeviceHead.of(quantize(w), "cuda")
    cap = 200
    room = cap * tile_escapes(pw)
    x = h.cuda()
    tiles = torch.tensor([0, 250, 1, 1], device="cuda")
    rows_of = (tiles[:, None] * 16 + torch.arange(16, device="cuda")).view(-1)
    got = linear_tiles(x, pw, tiles, 4 * tile_escapes(pw))
    assert torch.equal(got.view(torch.int16), w12_linear(x, pw, None)[:, rows_of].view(torch.int16))

    def pick(x):
        return certified_picks(x, greedy_candidates(x, head), pw, cap, room)

    picks, needed = pick(x)
    assert int(needed) <= cap
    assert torch.equal(picks, w12_linear(x, pw, None).float().argmax(1))
    static = x.clone()
    pick(static)  # compiled before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, out_needed = pick(static)
    _, other = _case(4099, 576, rows, 9, spread=2.0)
    static.copy_(other.cuda())
    graph.replay()
    assert int(out_needed) <= cap
    assert torch.equal(out, w12_linear(static, pw, None).float().argmax(1))
