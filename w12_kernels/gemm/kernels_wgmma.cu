// EXPERIMENTAL (not used by w12_linear; see wgmma.py): the W12 GEMM with Hopper's warpgroup
// MMA. Compiled after kernels.cu (it uses its loads and decode8) and after the wgmma wrappers
// that wgmma.py generates (struct Wgmma<N>: one m64nNk16 bf16 MMA with A from registers and B
// from shared memory, accumulating in float32).
//
// w12_gemm_wg<N, P>: y[M, N_rows] = x[M, K] @ W^T. A block holds kw warpgroups and 64 weight
// rows (four 16-row tiles, warp w of each warpgroup decoding tile 4 * blockIdx.x + w), and N
// activation rows starting at N * blockIdx.y. Warpgroup q takes chunk columns q, q + kw, ...
// (the split of w12_gemm_small); per column each warp decodes its chunk into the four A
// fragments (the same registers as the mma.sync kernel), the warpgroup stages the column's
// activations in shared memory as the B operand (core matrices of 8 tokens x 8 K values,
// no swizzle), and four wgmma m64nNk16 accumulate. So 64 weight rows share one activation
// read, and the activations never sit in registers across the MMA. Per warp a ring of P
// columns of weight loads is in flight; the next column's activations are loaded while the
// current one is multiplied. The kw partial tiles are summed in shared memory in warpgroup
// order, then the epilogue of w12_gemm_small (scale, escapes in list order, bias, BF16).
//
// B layout for K step j of a column (64 columns = 4 steps of 16): K index kk of the MMA is
// column 16 * ((kk % 8) / 2) + 4 j + 2 * (kk / 8) + kk % 2 of the column block (the order the
// A fragments of layout.py use), i.e. 32-bit word 2 j + kk / 8 + 8 * ((kk % 8) / 2) of the
// token's 32 words. Core matrix (n group ng, k group kg) of step j lives at
// stage + j * N * 32 + (2 ng + kg) * 128: leading (K) byte offset 128, stride (N) offset 256.

__device__ __forceinline__ unsigned long long wg_desc(const void* smem_ptr) {
  const u32 addr = (u32)__cvta_generic_to_shared(smem_ptr);
  unsigned long long desc = (unsigned long long)((addr & 0x3FFFF) >> 4);
  desc |= (unsigned long long)(128 >> 4) << 16;  // leading byte offset: next core matrix in K
  desc |= (unsigned long long)(256 >> 4) << 32;  // stride byte offset: next core matrix in N
  return desc;                                   // base offset 0, no swizzle
}

// The 32 words (64 BF16) of token row `tok` in column block `chunk`, zeros past M.
__device__ __forceinline__ void wg_load_x(u32 (&w)[32], const bf16_t* x, int tok, int M, int ldx,
                                          int chunk) {
  if (tok < M) {
    const bf16_t* p = x + (size_t)tok * ldx + (size_t)chunk * 64;
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      const Words4 v = load_cached(p + 8 * q);
      w[4 * q] = v.x; w[4 * q + 1] = v.y; w[4 * q + 2] = v.z; w[4 * q + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 32; ++i) w[i] = 0u;
  }
}

template <int N>
__device__ __forceinline__ void wg_store_x(unsigned char* stage, const u32 (&w)[32], int n) {
  unsigned char* base = stage + (n >> 3) * 256 + (n & 7) * 16;
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int kg = 0; kg < 2; ++kg) {
      const int w0 = 2 * j + kg;
      *reinterpret_cast<uint4*>(base + j * N * 32 + kg * 128) =
          make_uint4(w[w0], w[w0 + 8], w[w0 + 16], w[w0 + 24]);
    }
}

__device__ __forceinline__ void wg_barrier(int id) {
  asm volatile("bar.sync %0, 128;" ::"r"(id));
}

