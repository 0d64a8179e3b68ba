// W12 GEMM kernels in CUDA C, compiled at run time with NVRTC (see cuda.py).
//
// Weights are read in the chunk layout of layout.py: a chunk is 16 rows x 64 columns, 1536
// bytes, three 16-byte loads per lane of a warp, and holds the A operands of four
// mma.m16n8k16 (weights on the MMA's M side, activation rows on its N side, 8 per n-tile).
// Nothing goes through shared memory on the way to the tensor cores: each lane decodes its
// own words into the exact fragment registers, so the main loop is loads, 11 integer
// operations per 8 weights, and MMAs.
//
// w12_gemm_small<NT, P, XPF, IL>: y[M, N] = x[M, K] @ W^T for M <= 8 * NT. One block per 16-row tile;
// its kw warps split the tile's chunks into kw contiguous ranges, each warp keeps P chunks of
// loads in flight (a ring of registers indexed by compile-time constants), and the block sums
// the kw partial tiles in shared memory in warp order 0..kw-1. No atomics, and the split
// depends on the weight shape only, so the bits of an output row do not depend on M.
// The epilogue scales each row by 2^(e0 - 112), adds the escape corrections in list order and
// the bias, and rounds to BF16.
//
// w12_decode: the in-window weights as BF16 [N, K] (escapes come out as record 0; the caller
// writes them in).

typedef unsigned short bf16_t;
typedef unsigned int u32;

struct alignas(16) Words4 {
  u32 x, y, z, w;
};

__device__ __forceinline__ Words4 load_stream(const Words4* p) {
  Words4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ Words4 load_cached(const void* p) {
  Words4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Three words (low bytes of weights 0..3, of 4..7, the sign/exponent bits) -> four BF16 pairs
// in the order of an m16n8k16 A fragment (layout.py, B_POSITIONS).
__device__ __forceinline__ void decode8(u32 lo_a, u32 lo_b, u32 top, u32 (&r)[4]) {
  u32 p0, p1, p2, p3, t1, t2, t3;
  asm("prmt.b32 %0, %1, 0x38383838, 0x4140;" : "=r"(p0) : "r"(lo_a));
  asm("prmt.b32 %0, %1, 0x38383838, 0x4342;" : "=r"(p1) : "r"(lo_a));
  asm("prmt.b32 %0, %1, 0x38383838, 0x4140;" : "=r"(p2) : "r"(lo_b));
  asm("prmt.b32 %0, %1, 0x38383838, 0x4342;" : "=r"(p3) : "r"(lo_b));
  t1 = top << 4;
  t2 = top << 8;
  asm("shf.r.wrap.b32 %0, %1, %1, 4;" : "=r"(t3) : "r"(top));
  asm("lop3.b32 %0, %1, 0x87008700, %2, 0xEA;" : "=r"(r[0]) : "r"(top), "r"(p0));
  asm("lop3.b32 %0, %1, 0x87008700, %2, 0xEA;" : "=r"(r[1]) : "r"(t1), "r"(p1));
  asm("lop3.b32 %0, %1, 0x87008700, %2, 0xEA;" : "=r"(r[2]) : "r"(t2), "r"(p2));
  asm("lop3.b32 %0, %1, 0x87008700, %2, 0xEA;" : "=r"(r[3]) : "r"(t3), "r"(p3));
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float bf16_to_float(bf16_t v) {
  return __uint_as_float(((u32)v) << 16);
}

__device__ __forceinline__ bf16_t float_to_bf16(float v) {
  bf16_t r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(v));
  return r;
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

template <int NT>
__device__ __forceinline__ void load_x(u32 (&xv)[NT][8], const bf16_t* const (&xrow)[NT],
                                       const bool (&live)[NT], int chunk) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    if (live[nt]) {
      const Words4 a = load_cached(xrow[nt] + (size_t)chunk * 64);
      const Words4 b = load_cached(xrow[nt] + (size_t)chunk * 64 + 8);
      xv[nt][0] = a.x; xv[nt][1] = a.y; xv[nt][2] = a.z; xv[nt][3] = a.w;
      xv[nt][4] = b.x; xv[nt][5] = b.y; xv[nt][6] = b.z; xv[nt][7] = b.w;
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) xv[nt][i] = 0u;
    }
  }
}

