// The small-M W12 GEMM (M <= 64) on mma.sync, compiled at run time with NVRTC (launcher.py).
//
// Weights are read in the chunk layout of layout.py (weights on the MMA's M side, activation
// rows on its N side, 8 per n-tile). Nothing goes through shared memory on the way to the
// tensor cores: each lane decodes its own words into the exact fragment registers, so the main
// loop is loads, 11 integer operations per 8 weights, and MMAs.
//
// w12_gemm_small<NT, P, TL, MINB, XS, TG, WB, WS>: y[M, N] = x[M, K] @ W^T for M <= 8 NT. One
// block per TG groups of TL consecutive 16-row tiles; each group's kw warps split the chunk
// columns, warp w taking columns w, w + kw, w + 2 kw, ... of every tile of its group (so a
// group reads one contiguous run of kw chunks per tile at a time, each activation fragment a
// warp loads serves TL tiles, and the TG warps of a block that take the same columns run side
// by side, so that the activations one of them loads are in L1 for the others); each warp
// keeps P columns of weight loads in flight (a ring of registers indexed by compile-time
// constants). Activations: loaded just before use, or with XS >= 2 through a ring of XS
// stages in shared memory filled by cp.async XS - 1 columns ahead (the n-tile rows past M
// re-read row M - 1; their sums are never stored). Both streams advance as running 32-bit
// offsets, and the column loop is unrolled so that ring slots and stages are constants. With
// WS >= 2 the weights, too, go through shared memory instead of the register ring: each lane
// copies its own 48 bytes of a chunk by cp.async (L2 only) into a ring of WS stages, WS - 1
// columns ahead, so the bytes in flight do not cost registers. MINB caps the registers so
// that MINB blocks of WB warps (at least the kw TG of the launch; 8 where TG is 1 and
// kw <= 8) fit on a multiprocessor. The block sums each tile's kw partial tiles in shared
// memory in warp order 0..kw-1. None of TG, TL, P, XS, WS, MINB changes a sum: each row's
// products are accumulated in the same order whatever they are. No atomics, and kw depends
// on the weight shape only, so the bits of an output row do not depend on M.
// The epilogue scales each row by 2^(e0 - 112), adds the escape corrections in list order and
// the bias, and rounds to BF16; a row's scale, escape range and first two escapes are brought
// into shared memory before the main loop, and the activations of those escapes are loaded for
// all of the block's tiles at once after the epilogue's first barrier (so the epilogue waits on
// one round trip, not a chain of global loads per escape). The partial tiles go through
// shared memory as one float4 per lane, and each thread of the epilogue finishes a share of
// an MMA lane fragment (its four outputs, one row's two, or one, by the threads a fragment
// has) from one 16-, 8- or 4-byte load per warp's partial tile.
//
// w12_gemm_small_cl<..., CL>: the same kernel with each tile group's kw warps spread over the CL
// blocks of a thread-block cluster (kw / CL warps a block; warp w of the group in block
// w / (kw / CL)): smaller blocks for the same K split, which fill the multiprocessors more
// evenly on some layers. Every warp stores its partial tiles into every block of the cluster,
// one cluster barrier, then each block stores its share of the outputs from its own shared
// memory: the same sums in the same order as w12_gemm_small.

#include "common.cuh"

__device__ __forceinline__ void mma_bf16(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 4 bytes global -> shared, asynchronously (zeros where ``bytes`` is 0)
__device__ __forceinline__ void cp_async4(void* dst, const void* src, int bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(
                   (u32)__cvta_generic_to_shared(dst)), "l"(src), "r"(bytes)
               : "memory");
}

template <int NT>
__device__ __forceinline__ void chunk_mma(const Words4& w0, const Words4& w1, const Words4& w2,
                                          const u32 (&xv)[NT][8], float (&acc)[NT][4]) {
  const u32 lo_a[4] = {w0.x, w0.y, w0.z, w0.w};
  const u32 lo_b[4] = {w1.x, w1.y, w1.z, w1.w};
  const u32 top[4] = {w2.x, w2.y, w2.z, w2.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    u32 a[4];
    decode8(lo_a[j], lo_b[j], top[j], a);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) mma_bf16(acc[nt], a, xv[nt][2 * j], xv[nt][2 * j + 1]);
  }
}