template <int N, int P>
__global__ void __launch_bounds__(256) w12_gemm_wg(
    const Words4* __restrict__ chunks, const bf16_t* __restrict__ x, bf16_t* __restrict__ y,
    const float* __restrict__ scale, const int* __restrict__ rowptr,
    const int* __restrict__ esc_col, const float* __restrict__ esc_delta,
    const bf16_t* __restrict__ bias, int M, int n_rows, int ntiles, int nchunks, int ldx,
    int kw) {
  static_assert(N % 16 == 0 && N <= 128, "N: 16..128 in steps of 16");
  extern __shared__ __align__(128) unsigned char smem[];
  const int wg = threadIdx.x >> 7;
  const int tid = threadIdx.x & 127;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int tile = min(blockIdx.x * 4 + warp, ntiles - 1);  // rows past the last are not stored
  const int tok0 = blockIdx.y * N;
  const int n = (nchunks - wg + kw - 1) / kw;  // this warpgroup's columns: wg + i * kw
  unsigned char* stages = smem + wg * 2 * N * 128;
  const Words4* wp = chunks + (size_t)tile * nchunks * 96 + lane;

  float acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = 0.0f;

  Words4 ring[P][3];
#pragma unroll
  for (int s = 0; s < P; ++s) {
    if (s < n) {
      const Words4* p = wp + (size_t)(wg + s * kw) * 96;
      ring[s][0] = load_stream(p);
      ring[s][1] = load_stream(p + 32);
      ring[s][2] = load_stream(p + 64);
    }
  }
  u32 xw[32];
  const bool stager = tid < N;  // thread tid stages token tok0 + tid
  if (n > 0 && stager) {
    wg_load_x(xw, x, tok0 + tid, M, ldx, wg);
    wg_store_x<N>(stages, xw, tid);
    asm volatile("fence.proxy.async.shared::cta;");
  }
  for (int i = 0; i < n; i += P) {
#pragma unroll
    for (int s = 0; s < P; ++s) {
      const int ii = i + s;
      if (ii < n) {
        const Words4 w0 = ring[s][0], w1 = ring[s][1], w2 = ring[s][2];
        if (ii + P < n) {
          const Words4* p = wp + (size_t)(wg + (ii + P) * kw) * 96;
          ring[s][0] = load_stream(p);
          ring[s][1] = load_stream(p + 32);
          ring[s][2] = load_stream(p + 64);
        }
        if (ii + 1 < n && stager) wg_load_x(xw, x, tok0 + tid, M, ldx, wg + (ii + 1) * kw);
        u32 a[4][4];
        decode8(w0.x, w1.x, w2.x, a[0]);
        decode8(w0.y, w1.y, w2.y, a[1]);
        decode8(w0.z, w1.z, w2.z, a[2]);
        decode8(w0.w, w1.w, w2.w, a[3]);
        wg_barrier(1 + wg);  // the column's activations are staged and fenced by all stagers
        unsigned char* stage = stages + (ii & 1) * N * 128;
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int j = 0; j < 4; ++j) Wgmma<N>::mma(acc, a[j], wg_desc(stage + j * N * 32));
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        if (ii + 1 < n && stager) {
          // the other stage was last read by column ii - 1, finished before this barrier
          wg_store_x<N>(stages + ((ii + 1) & 1) * N * 128, xw, tid);
          asm volatile("fence.proxy.async.shared::cta;");
        }
      }
    }
  }

  __syncthreads();  // every warpgroup is done with its stages: the memory takes the partials
  float* partial = reinterpret_cast<float*>(smem);  // [kw][64 rows][N]
  float* mine = partial + (size_t)wg * 64 * N;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    const int r = 16 * warp + g + 8 * ((i & 3) >> 1);
    const int col = 8 * (i >> 2) + 2 * t + (i & 1);
    mine[r * N + col] = acc[i];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < 64 * N; idx += blockDim.x) {
    const int r = idx / N;
    const int col = idx - r * N;
    const int row = blockIdx.x * 64 + r;
    const int tok = tok0 + col;
    if (row >= n_rows || tok >= M) continue;
    float v = partial[idx];
    for (int q = 1; q < kw; ++q) v += partial[(size_t)q * 64 * N + idx];  // fixed order
    store_output(v, row, tok, x, y, scale, rowptr, esc_col, esc_delta, bias, n_rows, ldx);
  }
}
