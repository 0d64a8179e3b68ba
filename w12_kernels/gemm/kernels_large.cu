// The large-M W12 GEMM on Hopper's warpgroup MMA (cuda_large.py). Compiled after kernels.cu
// (decode8, store_output) and the WgmmaSS<N> wrapper.
//
// Shared-memory operands are K-major with the 128-byte swizzle: row r (a token, or a weight
// row) holds the 64 K values of one chunk column in 128 bytes at r * 128, its 16-byte unit u
// (K values 8 u .. 8 u + 7 of the MMA order) stored at unit u ^ (r % 8), so that the tensor
// cores read 8 rows of one unit from 8 different bank groups (the non-swizzled layout timed
// the same here: the kernel is limited elsewhere, docs/PERF_GEMM.md). The K order is that of
// the weight fragments (layout.py): K index kk of MMA step j is column 16 ((kk % 8) / 2) + 4 j
// + 2 (kk / 8) + kk % 2 of the chunk, so unit u = 2 j + h holds the chunk's 32-bit words
// 8 t + u, t = 0..3.
//
// w12_permute_x: the activations as the images of the stages the GEMM copies in whole: for
// every block of BN tokens and every 64-column chunk, BN * 128 contiguous bytes in that
// layout. Tokens past M and columns past K come out as zeros.
//
// wgl_body<BN, WGS, SX, SW, SPLIT>: y[M, N] = x[M, K] @ W^T. A block holds WGS consumer
// warpgroups, each with 64 weight rows, BN activation rows shared by all of them, and one
// producer warp. The producer starts bulk copies (cp.async.bulk, completing on mbarriers) of
// each chunk column's activation image into one of SX stages (SX - 2 columns ahead) and of its
// chunk words (4 WGS tiles) into one of SW stages (SW columns ahead). Every consumer warp
// decodes its tile's words from there into the A fragments of the mma.sync kernel and stores
// them into one of two A buffers; each warpgroup then runs four wgmma m64nBNk16 with both
// operands from shared memory, leaving one column of MMAs in flight while the next column is
// decoded. One block barrier per column. With SPLIT > 1 the chunk columns are cut into SPLIT
// contiguous ranges, one per block of a thread-block cluster (1, 1, SPLIT), and the partial
// tiles are added in rank order 0, 1, ... through distributed shared memory (deterministic,
// no atomics, no workspace). The epilogue is store_output's arithmetic: scale, escape
// corrections in list order, bias, BF16.
//
// What shaped it (docs/PERF_GEMM.md, #19): with the A operand in registers, ptxas reused the
// fragment registers of the MMAs still in flight for the next column's decode (wrong sums);
// a branch on the thread index around the MMAs made ptxas serialize them (the role is
// broadcast with a shuffle so that the branch is warp-uniform). The copies are bulk copies
// started by a warp that never runs the proxy fence, so that no fence waits on them.

extern "C" __global__ void __launch_bounds__(256)
w12_permute_x(const bf16_t* __restrict__ x, u32* __restrict__ xp, int M, int K, int ldx,
              int nchunks, int bn, int pairs) {
  // block (c, tb, q): tokens tb * bn + 64 q .. + 63 of chunk c; `pairs`: x rows 4-byte aligned
  const int c = blockIdx.x;
  u32* image = xp + ((size_t)blockIdx.y * nchunks + c) * bn * 32;
#pragma unroll 4
  for (int w = blockIdx.z * 2048 + threadIdx.x; w < (blockIdx.z + 1) * 2048; w += 256) {
    const int n = w >> 5;                          // token within the block
    const int unit = ((w >> 2) & 7) ^ (n & 7);     // 16-byte unit 2 j + h, swizzled
    const int t = w & 3;
    const int tok = blockIdx.y * bn + n;
    const int col = c * 64 + 2 * (8 * t + unit);
    u32 v = 0u;
    if (tok < M) {
      const bf16_t* src = x + (size_t)tok * ldx + col;
      if (pairs && col + 1 < K)
        v = *reinterpret_cast<const u32*>(src);
      else
        v = (col < K ? (u32)src[0] : 0u) | ((col + 1 < K ? (u32)src[1] : 0u) << 16);
    }
    image[w] = v;
  }
}

// Matrix descriptor of a K-major operand with the 128-byte swizzle: 8-row groups 1024 bytes
// apart; `p` is the 1024-byte aligned buffer plus 32 bytes per K step.
__device__ __forceinline__ unsigned long long sw128_desc(const void* p) {
  const u32 addr = (u32)__cvta_generic_to_shared(p);
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) |
         ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ u32 smem_addr(const void* p) {
  return (u32)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ float load_cluster(const float* p, int rank) {
  u32 remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(p)),
               "r"(rank));
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
}