// Activations: lane (g, t) of n-tile nt reads row min(8 nt + g, M - 1) of x (xro: that row's
// element offset; rows past M repeat row M - 1: their sums are never stored, so no branch and
// no zero fill), columns 16 t .. 16 t + 15 of a chunk: xc = 64 chunk + 16 t, a running offset
// of the warp's column stream, advanced here by xstep (without it the compiler rebuilds each
// n-tile's row pointer from the thread index in every column, ~20 instructions an n-tile).
template <int NT>
__device__ __forceinline__ void load_x(u32 (&xv)[NT][8], const bf16_t* x, u32& xc, u32 xstep,
                                       const int (&xro)[NT]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const bf16_t* p = x + (size_t)(xc + (u32)xro[nt]);
    const Words4 a = load_cached(p);
    const Words4 b = load_cached(p + 8);
    xv[nt][0] = a.x; xv[nt][1] = a.y; xv[nt][2] = a.z; xv[nt][3] = a.w;
    xv[nt][4] = b.x; xv[nt][5] = b.y; xv[nt][6] = b.z; xv[nt][7] = b.w;
  }
  xc += xstep;
}

// Activations through shared memory: each lane copies the 32 bytes of every n-tile that it
// will itself read back (so no barrier is needed, only the lane's own cp.async groups).
template <int NT>
__device__ __forceinline__ void issue_x(u32* stage, const bf16_t* x, u32& xc, u32 xstep,
                                        const int (&xro)[NT], int lane) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const u32 dst = (u32)__cvta_generic_to_shared(stage + (nt * 32 + lane) * 8);
    const bf16_t* src = x + (size_t)(xc + (u32)xro[nt]);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(dst + 16), "l"(src + 8));
  }
  xc += xstep;
}

template <int NT>
__device__ __forceinline__ void read_x(u32 (&xv)[NT][8], const u32* stage, int lane) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const uint4 a = *reinterpret_cast<const uint4*>(stage + (nt * 32 + lane) * 8);
    const uint4 b = *reinterpret_cast<const uint4*>(stage + (nt * 32 + lane) * 8 + 4);
    xv[nt][0] = a.x; xv[nt][1] = a.y; xv[nt][2] = a.z; xv[nt][3] = a.w;
    xv[nt][4] = b.x; xv[nt][5] = b.y; xv[nt][6] = b.z; xv[nt][7] = b.w;
  }
}

// Weights through shared memory: each lane copies its own three 16-byte words of each tile's
// chunk (cp.async.cg: L2 only) into a part of the stage no other lane touches, so, as for the
// activations, only the lane's own cp.async groups need waiting on. A stage is TL x 3 x 32
// words of 16 bytes, lanes adjacent (conflict-free 16-byte reads).
// wc[tt]: the Words4 index of this lane's words of the stream's next column in tile tt (a
// running 32-bit index, advanced here by wstep).
template <int TL>
__device__ __forceinline__ void issue_w(u32* stage, const Words4* chunks, u32 (&wc)[TL],
                                        u32 wstep, int lane) {
#pragma unroll
  for (int tt = 0; tt < TL; ++tt)
#pragma unroll
    for (int q = 0; q < 3; ++q) {
      const u32 dst = (u32)__cvta_generic_to_shared(stage + ((tt * 3 + q) * 32 + lane) * 4);
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst),
                   "l"(chunks + (size_t)wc[tt] + q * 32));
    }
#pragma unroll
  for (int tt = 0; tt < TL; ++tt) wc[tt] += wstep;
}

// The register ring's loads of one column (wc as for issue_w).
template <int TL>
__device__ __forceinline__ void load_w(Words4 (&w)[TL][3], const Words4* chunks, u32 (&wc)[TL],
                                       u32 wstep) {
#pragma unroll
  for (int tt = 0; tt < TL; ++tt) {
    const Words4* p = chunks + (size_t)wc[tt];
    w[tt][0] = load_stream(p);
    w[tt][1] = load_stream(p + 32);
    w[tt][2] = load_stream(p + 64);
    wc[tt] += wstep;
  }
}

template <int TL>
__device__ __forceinline__ void read_w(Words4 (&w)[TL][3], const u32* stage, int lane) {
#pragma unroll
  for (int tt = 0; tt < TL; ++tt)
#pragma unroll
    for (int q = 0; q < 3; ++q) {
      const uint4 v = *reinterpret_cast<const uint4*>(stage + ((tt * 3 + q) * 32 + lane) * 4);
      w[tt][q].x = v.x; w[tt][q].y = v.y; w[tt][q].z = v.z; w[tt][q].w = v.w;
    }
}

// The epilogue's rows: [TL][16 TG] rows of EPI_WORDS words each (32 bytes, read as two 16-byte
// words): the row's scale, its escape range start e0, the columns of its first ESC_STAGED
// escapes (-1 past the range), their deltas, the range's end e1, one spare word
// (cuda.small_shared_bytes counts the eight words); after the partial tiles and the activation
// and weight stages.
constexpr int ESC_STAGED = 2;
constexpr int EPI_WORDS = 8;
constexpr int EPI_SCALE = 0, EPI_E0 = 1, EPI_COL = 2, EPI_DELTA = 4, EPI_E1 = 6;

