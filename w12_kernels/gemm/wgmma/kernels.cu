// The W12 GEMM for 9..128 activation rows with Hopper's warpgroup MMA, giving the bits of the
// mma.sync kernel (small/kernels.cu, w12_gemm_small) for the same K split (N = 128: what two
// 64-row passes of it give, in one pass over the weight).

#include "common.cuh"
#include "wgmma.cuh"

// w12_x_image<N>: the activations rearranged once per call into stage images (the B operand's
// order below), so that a column's activations reach shared memory in one bulk copy.
//
// w12_gemm_wg<N, R, KB, S, RG>: y[M, N_rows] = x[M, K] @ W^T. A block holds RG groups of 64
// weight rows (four 16-row tiles each; warp w of warpgroup (r, g) decodes tile
// 4 (RG blockIdx.x + r) + w), N activation rows starting at N * blockIdx.y, RG x KB MMA
// warpgroups and one staging warp; gridDim.z = split blocks share a row range's K. The K split
// is w12_gemm_small's with kw = KB * S * split: partial sum q (0 <= q < kw) adds chunk columns
// q, q + kw, q + 2 kw, ... in order. Block z's warpgroups (r, g) hold partials
// q = z KB S + g + KB s (s < S accumulator sets), so their columns are those with c % kw among
// them, taken in increasing order (the i-th to set i % S).
//
// Per column one thread of the staging warp issues bulk copies (cp.async.bulk, the async
// proxy) of the column's activation image and of the RG x 4 tiles' chunks into the warpgroup
// column's stage (a ring of R per g, shared by the RG row groups), signalling an mbarrier with
// the byte count (full); the MMA warps wait on it, read their chunk (three 16-byte shared
// loads a lane), decode it straight into the A fragment registers (the mma.sync kernel's
// registers; two sets, even and odd columns), and run four wgmma m64nNk16; the MMAs of a
// column stay in flight while the next column is decoded (wait_group 1 retires the column
// before), after which one lane per warp frees the stage (empty). Nothing in the MMA warps
// fences or waits on a global load: decoded weights stored to shared memory before the MMAs
// would need a proxy fence, which compiles to MEMBAR.ALL.CTA and so waits for the weight
// loads in flight as well.
//
// The fold, in order q = 0..kw-1: with split 1 in shared memory, the KB partials of each set
// added to a running sum; with split > 1 every block stores its partial tiles in a float32
// workspace and the last block of the row range to arrive (an integer counter per range, put
// back to zero by that block) adds all kw. Then the epilogue of w12_gemm_small (scale, escapes
// in list order, bias, BF16): the same sums in the same order as w12_gemm_small, so the same
// bits wherever the tensor cores' m64nNk16 and m16n8k16 products agree (the GPU tests check
// it), and an output row's bits do not depend on M.
//
// B layout for K step j of a column (64 columns = 4 steps of 16): K index kk of the MMA is
// column 16 * ((kk % 8) / 2) + 4 j + 2 * (kk / 8) + kk % 2 of the column block (the order the
// A fragments of layout.py use), i.e. 32-bit word 2 j + kk / 8 + 8 * ((kk % 8) / 2) of the
// token's 32 words. Core matrix (n group ng, k group kg) of step j lives at
// stage + j * N * 32 + (2 ng + kg) * 128: leading (K) byte offset 128, stride (N) offset 256.
// Image item (n, u) (token n, quarter u: the token's words 8u..8u+7) puts word 8u + m at
// step m / 2, k group m % 2, row n % 8, bytes 4u..4u+3.

__device__ __forceinline__ unsigned long long wg_desc(const void* smem_ptr) {
  const u32 addr = (u32)__cvta_generic_to_shared(smem_ptr);
  unsigned long long desc = (unsigned long long)((addr & 0x3FFFF) >> 4);
  desc |= (unsigned long long)(128 >> 4) << 16;  // leading byte offset: next core matrix in K
  desc |= (unsigned long long)(256 >> 4) << 32;  // stride byte offset: next core matrix in N
  return desc;                                   // base offset 0, no swizzle
}

__device__ __forceinline__ u32 wg_smem(const void* p) {
  return (u32)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void wg_mbar_init(unsigned long long* bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(wg_smem(bar)), "r"(count)
               : "memory");
}

__device__ __forceinline__ void wg_mbar_arrive(unsigned long long* bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}" ::"r"(
                   wg_smem(bar))
               : "memory");
}

