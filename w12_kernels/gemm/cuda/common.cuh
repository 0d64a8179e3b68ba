// What the W12 GEMM kernels share: the types, the loads, the decode of a chunk's words into
// MMA fragments, the BF16 conversions, the cluster helpers and the epilogue's arithmetic.
// Included by every kernel source (NVRTC finds it through the include path the launchers pass).
//
// The chunk layout is that of layout.py: a chunk is 16 weight rows x 64 columns, 1536 bytes,
// three 16-byte words per lane of a warp, and holds the A operands of four mma.m16n8k16.

#pragma once

typedef unsigned short bf16_t;
typedef unsigned int u32;

struct alignas(16) Words4 {
  u32 x, y, z, w;
};

// Four 32-bit words in one 16-byte load of read-only data: past L1 (load_stream, for the
// weights, read once) or through it (load_cached, for the activations, which other warps read
// again).
#define W12_LOAD4(NAME, CACHE, PTR)                                                       \
  __device__ __forceinline__ Words4 NAME(PTR p) {                                         \
    Words4 v;                                                                             \
    asm volatile("ld.global.nc" CACHE ".v4.u32 {%0, %1, %2, %3}, [%4];"                   \
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)                             \
                 : "l"(p));                                                               \
    return v;                                                                             \
  }
W12_LOAD4(load_stream, ".L1::no_allocate", const Words4*)
W12_LOAD4(load_cached, "", const void*)

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

__device__ __forceinline__ float bf16_to_float(bf16_t v) {
  return __uint_as_float(((u32)v) << 16);
}

__device__ __forceinline__ bf16_t float_to_bf16(float v) {
  bf16_t r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(v));
  return r;
}

// Thread-block clusters: every thread of every block of the cluster meets here; memory
// written before is visible to the cluster after.
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ u32 smem_addr(const void* p) {
  return (u32)__cvta_generic_to_shared(p);
}

// the float at shared-memory address p of block ``rank`` of the cluster
__device__ __forceinline__ float load_cluster(const float* p, int rank) {
  u32 remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(p)),
               "r"(rank));
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
}

// The epilogue's data of one output row: its scale 2^(e0 - 112), its escape range e0..e1 of
// the lists with the first escape's column and delta (col0 < 0: none), and its bias.
struct EpiRow {
  float scale, delta0, bias;
  int e0, e1, col0;
};

__device__ __forceinline__ void epi_rows(EpiRow& e, int row, int n_rows, const float* scale,
                                         const int* rowptr, const bf16_t* bias) {
  const bool live = row < n_rows;
  e.scale = live ? scale[row] : 0.0f;
  e.e0 = live ? rowptr[row] : 0;
  e.e1 = live ? rowptr[row + 1] : 0;
  e.bias = live && bias != nullptr ? bf16_to_float(bias[row]) : 0.0f;
  e.col0 = -1;
  e.delta0 = 0.0f;
}

__device__ __forceinline__ void epi_first_escape(EpiRow& e, const int* esc_col,
                                                 const float* esc_delta) {
  if (e.e0 < e.e1) {
    e.col0 = esc_col[e.e0];
    e.delta0 = esc_delta[e.e0];
  }
}

// One output: the row's sum ``v`` times its scale, plus its escape corrections in list order
// and its bias, rounded to BF16 and stored at y[tok, row].
__device__ __forceinline__ void store_output(float v, const EpiRow& e, int row, int tok,
                                             const bf16_t* x, bf16_t* y, const int* esc_col,
                                             const float* esc_delta, const bf16_t* bias,
                                             int n_rows, int ldx) {
  float out = v * e.scale;
  if (e.col0 >= 0) {
    const bf16_t* xt = x + (size_t)tok * ldx;
    out += bf16_to_float(xt[e.col0]) * e.delta0;
    for (int q = e.e0 + 1; q < e.e1; ++q) out += bf16_to_float(xt[esc_col[q]]) * esc_delta[q];
  }
  if (bias != nullptr) out += e.bias;
  y[(size_t)tok * n_rows + row] = float_to_bf16(out);
}

// The same for a caller without preloaded rows: the row's data loaded here.
__device__ __forceinline__ void store_output(float v, int row, int tok, const bf16_t* x,
                                             bf16_t* y, const float* scale, const int* rowptr,
                                             const int* esc_col, const float* esc_delta,
                                             const bf16_t* bias, int n_rows, int ldx) {
  EpiRow e;
  epi_rows(e, row, n_rows, scale, rowptr, bias);
  epi_first_escape(e, esc_col, esc_delta);
  store_output(v, e, row, tok, x, y, esc_col, esc_delta, bias, n_rows, ldx);
}

// Keeps registers alive (for the compiler) up to this point: the A fragments of a wgmma that
// may still be reading them must not be given to other values before its wait_group.
__device__ __forceinline__ void keep_regs(u32 (&a)[4][4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) asm volatile("" : "+r"(a[j][r])::"memory");
}