template <int NT, int XS, int TG, int WS, int TL, int CL>
__device__ __forceinline__ u32* epi_rows_at(float* partial, int kw) {
  if constexpr (CL > 1)  // [TL][TG][kw][NT][32] float4 partial tiles (no stages)
    return reinterpret_cast<u32*>(partial + TL * TG * kw * NT * 4 * 32);
  return reinterpret_cast<u32*>(partial + TG * kw * NT * 4 * 32) + TG * kw * XS * NT * 256 +
         TG * kw * WS * TL * 384;
}

// The second step of the epilogue's rows, once the first columns' loads are in flight: each
// row's escape range into shared memory and the columns and deltas of its first ESC_STAGED
// escapes by cp.async (column -1 where the row has fewer). The copies join the kernel's next
// cp.async group; the epilogue waits for all of them.
template <int TL>
__device__ __forceinline__ void epi_escapes(u32* epi, int er, int ej, int erows,
                                            const int (&e0r)[TL], const int (&e1r)[TL],
                                            const int* esc_col, const float* esc_delta) {
  if (ej != 0) return;
#pragma unroll
  for (int tt = 0; tt < TL; ++tt) {
    u32* rw = epi + (tt * erows + er) * EPI_WORDS;
    rw[EPI_E0] = (u32)e0r[tt];
    rw[EPI_E1] = (u32)e1r[tt];
#pragma unroll
    for (int i = 0; i < ESC_STAGED; ++i) {
      if (e0r[tt] + i < e1r[tt]) {
        cp_async4(rw + EPI_COL + i, esc_col + e0r[tt] + i, 4);
        cp_async4(rw + EPI_DELTA + i, esc_delta + e0r[tt] + i, 4);
      } else {
        rw[EPI_COL + i] = 0xFFFFFFFFu;  // column -1
      }
    }
  }
}

// The epilogue works on positions. Lane 4 g + t of n-tile nt holds, in
// the mma.m16n8k16 C layout, rows g, g + 8 of its tile and tokens 8 nt + 2 t, + 1 (registers
// 0..3: (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)). The partial tiles are stored as one
// float4 per lane ([kw][NT][32]). A position is a share of one lane fragment f: with the split
// S = 1 all four outputs (16-byte loads of the partial tiles), S = 2 one row's two tokens
// (8-byte loads), S = 4 one output, so that a thread finishes 4 / S outputs at once from one
// load per warp's tile. S follows the threads a fragment has (kw over NT): where they are few
// (kw 2 and 4 at 17-32 rows) a thread takes whole fragments and the epilogue issues few
// instructions (one output per thread took ~600 instructions per warp at NT = 4 with two
// tiles; ncu: the epilogue issue-bound there), where they are many (kw 8-16 at 1-16 rows) the
// outputs spread over all of them so that no long chain of loads waits on few warps. Position
// q is share q % S of fragment q / S: a warp's lanes read adjacent bytes, conflict-free.
template <int NT, int KB>
__host__ __device__ constexpr int epi_split() {
  return KB >= 4 * NT ? 4 : KB >= 2 * NT ? 2 : 1;
}

template <int V>
struct IntC {
  static constexpr int value = V;
};

// position q of a tile: its fragment f, the row g + 8 h0 and token tok0 of its first output
template <int S>
__device__ __forceinline__ void epi_pos(int q, int& f, int& g, int& h0, int& tok0) {
  f = q / S;
  const int sub = q % S;
  g = (f & 31) >> 2;
  h0 = S == 1 ? 0 : S == 2 ? sub : sub >> 1;
  tok0 = (f >> 5) * 8 + 2 * (f & 3) + (S == 4 ? (sub & 1) : 0);
}

// The escape activations of position q: x[tok, col] of the first ESC_STAGED escapes of its rows
// for its tokens, xg[r * NC + c][i] (0 where there is none or the token is past M).
template <int S>
__device__ __forceinline__ void gather_pos(const u32* rows, int q, int M, int ldx,
                                           const bf16_t* __restrict__ x,
                                           float (&xg)[4 / S][ESC_STAGED]) {
  constexpr int NR = S == 1 ? 2 : 1, NC = S == 4 ? 1 : 2;
  int f, g, h0, tok0;
  epi_pos<S>(q, f, g, h0, tok0);
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    const int2 col =
        *reinterpret_cast<const int2*>(rows + (g + 8 * (h0 + r)) * EPI_WORDS + EPI_COL);
    const int cs[ESC_STAGED] = {col.x, col.y};
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const u32 tok = (u32)(tok0 + c);
#pragma unroll
      for (int i = 0; i < ESC_STAGED; ++i)
        xg[r * NC + c][i] = (int)tok < M && cs[i] >= 0
                                ? bf16_to_float(x[tok * (u32)ldx + (u32)cs[i]])
                                : 0.0f;
    }
  }
}