__device__ __forceinline__ bool wg_mbar_test(unsigned long long* bar, u32 parity) {
  u32 done;
  asm volatile("{\n.reg .pred p;\n"
               "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
               "selp.u32 %0, 1, 0, p;\n}"
               : "=r"(done) : "r"(wg_smem(bar)), "r"(parity) : "memory");
  return done != 0u;
}

__device__ __forceinline__ void wg_mbar_wait(unsigned long long* bar, u32 parity) {
  while (!wg_mbar_test(bar, parity)) {
  }
}

// w12_x_image<N>: the activations as stage images, xi[token block][column][N * 128 bytes] in
// the B operand's order (above), zeros past M; grid (columns, token blocks), 4 N threads, item
// (n, u) = (threadIdx.x / 4, threadIdx.x % 4). A warp's 4-byte stores of one word m fill 128
// contiguous bytes.
template <int N>
__global__ void __launch_bounds__(4 * N) w12_x_image(const bf16_t* __restrict__ x,
                                                    unsigned char* __restrict__ xi, int M,
                                                    int ldx, int nchunks) {
  const int c = blockIdx.x, tb = blockIdx.y;
  const int n = threadIdx.x >> 2, u = threadIdx.x & 3;
  const int tok = tb * N + n;
  Words4 a = {0u, 0u, 0u, 0u}, b = {0u, 0u, 0u, 0u};
  if (tok < M) {
    const bf16_t* p = x + (size_t)tok * ldx + (size_t)c * 64 + 16 * u;
    a = load_cached(p);
    b = load_cached(p + 8);
  }
  const u32 w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  unsigned char* base = xi + ((size_t)tb * nchunks + c) * (N * 128) + (n >> 3) * 256 +
                        (n & 7) * 16 + 4 * u;
#pragma unroll
  for (int m = 0; m < 8; ++m)
    *reinterpret_cast<u32*>(base + (m >> 1) * N * 32 + (m & 1) * 128) = w[m];
}

