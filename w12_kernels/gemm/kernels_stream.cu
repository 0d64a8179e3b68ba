// The small-M W12 GEMM with its operands streamed through shared memory (cuda_stream.py).
// Compiled after kernels.cu (Words4, decode8, chunk_mma, store_output) and kernels_large.cu
// (smem_addr, mbar_wait, bulk_copy); Hopper only (bulk copies and mbarrier transactions).
//
// stream_body<NT, KW, TG, TL, S>: y[M, N] = x[M, K] @ W^T for M <= 8 NT, with the sums of
// w12_gemm_small (kernels.cu) at the same kw = KW, bit for bit: "virtual warp" w of a 16-row
// tile sums the tile's chunk columns w, w + KW, w + 2 KW, ... in that order, four m16n8k16
// steps per column (chunk_mma), and the KW partial tiles are added in the order 0, 1, ...,
// KW - 1 before store_output's epilogue. What differs is how the operands arrive.
// w12_gemm_small keeps each warp's next chunk in registers and reads the activations from L2
// per warp, so the bytes it has in flight are bounded by its registers and warps, and at
// M = 16-64 it runs out of both (docs/PERF_GEMM.md #8, #12, #17). Here a producer warp
// copies whole column groups (KW consecutive chunk columns: the words of the block's
// R = TG TL tiles by bulk copies, and the activation rows' 128 bytes per column by cp.async)
// into S shared-memory stages ahead of the consumers, so the bytes in flight are S stages whatever the registers; the
// KW TG consumer warps, warp (w, grp) being virtual warp w of the tiles grp TL .. grp TL +
// TL - 1, read their column's words and activations from the stage, decode and multiply,
// and release the stage (an "empty" mbarrier, one arrival per consumer warp). The
// activations of a column are copied once per block and read by all R tiles of it.
//
// Stage layout: the R tiles' chunk words (tile r's columns at r KW 1536, each column 1536
// bytes as in global memory), then the activation rows, row m at WBYTES + m XPITCH, its
// columns' 128 bytes each; XPITCH = 128 KW + 16, so that the two 16-byte loads of the lanes
// (g, t) of a quarter warp fall on distinct banks. Rows past M are not copied: their
// garbage only reaches outputs of tokens >= M, which are never stored.

template <int NT, int KW, int TG, int TL, int S, int PW>
struct StreamShape {
  static constexpr int R = TG * TL;                      // 16-row tiles per unit of work
  static constexpr int CONSUMERS = KW * TG;              // consumer warps
  static constexpr int THREADS = 32 * (CONSUMERS + PW);  // and PW producer warps
  static constexpr int XPITCH = 128 * KW + 16;
  static constexpr int WBYTES = R * KW * 1536;
  static constexpr int STAGE = WBYTES + 8 * NT * XPITCH;
  static constexpr int PARTIAL = R * KW * NT * 4 * 32 * 4;  // float32 partial tiles
  static constexpr int SMEM = S * STAGE + PARTIAL + 16 * S;  // and a full and an empty
                                                             // mbarrier per stage
};