// The partial sums of position q's 4 / S outputs, added in warp order 0..kw-1 (gp: warp w's
// tile at w * NT * 32 float4s); KB >= kw a compile-time bound, the loads issued in batches of
// up to 16 words before their adds.
template <int NT, int KB, int S>
__device__ __forceinline__ void partial_sums(const float4* gp, int f, int h0, int sub,
                                             int kw, float (&v)[4 / S]) {
  constexpr int NV = 4 / S;
  constexpr int B = KB < 16 / NV ? KB : 16 / NV;
  const float* base = reinterpret_cast<const float*>(gp + f) +
                      (S == 1 ? 0 : S == 2 ? 2 * h0 : 2 * h0 + (sub & 1));
#pragma unroll
  for (int w0 = 0; w0 < KB; w0 += B) {
    float q[B][NV];
#pragma unroll
    for (int u = 0; u < B; ++u)
      if (w0 + u < kw) {
        const float* p = base + (size_t)(w0 + u) * NT * 32 * 4;
        if constexpr (NV == 4) {
          const float4 a = *reinterpret_cast<const float4*>(p);
          q[u][0] = a.x; q[u][1] = a.y; q[u][2] = a.z; q[u][3] = a.w;
        } else if constexpr (NV == 2) {
          const float2 a = *reinterpret_cast<const float2*>(p);
          q[u][0] = a.x; q[u][1] = a.y;
        } else {
          q[u][0] = *p;
        }
      }
#pragma unroll
    for (int u = 0; u < B; ++u)
#pragma unroll
      for (int e = 0; e < NV; ++e) {
        if (w0 + u == 0)
          v[e] = q[0][e];
        else if (w0 + u < kw)
          v[e] += q[u][e];  // fixed order
      }
  }
}

// One output: the row's sum v times its scale, plus its escape corrections in list order (the
// first ESC_STAGED with the gathered activations xv, the rest loaded here), plus the bias,
// rounded to BF16: store_output's arithmetic and order, with the roundings spelled out so that
// no contraction differs between the two.
__device__ __forceinline__ void emit_output(float v, float scale, const int (&col)[ESC_STAGED],
                                            const float (&d)[ESC_STAGED],
                                            const float (&xv)[ESC_STAGED], int e0, int e1,
                                            bool has_bias, float b, u32 tok, int row, int N,
                                            int ldx, const bf16_t* __restrict__ x,
                                            bf16_t* __restrict__ y,
                                            const int* __restrict__ esc_col,
                                            const float* __restrict__ esc_delta) {
  float o = __fmul_rn(v, scale);
#pragma unroll
  for (int i = 0; i < ESC_STAGED; ++i)
    if (col[i] >= 0) o = __fmaf_rn(xv[i], d[i], o);
#pragma unroll 1
  for (int q = e0 + ESC_STAGED; q < e1; ++q)  // rows with more escapes (rare)
    o = __fmaf_rn(bf16_to_float(x[tok * (u32)ldx + (u32)esc_col[q]]), esc_delta[q], o);
  if (has_bias) o = __fadd_rn(o, b);
  y[tok * (u32)N + (u32)row] = float_to_bf16(o);
}

// The outputs of position q of one tile (rows: the tile's 16 epilogue rows, gp: its kw partial
// tiles, row0: its first output row; xg: the position's escape activations).
template <int NT, int KB>
__device__ __forceinline__ void store_pos(const u32* rows, const float4* gp, int q, int row0,
                                          int kw, int M, int N, int ldx,
                                          const bf16_t* __restrict__ x, bf16_t* __restrict__ y,
                                          const int* __restrict__ esc_col,
                                          const float* __restrict__ esc_delta,
                                          const bf16_t* __restrict__ bias,
                                          const float (&xg)[4 / epi_split<NT, KB>()][ESC_STAGED]) {
  constexpr int S = epi_split<NT, KB>();
  constexpr int NR = S == 1 ? 2 : 1, NC = S == 4 ? 1 : 2;
  int f, g, h0, tok0;
  epi_pos<S>(q, f, g, h0, tok0);
  if (tok0 >= M) return;
  float sv[4 / S];
  partial_sums<NT, KB, S>(gp, f, h0, q % S, kw, sv);
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    const int h = h0 + r;
    const int row = row0 + g + 8 * h;
    if (row >= N) continue;
    const uint4 a = *reinterpret_cast<const uint4*>(rows + (g + 8 * h) * EPI_WORDS);
    const uint4 bw = *reinterpret_cast<const uint4*>(rows + (g + 8 * h) * EPI_WORDS + 4);
    const float scale = __uint_as_float(a.x);
    const int e0 = (int)a.y, e1 = (int)bw.z;
    const int col[ESC_STAGED] = {(int)a.z, (int)a.w};
    const float d[ESC_STAGED] = {__uint_as_float(bw.x), __uint_as_float(bw.y)};
    const float b = bias != nullptr ? bf16_to_float(bias[row]) : 0.0f;
#pragma unroll
    for (int c = 0; c < NC; ++c)
      if (tok0 + c < M)
        emit_output(sv[r * NC + c], scale, col, d, xg[r * NC + c], e0, e1, bias != nullptr, b,
                    (u32)(tok0 + c), row, N, ldx, x, y, esc_col, esc_delta);
  }
}