template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void mbar_wait(const unsigned long long* bar, u32 parity) {
  u32 done;
  do {
    asm volatile("{\n.reg .pred p;\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
  } while (!done);
}

__device__ __forceinline__ void bulk_copy(void* dst, const void* src, u32 bytes,
                                          unsigned long long* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
               "[%0], [%1], %2, [%3];"
               :: "r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}

template <int BN, int WGS, int SX, int SW, int SPLIT>
__device__ __forceinline__ void wgl_body(
    const Words4* __restrict__ chunks, const bf16_t* __restrict__ xp,
    const bf16_t* __restrict__ x, int ldx, bf16_t* __restrict__ y,
    const float* __restrict__ scale, const int* __restrict__ rowptr,
    const int* __restrict__ esc_col, const float* __restrict__ esc_delta,
    const bf16_t* __restrict__ bias, int M, int n_rows, int ntiles, int nchunks) {
  static_assert(BN % 64 == 0 && BN <= 256, "BN: 64, 128, 192 or 256 activation rows");
  static_assert(SX >= 3 && SW >= 2 && (SPLIT == 1 || SPLIT == 2 || SPLIT == 4), "config");
  constexpr int THREADS = 128 * WGS;
  constexpr int LX = SX - 2;              // activation columns copied ahead
  constexpr int XSTAGE = BN * 128;        // activation bytes per stage
  constexpr int WSTAGE = 4 * WGS * 1536;  // chunk bytes per stage
  constexpr int R = 64 * WGS;             // weight rows per block
  constexpr int PST = R + 4;              // floats per token row of the partial tile
  constexpr int ABUF = 64 * 64 * 2;       // bytes of one warpgroup's decoded column
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  unsigned char* wstages = smem + SX * XSTAGE;
  unsigned char* abufs = wstages + SW * WSTAGE;  // [2][WGS][ABUF]
  unsigned long long* xfull = reinterpret_cast<unsigned long long*>(abufs + 2 * WGS * ABUF);
  unsigned long long* wfull = xfull + SX;
  const int tid = threadIdx.x;
  const int wg = tid >> 7;
  const int warp = (tid >> 5) & 3;
  const int lane = tid & 31;
  const int tok0 = blockIdx.y * BN;
  const int rank = SPLIT > 1 ? (int)blockIdx.z : 0;  // cluster (1, 1, SPLIT): rank = z
  const int per = (nchunks + SPLIT - 1) / SPLIT;
  const int c0 = min(nchunks, rank * per);
  const int n = min(nchunks, c0 + per) - c0;
  const int tile0 = blockIdx.x * 4 * WGS;
  const bf16_t* ximg = xp + (size_t)blockIdx.y * nchunks * (XSTAGE / 2);

  // (the producer) start the copies of column col: its activation image into stage col % SX,
  // its chunk words into weight stage col % SW
  auto issue_x = [&](int col) {
    unsigned long long* bar = xfull + col % SX;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(smem_addr(bar)), "r"(XSTAGE) : "memory");
    bulk_copy(smem + (col % SX) * XSTAGE, ximg + (size_t)(c0 + col) * (XSTAGE / 2), XSTAGE,
              bar);
  };
  auto issue_w = [&](int col) {
    unsigned long long* bar = wfull + col % SW;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(smem_addr(bar)), "r"(WSTAGE) : "memory");
#pragma unroll
    for (int tt = 0; tt < 4 * WGS; ++tt) {
      const int tile = min(tile0 + tt, ntiles - 1);  // rows past the last are not stored
      bulk_copy(wstages + (col % SW) * WSTAGE + tt * 1536,
                chunks + ((size_t)tile * nchunks + c0 + col) * 96, 1536, bar);
    }
  };
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < SX + SW; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_addr(xfull + s)));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
  // the extra warp only starts the copies (broadcast from lane 0, so that ptxas sees a
  // warp-uniform branch and does not serialize the MMAs)
  const bool producer = __shfl_sync(0xffffffffu, tid >= THREADS ? 1 : 0, 0) != 0;
  if (tid == THREADS) {
    for (int s = 0; s < SW && s < n; ++s) issue_w(s);
    for (int s = 0; s < LX && s < n; ++s) issue_x(s);
  }

  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;

  // this lane's A values: register r of step j is row 16 warp + g + 8 (r % 2) of the
  // warpgroup, unit 2 j + r / 2, word t
  const int g = lane >> 2, t = lane & 3;
  const int aoff = wg * ABUF + (16 * warp + g) * 128 + t * 4;
  const int woff = (wg * 4 + warp) * 1536 + lane * 16;  // Words4 lane, lane + 32, lane + 64
  for (int i = 0; i < n; ++i) {
    unsigned char* abuf = abufs + (i & 1) * WGS * ABUF;  // last read by column i - 2: done
    if (!producer) {
      mbar_wait(wfull + i % SW, (u32)(i / SW) & 1u);  // column i's chunk words have landed
      const unsigned char* wsrc = wstages + (i % SW) * WSTAGE + woff;
      const Words4 w0 = *reinterpret_cast<const Words4*>(wsrc);
      const Words4 w1 = *reinterpret_cast<const Words4*>(wsrc + 512);
      const Words4 w2 = *reinterpret_cast<const Words4*>(wsrc + 1024);
      u32 a[4][4];
      decode8(w0.x, w1.x, w2.x, a[0]);
      decode8(w0.y, w1.y, w2.y, a[1]);
      decode8(w0.z, w1.z, w2.z, a[2]);
      decode8(w0.w, w1.w, w2.w, a[3]);
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r)
          *reinterpret_cast<u32*>(abuf + aoff + (r & 1) * 1024 +
                                  (((2 * j + (r >> 1)) ^ g) << 4)) = a[j][r];
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // for the MMAs' reads
    }
    __syncthreads();  // column i decoded by all (its weight stage is free); column i - 2
                      // multiplied by all (its activation stage is free)
    if (producer) {
      // The copies are started by a thread that never runs the proxy fence (a fence may wait
      // for what its thread has in flight).
      if (tid == THREADS) {
        if (i + SW < n) issue_w(i + SW);  // into weight stage i % SW
        if (i + LX < n) issue_x(i + LX);  // into activation stage (i - 2) % SX
      }
    } else {
      mbar_wait(xfull + i % SX, (u32)(i / SX) & 1u);  // column i's activations have landed
      const unsigned char* stage = smem + (i % SX) * XSTAGE;
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
      for (int j = 0; j < 4; ++j)
        WgmmaSS<BN>::mma(acc, sw128_desc(abuf + wg * ABUF + 32 * j),
                         sw128_desc(stage + 32 * j));
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      wgmma_wait<1>();  // column i - 1 is multiplied
    }
  }
  if (!producer) wgmma_wait<0>();
  __syncthreads();  // the stages are free: the memory takes the partial tile [BN][PST]

  float* part = reinterpret_cast<float*>(smem);
  if (!producer) {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) {
      const int r = wg * 64 + 16 * warp + g + 8 * ((i & 3) >> 1);
      const int col = 8 * (i >> 2) + 2 * t + (i & 1);
      part[col * PST + r] = acc[i];
    }
  }
  if (SPLIT > 1) cluster_sync_all(); else __syncthreads();
  // The outputs: thread (group, r) finishes row r for every GROUPS-th token of this block's
  // share (tokens rank * BN / SPLIT ..), reading the row's scale, escapes and bias once, TB
  // tokens at a time so that the activation loads of an escape are in flight together; the
  // same arithmetic as store_output.
  constexpr int GROUPS = (THREADS + 32) / R;
  constexpr int TB = 16;
  constexpr int TS = BN / SPLIT;  // tokens of this block's share
  const int first = rank * TS;
  const int last = min(first + TS, M - tok0);
  const int r = tid % R, group = tid / R;
  const int row = blockIdx.x * R + r;
  if (group < GROUPS && row < n_rows) {
    const float sc = scale[row];
    const int e0 = rowptr[row], e1 = rowptr[row + 1];
    const float b = bias != nullptr ? bf16_to_float(bias[row]) : 0.0f;
    for (int base = first + group; base < last; base += GROUPS * TB) {
      float out[TB];
#pragma unroll
      for (int u = 0; u < TB; ++u) {
        const int col = min(base + u * GROUPS, last - 1);
        const float* p = part + col * PST + r;
        float v;
        if (SPLIT > 1) {
          v = load_cluster(p, 0);
#pragma unroll
          for (int q = 1; q < SPLIT; ++q) v += load_cluster(p, q);  // fixed order
        } else {
          v = *p;
        }
        out[u] = v * sc;
      }
      for (int e = e0; e < e1; ++e) {
        const int ec = esc_col[e];
        const float d = esc_delta[e];
        float xv[TB];
#pragma unroll
        for (int u = 0; u < TB; ++u)
          xv[u] = bf16_to_float(x[(size_t)(tok0 + min(base + u * GROUPS, last - 1)) * ldx + ec]);
#pragma unroll
        for (int u = 0; u < TB; ++u) out[u] += xv[u] * d;
      }
#pragma unroll
      for (int u = 0; u < TB; ++u) {
        const int col = base + u * GROUPS;
        if (col < last) {
          float o = out[u];
          if (bias != nullptr) o += b;
          y[(size_t)(tok0 + col) * n_rows + row] = float_to_bf16(o);
        }
      }
    }
  }
  if (SPLIT > 1) cluster_sync_all();  // no block leaves while another reads its memory
}
