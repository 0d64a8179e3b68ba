"""Benchmark: the certified INT8 LM head's INT8 product against the exact W12 head.

For each head shape (vocabulary x hidden: Qwen3's 151936 x 5120 and 151936 x 4096, Llama's
128256 x 4096) and each row count M, one CUDA graph per candidate, replayed in turn
(``harness.time_graphs``):

- ``w12``: the W12 head (the engine's exact head), ``w12_linear``'s dispatch;
- ``int8``: the INT8 head's approximate logits (``w12_kernels.int8_head.approx_logits``);
- ``int8+bounds``: that plus the certification: each row's norm, every entry's interval
  (``certify.bounds32``), the best lower bound and the candidate mask (torch ops);
- ``fused``: the same mask from the product with the bounds in its epilogue
  (``launcher.greedy_candidates``: one kernel, a [M, blocks] maximum, one comparison);
- ``graph``: the whole certified greedy choice as the engine makes it on a GPU: the fused
  candidates, then ``certified_picks`` (the candidates' 16-row tiles, ``TILES`` of them,
  recomputed from the W12 head with its bits, the choice among them), fixed shapes, no
  read-back. Where the candidates span more than ``TILES`` tiles ("fits" no) the engine runs
  the exact head after it.

Then, without graphs (the candidate count is read back to size the recompute), each run in
turn, round after round (``harness.time_host``, ``REPEAT`` calls a sample):

- ``w12 eager``: the W12 head;
- ``certified``: the whole certified greedy choice: the fused candidates, their union read
  back, their rows recomputed from the W12 head's tiles (``gemm.rows.linear_rows``) and the
  choice among them.

Before timing, the certified tokens are checked against the W12 head's argmax, and the
reference's float64 bounds against the W12 head's logits (first 8,192 vocabulary rows). The
weights are random (``0.02 N(0, 1)``), the hidden states random with one outlier channel plus,
with ``--margin G``, a push along one random vocabulary row per hidden state that lifts its
logit by G standard deviations of the row's logits: random logits crowd the top (margin 0: the
candidate count is far above a trained model's), a trained model's best logit stands clear
(the demo model's candidates: ``lab/int8_head_candidates.py``).

    python benchmarks/int8_head.py --m 1,8,32,64 --margins 0,6 --json results/int8_head.json
"""

from __future__ import annotations

import argparse

import torch
from harness import environment, project_on_path, time_graphs, time_host, write_json

project_on_path()

import w12  # noqa: E402
from w12_kernels.gemm import dispatch  # noqa: E402
from w12_kernels.gemm.layout import prepare_weight  # noqa: E402
from w12_kernels.gemm.rows import linear_rows, tile_escapes  # noqa: E402
from w12_kernels.int8_head import (  # noqa: E402
    candidates,
    certified_picks,
    greedy_candidates,
    quantize,
)
from w12_kernels.int8_head.certify import DeviceHead, bounds32  # noqa: E402
from w12_kernels.int8_head.launcher import approx_logits  # noqa: E402

SHAPES = ((151936, 5120), (151936, 4096), (128256, 4096))


def w12_head(x, pw):
    return dispatch.linear(x, pw.chunks, pw.scale, pw.e0, pw.esc_rowptr, pw.esc_row,
                           pw.esc_col, pw.esc_val, pw.esc_delta, pw.esc_order, pw.esc_entry,
                           pw.esc_fix, None, pw.n, pw.k)


REPEAT = 4
TILES = 256  # the engine's MAX_TILES (engine.head)


def certify(x, dh):
    """The candidate mask on the device."""
    lo, hi = bounds32(dh, x, approx_logits(x, dh.q, dh.scale))
    return candidates(lo, hi)


def certified(x, pw, dh):
    """The certified greedy tokens [M] (engine.head's choice, written out here)."""
    cand = greedy_candidates(x, dh)
    ids = cand.any(dim=0).nonzero()[:, 0]
    exact = linear_rows(x, pw, ids).float().masked_fill(~cand[:, ids], float("-inf"))
    return ids[exact.argmax(dim=1)]