// One tile's outputs by the threads of its group: positions q0 + idx, q0 + idx + nthr, ... below
// q1, the first one's escape activations gathered ahead (xg), each later one's loaded here.
template <int NT, int KB>
__device__ __forceinline__ void store_tile(const u32* rows, const float4* gp, int q0, int q1,
                                           int idx, int nthr, int row0, int kw, int M, int N,
                                           int ldx, const bf16_t* __restrict__ x,
                                           bf16_t* __restrict__ y,
                                           const int* __restrict__ esc_col,
                                           const float* __restrict__ esc_delta,
                                           const bf16_t* __restrict__ bias,
                                           const float (&xg)[4 / epi_split<NT, KB>()][ESC_STAGED]) {
  constexpr int S = epi_split<NT, KB>();
  int q = q0 + idx;
  if (q < q1)
    store_pos<NT, KB>(rows, gp, q, row0, kw, M, N, ldx, x, y, esc_col, esc_delta, bias, xg);
#pragma unroll 1
  for (q += nthr; q < q1; q += nthr) {  // (kw < NT: the kw 2 and 4 layers at 17+ rows)
    float xb[4 / S][ESC_STAGED];
    gather_pos<S>(rows, q, M, ldx, x, xb);
    store_pos<NT, KB>(rows, gp, q, row0, kw, M, N, ldx, x, y, esc_col, esc_delta, bias, xb);
  }
}