__device__ __forceinline__ void wg_expect_bytes(unsigned long long* bar, u32 bytes) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}" ::
                   "r"(wg_smem(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void wg_bulk_copy(void* dst, const void* src, u32 bytes,
                                             unsigned long long* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
               "[%0], [%1], %2, [%3];"
               :: "r"(wg_smem(dst)), "l"(src), "r"(bytes), "r"(wg_smem(bar)) : "memory");
}

template <int N, int R, int KB, int S, int RG>
__global__ void __launch_bounds__(128 * KB * RG + 32) w12_gemm_wg(
    const Words4* __restrict__ chunks, const bf16_t* __restrict__ x, bf16_t* __restrict__ y,
    const float* __restrict__ scale, const int* __restrict__ rowptr,
    const int* __restrict__ esc_col, const float* __restrict__ esc_delta,
    const bf16_t* __restrict__ bias, const unsigned char* __restrict__ xi,
    float* __restrict__ ws, int* __restrict__ counters, int M, int n_rows, int ntiles,
    int nchunks, int ldx) {
  static_assert(N % 16 == 0 && N >= 16 && N <= 128, "N: 16, 32, 48, 64 or 128 activation rows");
  static_assert(R == 4 || R == 6 || R == 8, "R: 4, 6 or 8 stages");
  static_assert(S == 1 || S == 2 || S == 4, "S: 1, 2 or 4 accumulator sets");
  static_assert(RG == 1 || RG == 2, "RG: 1 or 2 row groups");
  constexpr int U = S > 2 ? S : 2;  // the loop's unroll: A set and accumulator set constant
  constexpr int XSTAGE = N * 128;   // bytes of one column's activations
  constexpr int STAGE = XSTAGE + RG * 4 * 1536;  // and the chunks of the RG x 4 tiles
  constexpr int KWB = KB * S;       // partial sums per block
  constexpr int ROWS = 64 * RG;     // weight rows per block
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned long long* full = reinterpret_cast<unsigned long long*>(smem);  // [KB][R]
  unsigned long long* empty = full + KB * R;                                // [KB][R]
  static_assert(2 * KB * R * 8 <= 504, "the mbarriers fit their 512 bytes");
  int* last_flag = reinterpret_cast<int*>(smem + 504);
  unsigned char* stages = smem + 512;  // [KB][R][STAGE]
  const int split = gridDim.z;         // blocks sharing the kw partial sums of their rows
  const int kw = KWB * split;
  const int z = blockIdx.z;
  const int wgi = threadIdx.x >> 7;  // warpgroup (rg, g); RG * KB: the staging warp
  const int rg = wgi / KB, g = wgi - rg * KB;
  const int tid = threadIdx.x & 127;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int tok0 = blockIdx.y * N;
  const bool stager = wgi == RG * KB;
  if (threadIdx.x == 0) {
    for (int b = 0; b < KB * R; ++b) {
      wg_mbar_init(full + b, 1);        // the staging thread's arrival with the byte count
      wg_mbar_init(empty + b, 4 * RG);  // one lane of each warp reading the stage
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  float acc[S][N / 2];
#pragma unroll
  for (int s = 0; s < S; ++s)
#pragma unroll
    for (int i = 0; i < N / 2; ++i) acc[s][i] = 0.0f;

  if (stager) {
    // The staging thread, the block's columns in increasing order: column c = kw i' + z KWB
    // + t (0 <= t < KWB) is warpgroup t % KB's local column i = S i' + t / KB (partial
    // q = c % kw), in its stage i % R: bulk copies (async proxy: no fence) of its activation
    // image and of the tiles' chunks, signalling full when all bytes have landed.
    if (lane == 0) {
      const unsigned char* src = xi + (size_t)blockIdx.y * nchunks * XSTAGE;
      const unsigned char* wsrc[RG * 4];
#pragma unroll
      for (int w = 0; w < RG * 4; ++w)
        wsrc[w] = reinterpret_cast<const unsigned char*>(chunks) +
                  (size_t)min(blockIdx.x * RG * 4 + w, ntiles - 1) * nchunks * 1536;
      for (int i1 = 0;; ++i1) {
        const int c0 = kw * i1 + z * KWB;
        if (c0 >= nchunks) break;
        for (int t = 0; t < KWB && c0 + t < nchunks; ++t) {
          const int c = c0 + t, gi = t % KB, i = S * i1 + t / KB;
          if (i >= R) wg_mbar_wait(empty + gi * R + i % R, (u32)(i / R - 1) & 1u);
          unsigned long long* bar = full + gi * R + i % R;
          unsigned char* dst = stages + (gi * R + i % R) * STAGE;
          wg_expect_bytes(bar, STAGE);
          wg_bulk_copy(dst, src + (size_t)c * XSTAGE, XSTAGE, bar);
#pragma unroll
          for (int w = 0; w < RG * 4; ++w)
            wg_bulk_copy(dst + XSTAGE + w * 1536, wsrc[w] + (size_t)c * 1536, 1536, bar);
        }
      }
    }
  } else {
    // this warpgroup's columns: set s has those with c = z KWB + g + KB s + kw i'
    int n = 0;
#pragma unroll
    for (int s = 0; s < S; ++s) {
      const int base = z * KWB + g + KB * s;
      n += base < nchunks ? (nchunks - base + kw - 1) / kw : 0;
    }
    u32 a[2][4][4];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) a[h][j][r] = 0u;
    // the descriptor of this warpgroup's first stage; a byte offset d below 256 KiB moves its
    // start-address field (address / 16, 14 bits) by d / 16 without a carry out of the field
    const unsigned long long desc0 = wg_desc(stages + g * R * STAGE);

    for (int i0 = 0; i0 < n; i0 += U) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int i = i0 + u;
        if (i < n) {
          const unsigned char* stage = stages + (g * R + i % R) * STAGE;
          wg_mbar_wait(full + g * R + i % R, (u32)(i / R) & 1u);  // column i has landed
          const uint4* wq =
              reinterpret_cast<const uint4*>(stage + XSTAGE + (rg * 4 + warp) * 1536) + lane;
          const uint4 v0 = wq[0], v1 = wq[32], v2 = wq[64];
          // A set u % 2 was last read by column i - 2, retired by the wait of column i - 1
          u32(&cur)[4][4] = a[u % 2];
          decode8(v0.x, v1.x, v2.x, cur[0]);
          decode8(v0.y, v1.y, v2.y, cur[1]);
          decode8(v0.z, v1.z, v2.z, cur[2]);
          decode8(v0.w, v1.w, v2.w, cur[3]);
          asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
          const unsigned long long desc = desc0 + (unsigned long long)((i % R) * (STAGE / 16));
#pragma unroll
          for (int j = 0; j < 4; ++j) WgmmaRS<N>::mma(acc[u % S], cur[j], desc + j * (N * 2));
          asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
          asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");  // column i - 1 done
          keep_regs(a[(u + 1) % 2]);
          if (i >= 1 && lane == 0) wg_mbar_arrive(empty + g * R + (i - 1) % R);
        }
      }
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    keep_regs(a[0]);
    keep_regs(a[1]);
  }

  const int gg = lane >> 2, t = lane & 3;
  constexpr int THREADS = 128 * KB * RG;  // the MMA warps
  constexpr int ITEMS = (ROWS * N + THREADS - 1) / THREADS;
  const int row0 = blockIdx.x * ROWS;
  if (split > 1) {
    // Across blocks: every block stores its partial tiles (ws[token block][q][row][N]); the
    // last block of the row range to finish adds all kw in order q = 0..kw-1.
    const int rows_all = gridDim.x * ROWS;
    if (!stager) {
#pragma unroll
      for (int s = 0; s < S; ++s) {
        const int q = z * KWB + g + KB * s;
        float* dst = ws + ((size_t)(blockIdx.y * kw + q) * rows_all + row0 + rg * 64) * N;
#pragma unroll
        for (int i = 0; i < N / 2; i += 2) {
          const int r = 16 * warp + gg + 8 * ((i & 3) >> 1);
          const int col = 8 * (i >> 2) + 2 * t;
          *reinterpret_cast<float2*>(dst + r * N + col) = make_float2(acc[s][i], acc[s][i + 1]);
        }
      }
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      int* counter = counters + blockIdx.y * gridDim.x + blockIdx.x;
      const int before = atomicAdd(counter, 1);
      *last_flag = before == split - 1;
      if (before == split - 1) *counter = 0;  // ready for the next launch
    }
    __syncthreads();
    if (!*last_flag) return;
    __threadfence();
    if (stager) return;
    for (int idx = threadIdx.x; idx < ROWS * N; idx += THREADS) {
      const float* src = ws + ((size_t)blockIdx.y * kw * rows_all + row0) * N + idx;
      float v = __ldcg(src);
      for (int q = 1; q < kw; ++q) v += __ldcg(src + (size_t)q * rows_all * N);  // fixed order
      const int r = idx / N;
      const int col = idx - r * N;
      const int row = row0 + r;
      const int tok = tok0 + col;
      if (row < n_rows && tok < M)
        store_output(v, row, tok, x, y, scale, rowptr, esc_col, esc_delta, bias, n_rows, ldx);
    }
    return;
  }

  // In the block: partial q = g + KB s. For s = 0..S-1 each warpgroup writes set s to slot g
  // of [KB][ROWS][N], then every output adds the KB slots in order to its running sum.
  float* partial = reinterpret_cast<float*>(stages);
  float v[ITEMS];
#pragma unroll
  for (int s = 0; s < S; ++s) {
    __syncthreads();  // stages (s = 0) or the previous slots are no longer read
    if (!stager) {
      float* mine = partial + ((size_t)g * ROWS + rg * 64) * N;
#pragma unroll
      for (int i = 0; i < N / 2; ++i) {
        const int r = 16 * warp + gg + 8 * ((i & 3) >> 1);
        const int col = 8 * (i >> 2) + 2 * t + (i & 1);
        mine[r * N + col] = acc[s][i];
      }
    }
    __syncthreads();
#pragma unroll
    for (int it = 0; it < ITEMS; ++it) {
      const int idx = threadIdx.x + it * THREADS;
      if (!stager && idx < ROWS * N) {
        float sum = s == 0 ? partial[idx] : v[it] + partial[idx];
#pragma unroll
        for (int q = 1; q < KB; ++q) sum += partial[(size_t)q * ROWS * N + idx];  // in order
        v[it] = sum;
      }
    }
  }
#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    const int idx = threadIdx.x + it * THREADS;
    const int r = idx / N;
    const int col = idx - r * N;
    const int row = row0 + r;
    const int tok = tok0 + col;
    if (!stager && idx < ROWS * N && row < n_rows && tok < M)
      store_output(v[it], row, tok, x, y, scale, rowptr, esc_col, esc_delta, bias, n_rows,
                   ldx);
  }
}