template <int NT, int P, bool XPF, bool IL>
__global__ void __launch_bounds__(256) w12_gemm_small(
    const Words4* __restrict__ chunks, const bf16_t* __restrict__ x, bf16_t* __restrict__ y,
    const float* __restrict__ scale, const int* __restrict__ rowptr,
    const int* __restrict__ esc_col, const float* __restrict__ esc_delta,
    const bf16_t* __restrict__ bias, int M, int N, int nchunks, int ldx, int kw) {
  extern __shared__ float partial[];  // [kw][NT * 4][32]
  const int tile = blockIdx.x;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  // warp's chunks: first + i * step for i < n (contiguous range, or every kw-th when IL)
  const int c_begin = (int)((long long)nchunks * warp / kw);
  const int first = IL ? warp : c_begin;
  const int step = IL ? kw : 1;
  const int n = IL ? (nchunks - warp + kw - 1) / kw
                   : (int)((long long)nchunks * (warp + 1) / kw) - c_begin;
  const Words4* wp = chunks + (size_t)tile * nchunks * 96 + lane;

  const bf16_t* xrow[NT];
  bool live[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int tok = nt * 8 + g;
    live[nt] = tok < M;
    xrow[nt] = x + (size_t)(live[nt] ? tok : 0) * ldx + 16 * t;
  }

  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[nt][r] = 0.0f;

  Words4 ring[P][3];
#pragma unroll
  for (int s = 0; s < P; ++s) {
    if (s < n) {
      const Words4* p = wp + (size_t)(first + s * step) * 96;
      ring[s][0] = load_stream(p);
      ring[s][1] = load_stream(p + 32);
      ring[s][2] = load_stream(p + 64);
    }
  }
  u32 xa[NT][8], xb[NT][8];
  if (XPF && n > 0) load_x<NT>(xa, xrow, live, first);
  for (int i = 0; i < n; i += P) {
#pragma unroll
    for (int s = 0; s < P; ++s) {
      const int ii = i + s;
      if (ii < n) {
        const Words4 w0 = ring[s][0], w1 = ring[s][1], w2 = ring[s][2];
        if (ii + P < n) {
          const Words4* p = wp + (size_t)(first + (ii + P) * step) * 96;
          ring[s][0] = load_stream(p);
          ring[s][1] = load_stream(p + 32);
          ring[s][2] = load_stream(p + 64);
        }
        if (XPF) {  // activations one chunk ahead; P is even, so s's parity is ii's
          u32(&cur)[NT][8] = (s & 1) ? xb : xa;
          u32(&nxt)[NT][8] = (s & 1) ? xa : xb;
          if (ii + 1 < n) load_x<NT>(nxt, xrow, live, first + (ii + 1) * step);
          chunk_mma<NT>(w0, w1, w2, cur, acc);
        } else {
          u32 xv[NT][8];
          load_x<NT>(xv, xrow, live, first + ii * step);
          chunk_mma<NT>(w0, w1, w2, xv, acc);
        }
      }
    }
  }

  float* mine = partial + (size_t)warp * NT * 4 * 32;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int r = 0; r < 4; ++r) mine[(nt * 4 + r) * 32 + lane] = acc[nt][r];
  __syncthreads();

  for (int idx = threadIdx.x; idx < NT * 4 * 32; idx += blockDim.x) {
    const int ln = idx & 31;
    const int item = idx >> 5;  // nt * 4 + r
    const int r = item & 3;
    const int row = tile * 16 + (ln >> 2) + 8 * (r >> 1);
    const int tok = (item >> 2) * 8 + 2 * (ln & 3) + (r & 1);
    if (row >= N || tok >= M) continue;
    float v = partial[item * 32 + ln];
    for (int w = 1; w < kw; ++w) v += partial[(w * NT * 4 + item) * 32 + ln];  // fixed order
    float out = v * scale[row];
    const bf16_t* xt = x + (size_t)tok * ldx;
    for (int e = rowptr[row]; e < rowptr[row + 1]; ++e)
      out += bf16_to_float(xt[esc_col[e]]) * esc_delta[e];
    if (bias != nullptr) out += bf16_to_float(bias[row]);
    y[(size_t)tok * N + row] = float_to_bf16(out);
  }
}

// ---------------------------------------------------------------------------------------
// w12_gemm_tma<NT, RT, S>: the same product with the weight stream moved by the bulk copy
// engine. Each warp owns RT row tiles and a contiguous range of their chunks (the same kw
// ranges as above, so the two kernels sum in the same order) and runs its own S-stage
// pipeline: lane r < RT copies chunk i of tile r into stage i % S (cp.async.bulk, completing
// on the stage's mbarrier), all lanes wait on the barrier, read their three words per tile
// from shared memory, decode and multiply; after the MMAs have consumed a stage the warp
// refills it with chunk i + S. Bytes in flight are set by S and no longer by registers, and
// the activation fragments, loaded one chunk ahead, serve RT row tiles.