template <int NT, int KW, int TG, int TL, int S, int PW>
__device__ __forceinline__ void stream_body(
    const Words4* __restrict__ chunks, const bf16_t* __restrict__ x, bf16_t* __restrict__ y,
    const float* __restrict__ scale, const int* __restrict__ rowptr,
    const int* __restrict__ esc_col, const float* __restrict__ esc_delta,
    const bf16_t* __restrict__ bias, int M, int N, int ntiles, int nchunks, int ldx) {
  using Sh = StreamShape<NT, KW, TG, TL, S, PW>;
  static_assert(NT >= 1 && NT <= 8 && KW >= 1 && KW <= 8 && S >= 2, "config");
  extern __shared__ __align__(128) unsigned char smem[];
  float* partial = reinterpret_cast<float*>(smem + S * Sh::STAGE);
  unsigned long long* full =
      reinterpret_cast<unsigned long long*>(smem + S * Sh::STAGE + Sh::PARTIAL);
  unsigned long long* empty = full + S;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int groups = (nchunks + KW - 1) / KW;  // column groups: one per stage
  const int units = (ntiles + Sh::R - 1) / Sh::R;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      // full: lane 0's announcement of the bulk bytes and the producer lanes' cp.async
      // arrivals; empty: one arrival per consumer warp
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
                   :: "r"(smem_addr(full + s)), "r"(1 + 32 * PW));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
                   :: "r"(smem_addr(empty + s)), "r"(Sh::CONSUMERS));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();

  if (warp >= Sh::CONSUMERS) {
    // The producers: the q-th group this block handles (units blockIdx.x, + gridDim.x, ...,
    // each all its column groups in order) into stage q % S once the consumers have released
    // that stage's previous group. Producer lane 0 announces the chunk words' bytes and lanes
    // 0..R-1 start one bulk copy each (a tile's columns of the group); the activations go by
    // 16-byte cp.async from all producer lanes, each lane's arrival on the full barrier
    // triggered once its copies land (a bulk copy per activation row cost ~30 ns of the copy
    // engine each: docs/PERF_GEMM.md #27).
    const int pl = threadIdx.x - 32 * Sh::CONSUMERS;  // producer lane, 0 .. 32 PW - 1
    const int rows = min(M, 8 * NT);
    int q = 0;
    for (int unit = blockIdx.x; unit < units; unit += gridDim.x) {
      const int tile0 = unit * Sh::R;
      for (int s = 0; s < groups; ++s, ++q) {
        const int slot = q % S;
        if (q >= S) mbar_wait(empty + slot, (u32)(q / S - 1) & 1u);
        const int c0 = s * KW;
        const int cols = min(KW, nchunks - c0);
        unsigned char* st = smem + slot * Sh::STAGE;
        if (pl == 0)
          asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                       :: "r"(smem_addr(full + slot)), "r"((u32)(Sh::R * 1536 * cols))
                       : "memory");
        __syncwarp();
        if (pl < Sh::R) {
          const int tile = min(tile0 + pl, ntiles - 1);  // rows past the last: not stored
          bulk_copy(st + pl * KW * 1536, chunks + ((size_t)tile * nchunks + c0) * 96,
                    (u32)cols * 1536u, full + slot);
        }
        const int per_row = cols * 8;  // 16-byte pieces of a row
        for (int p = pl; p < rows * per_row; p += 32 * PW) {
          const int m = p / per_row, u = p - m * per_row;
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                       :: "r"(smem_addr(st + Sh::WBYTES + m * Sh::XPITCH + u * 16)),
                          "l"(x + (size_t)m * ldx + (size_t)c0 * 64 + u * 8) : "memory");
        }
        asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];"
                     :: "r"(smem_addr(full + slot)) : "memory");
      }
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    return;  // (the consumers synchronize among themselves from here on)
  }

  const int w = warp % KW;    // the virtual warp
  const int grp = warp / KW;  // the group of TL tiles
  const int g = lane >> 2, t = lane & 3;
  int q = 0;
  for (int unit = blockIdx.x; unit < units; unit += gridDim.x) {
    const int tile0 = unit * Sh::R;
    float acc[TL][NT][4];
#pragma unroll
    for (int tt = 0; tt < TL; ++tt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[tt][nt][r] = 0.0f;
    for (int s = 0; s < groups; ++s, ++q) {
      const int slot = q % S;
      mbar_wait(full + slot, (u32)(q / S) & 1u);
      if (s * KW + w < nchunks) {
        const unsigned char* st = smem + slot * Sh::STAGE;
        u32 xv[NT][8];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint4* xq = reinterpret_cast<const uint4*>(
              st + Sh::WBYTES + (nt * 8 + g) * Sh::XPITCH + w * 128 + 32 * t);
          const uint4 a = xq[0], b = xq[1];
          xv[nt][0] = a.x; xv[nt][1] = a.y; xv[nt][2] = a.z; xv[nt][3] = a.w;
          xv[nt][4] = b.x; xv[nt][5] = b.y; xv[nt][6] = b.z; xv[nt][7] = b.w;
        }
#pragma unroll
        for (int tt = 0; tt < TL; ++tt) {
          const Words4* p =
              reinterpret_cast<const Words4*>(st + ((grp * TL + tt) * KW + w) * 1536) + lane;
          chunk_mma<NT>(p[0], p[32], p[64], xv, acc[tt]);
        }
      }
      __syncwarp();  // every lane's loads of the stage are done: the warp releases it
      if (lane == 0)
        asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];"
                     :: "r"(smem_addr(empty + slot)) : "memory");
    }

    // The unit's partial tiles into their own shared memory (the producers are filling the
    // stages with the next unit meanwhile): tile r's virtual warp w at (r KW + w) NT 128
    // floats; then the fixed-order sums and the outputs, by the consumer threads.
#pragma unroll
    for (int tt = 0; tt < TL; ++tt) {
      float* mine = partial + (size_t)((grp * TL + tt) * KW + w) * NT * 128;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) mine[(nt * 4 + r) * 32 + lane] = acc[tt][nt][r];
    }
    asm volatile("bar.sync 1, %0;" :: "n"(32 * Sh::CONSUMERS) : "memory");
    for (int idx = threadIdx.x; idx < Sh::R * NT * 128; idx += 32 * Sh::CONSUMERS) {
      const int rt = idx / (NT * 128);
      const int within = idx - rt * NT * 128;
      const int ln = within & 31;
      const int item = within >> 5;  // nt * 4 + r
      const int r = item & 3;
      const int row = (tile0 + rt) * 16 + (ln >> 2) + 8 * (r >> 1);
      const int tok = (item >> 2) * 8 + 2 * (ln & 3) + (r & 1);
      if (tile0 + rt >= ntiles || row >= N || tok >= M) continue;
      const float* tp = partial + (size_t)rt * KW * NT * 128 + within;
      float v = tp[0];
#pragma unroll
      for (int ww = 1; ww < KW; ++ww) v += tp[ww * NT * 128];  // fixed order
      store_output(v, row, tok, x, y, scale, rowptr, esc_col, esc_delta, bias, N, ldx);
    }
    asm volatile("bar.sync 1, %0;" :: "n"(32 * Sh::CONSUMERS) : "memory");  // all read
  }
}