template <int NT, int P, int TL, int MINB, int XS, int TG, int WB, int WS, int CL>
__device__ __forceinline__ void small_body(
    const Words4* __restrict__ chunks, const bf16_t* __restrict__ x, bf16_t* __restrict__ y,
    const float* __restrict__ scale, const int* __restrict__ rowptr,
    const int* __restrict__ esc_col, const float* __restrict__ esc_delta,
    const bf16_t* __restrict__ bias, int M, int N, int ntiles, int nchunks, int ldx, int kw) {
  // [TG][kw][NT * 4][32], then with XS: [TG kw][XS][NT][32][8], then with WS:
  // [TG kw][WS][TL][3][32][4]; with CL > 1: [TL][TG][kw][NT * 4][32]
  extern __shared__ float partial[];
  static_assert(CL == 1 || (XS == 0 && WS == 0), "a cluster's blocks take no stages");
  const int kwl = CL > 1 ? kw / CL : kw;  // warps of a tile group in this block
  int rank = 0;  // this block's part of the kw warps: warps rank * kwl .. + kwl - 1
  if constexpr (CL > 1) {
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    // the first half of the barrier that tells this block the cluster's blocks have all
    // started (their shared memory may be written); its wait comes after the main loop
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  }
  const int bx = CL > 1 ? (int)blockIdx.x / CL : (int)blockIdx.x;  // the block's tiles
  const int warp = threadIdx.x >> 5;  // (grp, w): warp w of the kwl of tile group grp
  const int lane = threadIdx.x & 31;
  const int grp = TG == 1 ? 0 : warp / kwl;
  const int tile0 = (bx * TG + grp) * TL;
  const int g = lane >> 2;
  const int t = lane & 3;
  // the warp's chunks: first + i * step for i < n
  const int first = rank * kwl + warp - grp * kwl;
  const int step = kw;
  const int n = (nchunks - first + kw - 1) / kw;
  // The warp's weight and activation streams as running 32-bit offsets, advanced by one
  // column (step chunks) per load: wc[tt] the Words4 index of this lane's words of the
  // next column to load in tile tt (tiles past the last one re-read the last tile; their rows
  // are >= N and never stored), xc the element offset of its activations' column.
  u32 wc[TL];
#pragma unroll
  for (int tt = 0; tt < TL; ++tt)
    wc[tt] = ((u32)min(tile0 + tt, ntiles - 1) * (u32)nchunks + (u32)first) * 96u + lane;
  const u32 wstep = (u32)step * 96u;
  u32 xc = (u32)first * 64u + 16u * (u32)t;
  const u32 xstep = (u32)step * 64u;
  int xro[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) xro[nt] = min(nt * 8 + g, M - 1) * ldx;

  // The epilogue's rows: once the first weight loads are issued, the
  // threads (er, 0) bring row er % 16 of tile group er / 16 of every tile (its scale, escape
  // range and first ESC_STAGED escapes; scale and escapes by cp.async) into shared memory, so
  // that no register is held across the main loop and the epilogue waits on no chain of loads.
  constexpr int erows = TG * 16;
  const int er = threadIdx.x % erows;
  const int ej = threadIdx.x / erows;
  u32* epi = epi_rows_at<NT, XS, TG, WS, TL, CL>(partial, kw);
  int e0r[TL], e1r[TL];
  float acc[TL][NT][4];
#pragma unroll
  for (int tt = 0; tt < TL; ++tt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[tt][nt][r] = 0.0f;

  // The register ring: P columns of weight loads in flight in P + 1 slots (column c in slot
  // c % (P + 1)), the loop unrolled so that every slot and stage index is a constant (no
  // register copies between columns, no run-time modulo).
  Words4 ring[P + 1][TL][3];
#pragma unroll
  for (int s = 0; s < P; ++s) {
    if (WS == 0 && s < n) {
      load_w<TL>(ring[s], chunks, wc, wstep);
    }
  }
  if (ej == 0) {  // (after the ring's first loads: fewer registers live, measured)
#pragma unroll
    for (int tt = 0; tt < TL; ++tt) {
      const int row = ((bx * TG + er / 16) * TL + tt) * 16 + er % 16;
      const bool on = row < N;
      e0r[tt] = on ? rowptr[row] : 0;
      e1r[tt] = on ? rowptr[row + 1] : 0;
      cp_async4(epi + (tt * erows + er) * EPI_WORDS + EPI_SCALE, scale + (on ? row : 0),
                on ? 4 : 0);
    }
  }

  // XS > 0: a ring of XS activation stages per warp in shared memory, XS - 1 columns ahead
  u32* xstages =
      reinterpret_cast<u32*>(partial + TG * kw * NT * 4 * 32) + warp * XS * NT * 256;
  if (XS > 0 && WS == 0) {
#pragma unroll
    for (int st = 0; st < XS - 1; ++st) {
      if (st < n) issue_x<NT>(xstages + st * NT * 256, x, xc, xstep, xro, lane);
      asm volatile("cp.async.commit_group;");
    }
  }
  if constexpr (WS > 0) {
    // one commit group per column, with the column WS - 1 ahead's weights and (XS == WS)
    // activations; waiting until all but the last WS - 1 groups are done leaves the current
    // column's copies complete
    static_assert(XS == 0 || XS == WS, "activation stages: none or as many as weight stages");
    u32* wstages = reinterpret_cast<u32*>(partial + TG * kw * NT * 4 * 32) +
                   TG * kw * XS * NT * 256 + warp * WS * TL * 384;
    u32 xcur = xc;  // (XS == 0) the activations of the current column
#pragma unroll
    for (int st = 0; st < WS - 1; ++st) {
      if (st < n) {
        issue_w<TL>(wstages + st * TL * 384, chunks, wc, wstep, lane);
        if (XS > 0) issue_x<NT>(xstages + st * NT * 256, x, xc, xstep, xro, lane);
      }
      asm volatile("cp.async.commit_group;");
    }
    epi_escapes<TL>(epi, er, ej, erows, e0r, e1r, esc_col, esc_delta);
    for (int i = 0; i < n; i += WS) {
#pragma unroll
      for (int s = 0; s < WS; ++s) {  // column ii's stage is s (i is a multiple of WS)
        const int ii = i + s;
        if (ii < n) {
          if (ii + WS - 1 < n) {
            issue_w<TL>(wstages + ((s + WS - 1) % WS) * TL * 384, chunks, wc, wstep, lane);
            if (XS > 0)
              issue_x<NT>(xstages + ((s + WS - 1) % WS) * NT * 256, x, xc, xstep, xro, lane);
          }
          asm volatile("cp.async.commit_group;");
          asm volatile("cp.async.wait_group %0;" ::"n"(WS - 1));
          Words4 w[TL][3];
          read_w<TL>(w, wstages + s * TL * 384, lane);
          u32 xv[NT][8];
          if (XS > 0)
            read_x<NT>(xv, xstages + s * NT * 256, lane);
          else
            load_x<NT>(xv, x, xcur, xstep, xro);
#pragma unroll
          for (int tt = 0; tt < TL; ++tt)
            chunk_mma<NT>(w[tt][0], w[tt][1], w[tt][2], xv, acc[tt]);
        }
      }
    }
  }
  if constexpr (WS == 0) {
    epi_escapes<TL>(epi, er, ej, erows, e0r, e1r, esc_col, esc_delta);
    // the unroll: a multiple of the ring's P + 1 slots and of the XS stages
    constexpr int U0 = P + 1;
    constexpr int U = XS > 0 && U0 % XS != 0 ? U0 * XS : U0;
    static_assert(XS == 0 || U % XS == 0, "unroll");
    for (int i = 0; i < n; i += U) {
#pragma unroll
      for (int s = 0; s < U; ++s) {
        const int ii = i + s;
        if (ii < n) {
          if (ii + P < n)  // into the slot column ii - 1 used
            load_w<TL>(ring[(s + P) % (P + 1)], chunks, wc, wstep);
          const Words4(&w)[TL][3] = ring[s % (P + 1)];
          if constexpr (XS > 0) {
            if (ii + XS - 1 < n)
              issue_x<NT>(xstages + ((s + XS - 1) % XS) * NT * 256, x, xc, xstep, xro, lane);
            asm volatile("cp.async.commit_group;");
            asm volatile("cp.async.wait_group %0;" ::"n"(XS - 1));
            u32 xv[NT][8];
            read_x<NT>(xv, xstages + (s % XS) * NT * 256, lane);
#pragma unroll
            for (int tt = 0; tt < TL; ++tt)
              chunk_mma<NT>(w[tt][0], w[tt][1], w[tt][2], xv, acc[tt]);
          } else {
            u32 xv[NT][8];
            load_x<NT>(xv, x, xc, xstep, xro);
#pragma unroll
            for (int tt = 0; tt < TL; ++tt)
              chunk_mma<NT>(w[tt][0], w[tt][1], w[tt][2], xv, acc[tt]);
          }
        }
      }
    }
  }

  // The partial tiles through shared memory, then the block's outputs from there by positions,
  // each output the sum of its tile's kw partial tiles in warp order. The escape activations
  // of the thread's first position of every tile of the block are loaded right after the
  // first barrier.
  asm volatile("cp.async.wait_all;" ::: "memory");  // the epilogue's rows are in
  u32 tid;  // (a fresh read: nothing derived from it is held across the main loop)
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
  epi = epi_rows_at<NT, XS, TG, WS, TL, CL>(partial, kw);
  constexpr int KWB = CL * WB / TG;  // >= kw (the bound is max(8, kw) or kw TG, over CL)
  const int gq = TG == 1 ? 0 : (int)(tid >> 5) / kwl;  // the thread's tile group
  const int idx = (int)tid - gq * kwl * 32, nthr = kwl * 32;  // the thread among its group's
  const float4* part4 = reinterpret_cast<const float4*>(partial);
  if constexpr (CL > 1) {
    // Every block of the cluster gets every warp's partial tiles of every tile
    // ([TL][TG][kw][NT][32] float4, warp w at its place in 0..kw-1): stores into the other
    // blocks' shared memory, which do not wait, then one barrier; then each block stores its
    // share of the positions (block rank: the rank-th CL-th of them) from its own shared
    // memory. (Reading the other blocks' partials after the barrier instead cost a remote round
    // trip per partial, one after another: 14-17% slower than the unclustered kernel on the
    // same warps.) Nothing is read from another block after the barrier,
    // so no block waits for the others to leave.
    u32 remote[CL];
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");  // every block has started
#pragma unroll
    for (int q = 0; q < CL; ++q)
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote[q])
                   : "r"(smem_addr(partial)), "r"(q));
#pragma unroll
    for (int tt = 0; tt < TL; ++tt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        // (first: the warp's place among the kw)
        const u32 at = 16u * ((((tt * TG + grp) * kw + first) * NT + nt) * 32 + lane);
#pragma unroll
        for (int q = 0; q < CL; ++q)
          asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};"
                       ::"r"(remote[q] + at), "f"(acc[tt][nt][0]), "f"(acc[tt][nt][1]),
                       "f"(acc[tt][nt][2]), "f"(acc[tt][nt][3]) : "memory");
      }
    cluster_sync_all();  // (release, acquire) every block's partials are in
  }
  // The rest with the partial sums' bound cut to the smallest of 2, 4, 8 or KWB that holds kw
  // (predicated loads and adds for warps past kw cost the kw 2 layers 1-4% at 32 rows),
  // which also sets the positions' split.
  auto finish = [&](auto kbc) {
    constexpr int KB = decltype(kbc)::value;
    constexpr int S = epi_split<NT, KB>();
    constexpr int PT = NT * 32 * S / CL;  // positions of a tile that this block stores
    const int p0 = rank * PT, p1 = p0 + PT;
    float xg[TL][4 / S][ESC_STAGED];
    if constexpr (CL > 1) {
#pragma unroll
      for (int tt = 0; tt < TL; ++tt)
        if (p0 + idx < p1)
          gather_pos<S>(epi + (tt * erows + gq * 16) * EPI_WORDS, p0 + idx, M, ldx, x, xg[tt]);
#pragma unroll
      for (int tt = 0; tt < TL; ++tt) {
        const int row0 = ((bx * TG + gq) * TL + tt) * 16;
        if (row0 >= N) continue;
        store_tile<NT, KB>(epi + (tt * erows + gq * 16) * EPI_WORDS,
                           part4 + (size_t)(tt * TG + gq) * kw * NT * 32, p0, p1, idx, nthr,
                           row0, kw, M, N, ldx, x, y, esc_col, esc_delta, bias, xg[tt]);
      }
      return;
    }
    // one tile at a time through one tile's partial tiles of shared memory (all tiles' at once
    // runs 2-4% slower on the many-block layers at 32 rows)
    float4* mine = reinterpret_cast<float4*>(partial) + (size_t)(tid >> 5) * NT * 32;
    const float4* gp = part4 + (size_t)gq * kw * NT * 32;
#pragma unroll
    for (int tt = 0; tt < TL; ++tt) {
      if (tt > 0) __syncthreads();  // the previous tile's sums are read
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        mine[nt * 32 + (tid & 31)] =
            make_float4(acc[tt][nt][0], acc[tt][nt][1], acc[tt][nt][2], acc[tt][nt][3]);
      __syncthreads();
      if (tt == 0) {
#pragma unroll
        for (int t2 = 0; t2 < TL; ++t2)
          if (idx < PT)
            gather_pos<S>(epi + (t2 * erows + gq * 16) * EPI_WORDS, idx, M, ldx, x, xg[t2]);
      }
      const int row0 = ((bx * TG + gq) * TL + tt) * 16;
      if (row0 >= N) continue;
      store_tile<NT, KB>(epi + (tt * erows + gq * 16) * EPI_WORDS, gp, p0, p1, idx, nthr, row0,
                         kw, M, N, ldx, x, y, esc_col, esc_delta, bias, xg[tt]);
    }
  };
  [&] {
    if constexpr (KWB > 2)
      if (kw <= 2) return finish(IntC<2>());
    if constexpr (KWB > 4)
      if (kw <= 4) return finish(IntC<4>());
    if constexpr (KWB > 8)
      if (kw <= 8) return finish(IntC<8>());
    finish(IntC<KWB>());
  }();
}