def hidden_states(weight, m, gen, margin):
    """Random BF16 hidden states [m, K] with one outlier channel, each pushed along a random
    vocabulary row so that row's logit rises by ``margin`` standard deviations."""
    v, k = weight.shape
    x = torch.randn(m, k, device="cuda", generator=gen)
    x[:, 7] = 30.0
    if margin:
        w = weight.float()
        spread = (x.to(torch.bfloat16).float() @ w.T).std(dim=1, keepdim=True)
        rows = w[torch.randint(v, (m,), device="cuda", generator=gen)]
        x = x + margin * spread * rows / rows.norm(dim=1, keepdim=True) ** 2
    return x.to(torch.bfloat16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", default="1,8,32,64")
    parser.add_argument("--margins", default="0,6")
    parser.add_argument("--json", default=None)
    a = parser.parse_args()
    env = environment()
    print(f"# {env['gpu']}")
    rows = []
    for v, k in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(v + k)
        weight = (torch.randn(v, k, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
        pw = prepare_weight(w12.encode(weight))
        head = quantize(weight)  # (float64 on the device: a few GB for the largest head)
        dh = DeviceHead.of(head)
        for margin in map(float, a.margins.split(",")):
            for m in map(int, a.m.split(",")):
                x = hidden_states(weight, m, gen, margin)
                exact = w12_head(x, pw).float()
                mask = certify(x, dh)
                assert mask.gather(1, exact.argmax(1, keepdim=True)).all(), "argmax dropped"
                fused = greedy_candidates(x, dh)
                assert fused.gather(1, exact.argmax(1, keepdim=True)).all(), "fused: dropped"
                assert torch.equal(certified(x, pw, dh), exact.argmax(1)), "certified != exact"
                picks, needed = certified_picks(x, fused, pw, TILES, TILES * tile_escapes(pw))
                fits = int(needed) <= TILES
                assert not fits or torch.equal(picks, exact.argmax(1)), "graph picks != exact"
                _check64(head, x.cpu(), exact.cpu())
                times = time_graphs(_calls(x, pw, dh))
                eager = _eager(x, pw, dh)
                row = {"vocab": v, "k": k, "m": m, "margin": margin, "w12_us": times[0],
                       "int8_us": times[1], "int8_bounds_us": times[2], "fused_us": times[3],
                       "graph_us": times[4], "graph_fits": fits,
                       "w12_eager_us": eager[0], "certified_us": eager[1],
                       "candidates_mean": float(mask.sum(1).float().mean()),
                       "recomputed_rows": int(mask.any(0).sum())}
                rows.append(row)
                print(f"{v:>7}x{k:<5} margin {margin:g} M={m:<3} W12 {times[0]:7.1f} us  INT8 "
                      f"{times[1]:7.1f} (x{times[0] / times[1]:.2f})  +bounds {times[2]:7.1f} "
                      f"(x{times[0] / times[2]:.2f})  fused {times[3]:7.1f} "
                      f"(x{times[0] / times[3]:.2f})  graph {times[4]:7.1f} "
                      f"(x{times[0] / times[4]:.2f}, fits {'yes' if fits else 'no'})  | eager W12 "
                      f"{eager[0]:7.1f} certified "
                      f"{eager[1]:7.1f} (x{eager[0] / eager[1]:.2f})  candidates "
                      f"{row['candidates_mean']:.1f}, rows {row['recomputed_rows']}", flush=True)
    write_json(a.json, rows, env)


def _calls(x, pw, dh, copies: int = 4) -> list[list]:
    room = TILES * tile_escapes(pw)  # (read before the capture)
    return [[lambda: w12_head(x, pw)] * copies,
            [lambda: approx_logits(x, dh.q, dh.scale)] * copies,
            [lambda: certify(x, dh)] * copies,
            [lambda: greedy_candidates(x, dh)] * copies,
            [lambda: certified_picks(x, greedy_candidates(x, dh), pw, TILES, room)] * copies]


def _eager(x, pw, dh) -> list[float]:
    """Median µs of the W12 head and of the certified choice, eager, in turn."""
    times = time_host([lambda: [w12_head(x, pw) for _ in range(REPEAT)],
                       lambda: [certified(x, pw, dh) for _ in range(REPEAT)]],
                      rounds=15, sync=torch.cuda.synchronize)
    return [t * 1e6 / REPEAT for t in times]


def _check64(head, x, exact, rows: int = 8192):
    """The reference's float64 bounds hold the W12 head's logits (the first ``rows``
    vocabulary rows: a float64 product of the whole head takes minutes on the host)."""
    from w12_kernels.int8_head import Int8Head, logit_bounds

    part = Int8Head(*(t[:rows].cpu() for t in (head.q, head.scale, head.err, head.norm,
                                                head.qnorm)))
    _, lo, hi = logit_bounds(part, x)
    e = exact[:, :rows].double()
    assert ((lo <= e) & (e <= hi)).all(), "a W12 head logit outside its float64 bounds"


if __name__ == "__main__":
    main()