__device__ __forceinline__ u32 smem_addr(const void* p) {
  u32 r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}

__device__ __forceinline__ void mbar_expect(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
  asm volatile(
      "{\n .reg .pred done;\n"
      "WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra WAIT_%=;\n}" ::"r"(bar), "r"(parity)
      : "memory");
}

__device__ __forceinline__ void bulk_copy(u32 dst, const void* src, u32 bytes, u32 bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      ::"r"(dst), "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

__device__ __forceinline__ Words4 load_shared(u32 addr) {
  Words4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}

template <int NT, int RT, int S>
struct TmaWarp {
  const char* tile_base;  // chunk 0 of the first row tile; the others follow at tile_bytes
  size_t tile_bytes;
  int rt_live;
  int c_begin, n;
  u32 bars, bufs;  // shared addresses: S mbarriers, S stages of RT chunks
  int lane;

  __device__ __forceinline__ void issue(int i) {
    const int s = i % S;
    if (lane == 0) mbar_expect(bars + 8 * s, 1536u * rt_live);
    __syncwarp();
    if (lane < rt_live)
      bulk_copy(bufs + (s * RT + lane) * 1536,
                tile_base + lane * tile_bytes + (size_t)(c_begin + i) * 1536, 1536u,
                bars + 8 * s);
  }

  __device__ __forceinline__ void consume(int i, const u32 (&xv)[NT][8], float (&acc)[RT][NT][4]) {
    const int s = i % S;
    mbar_wait(bars + 8 * s, (u32)((i / S) & 1));
#pragma unroll
    for (int r = 0; r < RT; ++r) {
      if (r < rt_live) {
        const u32 base = bufs + (s * RT + r) * 1536 + lane * 16;
        const Words4 w0 = load_shared(base), w1 = load_shared(base + 512),
                     w2 = load_shared(base + 1024);
        chunk_mma<NT>(w0, w1, w2, xv, acc[r]);
      }
    }
    __syncwarp();
    if (i + S < n) issue(i + S);
  }
};

template <int NT, int RT, int S, bool XPF>
__global__ void __launch_bounds__(256) w12_gemm_tma(
    const Words4* __restrict__ chunks, const bf16_t* __restrict__ x, bf16_t* __restrict__ y,
    const float* __restrict__ scale, const int* __restrict__ rowptr,
    const int* __restrict__ esc_col, const float* __restrict__ esc_delta,
    const bf16_t* __restrict__ bias, int M, int N, int ntiles, int nchunks, int ldx, int kw) {
  extern __shared__ __align__(128) unsigned char smem[];
  // [kw][S] mbarriers (8 bytes each), then 128-byte aligned [kw][S][RT] chunk buffers; after
  // the main loop the buffers hold the partial tiles [kw][RT][NT * 4][32] floats.
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int tile0 = blockIdx.x * RT;
  const u32 bar_area = smem_addr(smem);
  const u32 buf_area = bar_area + ((kw * S * 8 + 127) / 128) * 128;

  TmaWarp<NT, RT, S> wp;
  wp.lane = lane;
  wp.rt_live = min(RT, ntiles - tile0);
  wp.c_begin = (int)((long long)nchunks * warp / kw);
  wp.n = (int)((long long)nchunks * (warp + 1) / kw) - wp.c_begin;
  wp.bars = bar_area + warp * S * 8;
  wp.bufs = buf_area + warp * S * RT * 1536;
  wp.tile_bytes = (size_t)nchunks * 1536;
  wp.tile_base = reinterpret_cast<const char*>(chunks) + (size_t)tile0 * wp.tile_bytes;
  if (lane == 0) {
    for (int s = 0; s < S; ++s) mbar_init(wp.bars + 8 * s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncwarp();
  for (int i = 0; i < S && i < wp.n; ++i) wp.issue(i);

  const bf16_t* xrow[NT];
  bool live[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int tok = nt * 8 + g;
    live[nt] = tok < M;
    xrow[nt] = x + (size_t)(live[nt] ? tok : 0) * ldx + 16 * t;
  }
  float acc[RT][NT][4];
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[r][nt][q] = 0.0f;

  if (XPF) {
    u32 xa[NT][8], xb[NT][8];
    if (wp.n > 0) load_x<NT>(xa, xrow, live, wp.c_begin);
    for (int i = 0; i < wp.n; i += 2) {
      if (i + 1 < wp.n) load_x<NT>(xb, xrow, live, wp.c_begin + i + 1);
      wp.consume(i, xa, acc);
      if (i + 1 < wp.n) {
        if (i + 2 < wp.n) load_x<NT>(xa, xrow, live, wp.c_begin + i + 2);
        wp.consume(i + 1, xb, acc);
      }
    }
  } else {
    for (int i = 0; i < wp.n; ++i) {
      u32 xv[NT][8];
      load_x<NT>(xv, xrow, live, wp.c_begin + i);
      wp.consume(i, xv, acc);
    }
  }

  __syncthreads();  // every warp is done with its buffers: reuse them for the partial tiles
  float* partial = reinterpret_cast<float*>(smem + (buf_area - bar_area));
  float* mine = partial + (size_t)warp * RT * NT * 4 * 32;
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int q = 0; q < 4; ++q) mine[((r * NT + nt) * 4 + q) * 32 + lane] = acc[r][nt][q];
  __syncthreads();

  for (int idx = threadIdx.x; idx < RT * NT * 4 * 32; idx += blockDim.x) {
    const int ln = idx & 31;
    const int item = idx >> 5;  // (r * NT + nt) * 4 + q
    const int q = item & 3;
    const int nt = (item >> 2) % NT;
    const int r = (item >> 2) / NT;
    const int row = (tile0 + r) * 16 + (ln >> 2) + 8 * (q >> 1);
    const int tok = nt * 8 + 2 * (ln & 3) + (q & 1);
    if (tile0 + r >= ntiles || row >= N || tok >= M) continue;
    float v = partial[item * 32 + ln];
    for (int w = 1; w < kw; ++w) v += partial[(w * RT * NT * 4 + item) * 32 + ln];
    float out = v * scale[row];
    const bf16_t* xt = x + (size_t)tok * ldx;
    for (int e = rowptr[row]; e < rowptr[row + 1]; ++e)
      out += bf16_to_float(xt[esc_col[e]]) * esc_delta[e];
    if (bias != nullptr) out += bf16_to_float(bias[row]);
    y[(size_t)tok * N + row] = float_to_bf16(out);
  }
}

// ---------------------------------------------------------------------------------------
// w12_gemm_cluster<NT, KW, P>: the register-ring main loop with the K split moved across the
// blocks of a thread-block cluster. A block's W warps take W consecutive row tiles over the
// same chunk range (split = the block's rank in its cluster of KW), so they read the same
// activation words at about the same time and L1 serves all but the first: activation traffic
// to L2 drops about W-fold, which is what limits the other kernels from M = 16 on. The KW
// partial tiles are summed over distributed shared memory in rank order 0..KW-1 (the same
// ranges and order as the kernels above, so the same bits), each rank finishing 1/KW of the
// outputs; a second cluster barrier keeps every block's shared memory alive until all reads
// are done.

__device__ __forceinline__ u32 cluster_rank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ float load_remote(const float* local, u32 rank) {
  u32 remote;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(local)),
               "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
}

template <int NT, int KW, int P>
__global__ void __cluster_dims__(KW, 1, 1) __launch_bounds__(256) w12_gemm_cluster(
    const Words4* __restrict__ chunks, const bf16_t* __restrict__ x, bf16_t* __restrict__ y,
    const float* __restrict__ scale, const int* __restrict__ rowptr,
    const int* __restrict__ esc_col, const float* __restrict__ esc_delta,
    const bf16_t* __restrict__ bias, int M, int N, int ntiles, int nchunks, int ldx) {
  extern __shared__ float partial[];  // [W][NT * 4][32]
  const int nwarps = blockDim.x >> 5;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int split = (int)cluster_rank();
  const int tile0 = (blockIdx.x / KW) * nwarps;
  const int tile = tile0 + warp;
  const int c_begin = (int)((long long)nchunks * split / KW);
  const int c_end = tile < ntiles ? (int)((long long)nchunks * (split + 1) / KW) : c_begin;
  const Words4* wp = chunks + (size_t)min(tile, ntiles - 1) * nchunks * 96 + lane;

  const bf16_t* xrow[NT];
  bool live[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int tok = nt * 8 + g;
    live[nt] = tok < M;
    xrow[nt] = x + (size_t)(live[nt] ? tok : 0) * ldx + 16 * t;
  }
  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[nt][r] = 0.0f;

  Words4 ring[P][3];
#pragma unroll
  for (int s = 0; s < P; ++s) {
    if (c_begin + s < c_end) {
      const Words4* p = wp + (size_t)(c_begin + s) * 96;
      ring[s][0] = load_stream(p);
      ring[s][1] = load_stream(p + 32);
      ring[s][2] = load_stream(p + 64);
    }
  }
  for (int c = c_begin; c < c_end; c += P) {
#pragma unroll
    for (int s = 0; s < P; ++s) {
      const int cc = c + s;
      if (cc < c_end) {
        const Words4 w0 = ring[s][0], w1 = ring[s][1], w2 = ring[s][2];
        if (cc + P < c_end) {
          const Words4* p = wp + (size_t)(cc + P) * 96;
          ring[s][0] = load_stream(p);
          ring[s][1] = load_stream(p + 32);
          ring[s][2] = load_stream(p + 64);
        }
        u32 xv[NT][8];
        load_x<NT>(xv, xrow, live, cc);
        chunk_mma<NT>(w0, w1, w2, xv, acc);
      }
    }
  }

  float* mine = partial + (size_t)warp * NT * 4 * 32;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int r = 0; r < 4; ++r) mine[(nt * 4 + r) * 32 + lane] = acc[nt][r];
  cluster_sync();

  const int per_warp = NT * 4 * 32;
  for (int idx = split * blockDim.x + threadIdx.x; idx < nwarps * per_warp;
       idx += KW * blockDim.x) {
    const int w = idx / per_warp;
    const int ln = idx & 31;
    const int item = (idx % per_warp) >> 5;  // nt * 4 + r
    const int r = item & 3;
    const int row = (tile0 + w) * 16 + (ln >> 2) + 8 * (r >> 1);
    const int tok = (item >> 2) * 8 + 2 * (ln & 3) + (r & 1);
    if (tile0 + w >= ntiles || row >= N || tok >= M) continue;
    float v = load_remote(partial + idx, 0);
#pragma unroll
    for (int q = 1; q < KW; ++q) v += load_remote(partial + idx, q);  // fixed order
    float out = v * scale[row];
    const bf16_t* xt = x + (size_t)tok * ldx;
    for (int e = rowptr[row]; e < rowptr[row + 1]; ++e)
      out += bf16_to_float(xt[esc_col[e]]) * esc_delta[e];
    if (bias != nullptr) out += bf16_to_float(bias[row]);
    y[(size_t)tok * N + row] = float_to_bf16(out);
  }
  cluster_sync();
}

