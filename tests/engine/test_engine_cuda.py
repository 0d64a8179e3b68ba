"""The GPU paths: CUDA-graph decode, compiled ops, W12 kernels in the model (skipped on CPU)."""

from __future__ import annotations

import pytest
import torch

from engine.bench import bench_decode
from engine.generate import Engine
from engine.weights import load_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3, 4], [100, 20, 30, 40]]


def step_logits(engine: Engine, steps: int, forced: list[torch.Tensor] | None = None):
    """Logits of prefill and ``steps`` decode steps, feeding ``forced`` tokens if given."""
    logits, seen, fed = engine.prefill(PROMPTS), [], []
    for i in range(steps):
        seen.append(logits.clone())  # a graph replay overwrites its output buffer
        fed.append(forced[i] if forced is not None else logits.argmax(-1))
        logits = engine.step(fed[-1])
    return seen, fed


@pytest.mark.parametrize("mode", ["bf16", "w12"])
@pytest.mark.parametrize("compile_ops", [False, True])
def test_graph_decode_equals_eager_decode(mode, compile_ops):
    model = load_model("synthetic:tiny-qwen3", mode=mode, device="cuda").model
    eager, tokens = step_logits(Engine(model, batch=3, max_seq_len=64, cuda_graph=False), 16)
    graphed = Engine(model, batch=3, max_seq_len=64, cuda_graph=True, compile=compile_ops)
    assert graphed.graph is not None
    replayed, _ = step_logits(graphed, 16, forced=tokens)
    for a, b in zip(eager, replayed, strict=True):
        if compile_ops:  # fused kernels round differently
            assert ((a - b).norm() / a.norm()).item() < 5e-2
        else:
            assert torch.equal(a, b)


def test_w12_logits_close_to_bf16_on_gpu():
    tokens = torch.randint(0, 256, (4, 32), device="cuda",
                           generator=torch.Generator(device="cuda").manual_seed(0))
    logits = {}
    for mode in ("bf16", "w12"):
        model = load_model("synthetic:tiny-qwen3", mode=mode, device="cuda").model
        with torch.inference_mode():
            logits[mode] = model.score(tokens)
    err = (logits["w12"] - logits["bf16"]).norm() / logits["bf16"].norm()
    assert torch.isfinite(logits["w12"]).all() and err.item() < 2e-2


def test_bench_runs_both_modes_on_gpu():
    rows = bench_decode("synthetic:tiny-qwen3", batches=[1, 8], tokens=8, warmup=2,
                        device="cuda", compile=False, log=lambda line: None)
    assert [(r.mode, r.batch) for r in rows] == [("bf16", 1), ("bf16", 8), ("w12", 1),
                                                 ("w12", 8)]
    assert all(r.cuda_graph and r.gpu_weight_bytes > 0 for r in rows)


@pytest.mark.parametrize("mode", ["bf16", "w12"])
def test_tree_attention_decodes_like_torch_attention(mode):
    """The tree-attention kernels inside graph-captured steps: logits within rounding of the
    torch attention path, fed the same tokens."""
    model = load_model("synthetic:tiny-qwen3", mode=mode, device="cuda").model
    plain, tokens = step_logits(Engine(model, batch=3, max_seq_len=100, attention="torch"), 16)
    fused = Engine(model, batch=3, max_seq_len=100, attention="tree")
    assert fused.graph is not None and fused.attention == "tree"
    replayed, _ = step_logits(fused, 16, forced=tokens)
    for a, b in zip(plain, replayed, strict=True):
        assert torch.isfinite(b).all()
        assert ((a - b).norm() / a.norm()).item() < 2e-2


def test_sampling_rows_do_not_depend_on_the_row_count():
    """The top-p nucleus and the keyed draw of a row are the same whether the row is drawn
    alone (plain decoding at batch 1) or among the rows of a verify step (a lone row's cumsum
    takes another CUDA kernel than a batch's)."""
    from engine.sampling import Sampling, choose, row_cumsum, top_p_mask

    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(64, 49152, generator=gen) * 4).cuda()
    probs = torch.softmax(logits, dim=-1).sort(dim=-1, descending=True)[0]
    full = row_cumsum(probs)
    mask = top_p_mask(logits, 0.9)
    sampling = Sampling(0.7, 0.9, 5)
    picks = choose(logits, sampling, torch.zeros(64, dtype=torch.long, device="cuda"),
                   torch.arange(64, device="cuda"))
    for r in range(0, 64, 7):
        assert torch.equal(row_cumsum(probs[r:r + 1]), full[r:r + 1])
        assert torch.equal(top_p_mask(logits[r:r + 1], 0.9), mask[r:r + 1])
        one = choose(logits[r:r + 1], sampling, torch.zeros(1, dtype=torch.long, device="cuda"),
                     torch.tensor([r], device="cuda"))
        assert int(one) == int(picks[r])


def test_graphs_capture_no_unzeroed_gemm_state():
    """The engine's and the speculative runner's graphs are captured on the stream their warm-up
    ran on, so the GEMM's zero-started per-stream state (K-split counters, stream-K flags) is
    created eagerly, never as a zero fill that only one graph's replay runs."""
    import warnings

    from engine.speculative.decode import SpecRunner
    from engine.speculative.drafters import make_drafter

    model = load_model("synthetic:smollm2-135m", mode="w12", device="cuda").model
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        engine = Engine(model, batch=8, max_seq_len=256)
        SpecRunner(engine, make_drafter("ngram", model), budget=16, tree=False)
        SpecRunner(engine, make_drafter("ngram", model), budget=16, tree=True)
    assert not [w for w in seen if "during CUDA graph capture" in str(w.message)]
