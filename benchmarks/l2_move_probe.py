"""How fast one multiprocessor moves a 128 KB tile of float32 sums to another through L2 (GPU,
compute capability 9.0): the move that a K split's exchange through L2 and stream-K's pieces
make at the end of a large-M call (docs/PERF_GEMM.md #73, #75-#76), there measured at only
~30-40 GB/s a multiprocessor.

Block 2 p writes 128 KB from registers (thread-major float4, as the kernels do), fences
(``__threadfence``), meets its block barrier and sets flag p (release); block 2 p + 1 waits for
the flag (acquire) and reads the 128 KB back into registers. ``%globaltimer`` stamps give each
pair's write (stores issued, then fenced and flagged) and read (the flag seen, the loads done).
One block a multiprocessor (a large dynamic shared-memory request), ``--pairs`` pairs at once:
1 is the idle GPU, 66 every multiprocessor of an H200 moving at once, as at the end of a
one-wave call.

    python benchmarks/l2_move_probe.py --pairs 1,8,33,66
"""

from __future__ import annotations

import argparse
import statistics
import sys

SOURCE = r"""
extern "C" __global__ void __launch_bounds__(256)
l2_move(float4* __restrict__ buf, unsigned* __restrict__ flags,
        unsigned long long* __restrict__ stamps, float* __restrict__ sink) {
  constexpr int WORDS = 32;  // float4 a thread: 256 x 32 x 16 = 128 KB a block
  const int pair = blockIdx.x >> 1;
  float4* slot = buf + (size_t)pair * WORDS * 256 + threadIdx.x;
  unsigned long long t;
  auto now = [&]() {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) :: "memory");
    return t;
  };
  if ((blockIdx.x & 1) == 0) {  // the writer
    const unsigned long long t0 = now();
    const float b = (float)(threadIdx.x + blockIdx.x);
#pragma unroll
    for (int c = 0; c < WORDS; ++c)
      slot[c * 256] = make_float4(b + c, b - c, b * c, b + 2 * c);
    const unsigned long long t1 = now();
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      asm volatile("st.release.gpu.global.u32 [%0], 1;" :: "l"(flags + pair) : "memory");
      const unsigned long long t2 = now();
      stamps[pair * 8 + 0] = t0;
      stamps[pair * 8 + 1] = t1;
      stamps[pair * 8 + 2] = t2;
    }
  } else {  // the reader
    unsigned v = 0;
    do {
      asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(flags + pair)
                   : "memory");
    } while (v == 0u);
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    const unsigned long long t3 = now();
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int c = 0; c < WORDS; ++c) {
      float4 w;
      asm volatile("ld.global.v4.f32 {%0, %1, %2, %3}, [%4];"
                   : "=f"(w.x), "=f"(w.y), "=f"(w.z), "=f"(w.w) : "l"(slot + c * 256)
                   : "memory");
      acc.x += w.x; acc.y += w.y; acc.z += w.z; acc.w += w.w;
    }
    sink[blockIdx.x * 256 + threadIdx.x] = acc.x + acc.y + acc.z + acc.w;
    __syncthreads();
    if (threadIdx.x == 0) {
      const unsigned long long t4 = now();
      stamps[pair * 8 + 3] = t3;
      stamps[pair * 8 + 4] = t4;
      flags[pair] = 0u;  // (the next call starts from zero)
    }
  }
}
"""

TILE = 128 * 1024  # bytes a pair moves
SMEM = 200 * 1024  # dynamic shared memory a block asks for: one block a multiprocessor


def rates(stamps, pairs: int) -> dict:
    """Per pair (``stamps`` [pairs, 8] in ns: write start, stores issued, flagged, flag seen,
    read done): the write's µs (start to flagged), of which issuing the stores, the read's µs
    (flag seen to loads done) and both in GB/s; medians and the slowest pair."""
    rows = [[int(v) for v in stamps[p]] for p in range(pairs)]
    write = [(r[2] - r[0]) / 1e3 for r in rows]
    issue = [(r[1] - r[0]) / 1e3 for r in rows]
    read = [(r[4] - r[3]) / 1e3 for r in rows]

    def gbs(us: float) -> float:
        return TILE / (us * 1e3) if us > 0 else float("inf")

    return {"pairs": pairs,
            "write_us": statistics.median(write), "write_us_max": max(write),
            "issue_us": statistics.median(issue),
            "read_us": statistics.median(read), "read_us_max": max(read),
            "write_gbs": gbs(statistics.median(write)), "read_gbs": gbs(statistics.median(read))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", default="1,8,33,66", help="pairs of blocks at once")
    parser.add_argument("--repeats", type=int, default=20, help="calls per pair count")
    args = parser.parse_args()
    try:
        import cupy
        import torch
    except ImportError as e:  # pragma: no cover - GPU machines only
        raise SystemExit(f"l2_move_probe: needs CuPy and PyTorch ({e})") from e
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        raise SystemExit("l2_move_probe: needs a compute-capability 9.0 GPU")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    counts = [int(v) for v in args.pairs.split(",")]
    if any(not 1 <= c <= sms // 2 for c in counts):
        raise SystemExit(f"l2_move_probe: 1 to {sms // 2} pairs (every block resident)")
    func = cupy.RawModule(code=SOURCE, options=("--std=c++17",)).get_function("l2_move")
    func.max_dynamic_shared_size_bytes = SMEM
    most = max(counts)
    buf = cupy.zeros(most * TILE // 4, dtype=cupy.float32)
    flags = cupy.zeros(most, dtype=cupy.uint32)
    stamps = cupy.zeros(most * 8, dtype=cupy.uint64)
    sink = cupy.zeros(2 * most * 256, dtype=cupy.float32)
    print("pairs | write us (max) | of it issuing the stores | read us (max) | write GB/s | "
          "read GB/s (medians over pairs, then over calls)", flush=True)
    for pairs in counts:
        results = []
        for _ in range(args.repeats):
            func((2 * pairs,), (256,), (buf, flags, stamps, sink), shared_mem=SMEM)
            cupy.cuda.Device().synchronize()
            results.append(rates(stamps.get().reshape(most, 8), pairs))
        med = {k: statistics.median(r[k] for r in results) for k in results[0]}
        print(f"{pairs} | {med['write_us']:.2f} ({med['write_us_max']:.2f}) | "
              f"{med['issue_us']:.2f} | {med['read_us']:.2f} ({med['read_us_max']:.2f}) | "
              f"{med['write_gbs']:.0f} | {med['read_gbs']:.0f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