__device__ __forceinline__ u32 scale_pair(u32 pair, float s) {
  const float lo = __uint_as_float(pair << 16) * s;
  const float hi = __uint_as_float(pair & 0xFFFF0000u) * s;
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// One warp per chunk (grid-stride). Lane (g, t) holds columns 16t..16t+15 of rows g and g+8.
__global__ void __launch_bounds__(256) w12_decode(const Words4* __restrict__ chunks,
                                                  const float* __restrict__ scale,
                                                  bf16_t* __restrict__ out, int N, int K,
                                                  int nchunks, long long total_chunks) {
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
  for (long long id = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
       id < total_chunks; id += warps) {
    const Words4* p = chunks + id * 96 + lane;
    const Words4 w0 = load_stream(p), w1 = load_stream(p + 32), w2 = load_stream(p + 64);
    const u32 lo_a[4] = {w0.x, w0.y, w0.z, w0.w};
    const u32 lo_b[4] = {w1.x, w1.y, w1.z, w1.w};
    const u32 top[4] = {w2.x, w2.y, w2.z, w2.w};
    const long long tile = id / nchunks;
    const int c = (int)(id - tile * nchunks);
    const int col = c * 64 + 16 * t;
    u32 a[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) decode8(lo_a[j], lo_b[j], top[j], a[j]);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const long long row = tile * 16 + g + 8 * half;
      if (row >= N || col >= K) continue;
      const float s = scale[row];
      u32 v[8];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[2 * j] = scale_pair(a[j][half], s);
        v[2 * j + 1] = scale_pair(a[j][2 + half], s);
      }
      bf16_t* dst = out + row * K + col;
      if (col + 16 <= K && (K & 7) == 0) {
        Words4* d = reinterpret_cast<Words4*>(dst);
        d[0] = Words4{v[0], v[1], v[2], v[3]};
        d[1] = Words4{v[4], v[5], v[6], v[7]};
      } else {
        for (int i = 0; i < 16 && col + i < K; ++i)
          dst[i] = (bf16_t)((v[i >> 1] >> (16 * (i & 1))) & 0xFFFFu);
      }
    }
  }
}