template <int NT, int P, int TL, int MINB, int XS, int TG, int WB, int WS>
__global__ void __launch_bounds__(32 * WB, MINB) w12_gemm_small(
    const Words4* __restrict__ chunks, const bf16_t* __restrict__ x, bf16_t* __restrict__ y,
    const float* __restrict__ scale, const int* __restrict__ rowptr,
    const int* __restrict__ esc_col, const float* __restrict__ esc_delta,
    const bf16_t* __restrict__ bias, int M, int N, int ntiles, int nchunks, int ldx, int kw) {
  small_body<NT, P, TL, MINB, XS, TG, WB, WS, 1>(chunks, x, y, scale, rowptr, esc_col,
                                                      esc_delta, bias, M, N, ntiles, nchunks,
                                                      ldx, kw);
}

// The same sums with each tile group's kw warps spread over the CL blocks of a cluster
// (blocks CL b .. CL b + CL - 1 take tile block b): blocks of kw / CL warps.
template <int NT, int P, int TL, int MINB, int XS, int TG, int WB, int WS, int CL>
__global__ void __launch_bounds__(32 * WB, MINB) __cluster_dims__(CL, 1, 1) w12_gemm_small_cl(
    const Words4* __restrict__ chunks, const bf16_t* __restrict__ x, bf16_t* __restrict__ y,
    const float* __restrict__ scale, const int* __restrict__ rowptr,
    const int* __restrict__ esc_col, const float* __restrict__ esc_delta,
    const bf16_t* __restrict__ bias, int M, int N, int ntiles, int nchunks, int ldx, int kw) {
  small_body<NT, P, TL, MINB, XS, TG, WB, WS, CL>(chunks, x, y, scale, rowptr, esc_col,
                                                       esc_delta, bias, M, N, ntiles,
                                                       nchunks, ldx, kw);
}
