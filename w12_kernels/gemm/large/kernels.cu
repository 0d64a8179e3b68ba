// The large-M W12 GEMM on Hopper's warpgroup MMA (launcher.py), for the rows beyond the
// small-M path.
//
// Shared-memory operands are K-major with the 128-byte swizzle: row r (a token) holds the 64 K
// values of one chunk column in 128 bytes at r * 128, its 16-byte unit u (K values 8 u .. 8 u +
// 7 of the MMA order) stored at unit u ^ (r % 8), so that the tensor cores read 8 rows of one
// unit from 8 different bank groups. The K order is that of the weight fragments (layout.py):
// K index kk of MMA step j is column 16 ((kk % 8) / 2) + 4 j + 2 (kk / 8) + kk % 2 of the
// chunk, so unit u = 2 j + h holds the chunk's 32-bit words 8 t + u, t = 0..3.
//
// w12_permute_x: the activations as the images of the stages the GEMM copies in whole: for
// every block of BN tokens and every 64-column chunk, BN * 128 contiguous bytes in that
// layout. Tokens past M and columns past K come out as zeros. (Not with XORDER: the GEMM then
// copies its stages straight from x, in x's own K order; see XORDER below.)
//
// wgl_body<BN, WGS, SX, SW, SPLIT, AREG, PERS, XORDER, WREUSE, L2HINT>: y[M, N] = x[M, K] @ W^T.
// A block holds WGS consumer warpgroups, each with 64 weight rows, BN activation rows shared
// by all of them, and a producer warp (AREG 1) or warpgroup (AREG 2, 3). The producer starts
// copies (completing on "full" mbarriers) of each chunk column's activation image into one of
// SX stages and of its chunk words (4 WGS tiles, one tensor copy) into one of SW stages, as far
// ahead as the stages allow: a weight stage is refilled once every consumer warp has read it,
// an activation stage once every warpgroup's MMAs of it are done ("empty" mbarriers). Each
// warpgroup goes on its own: its warps decode their tiles' words straight into the A fragment
// registers of wgmma m64nBNk16 (the register operand; B, the activations, from shared
// memory), two columns of MMAs left in flight. AREG 2 makes the producer a warpgroup that
// hands its registers to the MMA warpgroups through setmaxnreg, so that 256 activation rows
// fit; AREG 3 is that with WGS 1: both MMA warpgroups on the block's 64 weight rows, each
// taking every other chunk column, their sums added in the epilogue, so that a block of half
// the rows keeps two warpgroups' MMAs in flight. With SPLIT > 1 the chunk columns are cut
// into SPLIT contiguous ranges, one per block of a thread-block cluster (1, 1, SPLIT), and the
// partial tiles are added in rank order 0, 1, ... through distributed shared memory
// (deterministic, no atomics, no workspace). PERS 1 is stream-K (see below).
//
// Escapes: every escape whose exact value v, divided by its row's scale 2^(e0 - 112), is a
// BF16 zero or normal number a (patch_value) is written as a into the decoded fragments, over
// the record-0 value there, by the warp that decodes the tile (each warp walks its tile's
// escapes in chunk order, 32 at a time, one per lane, each an entry computed at load time:
// esc_entry, layout.py); the tensor cores then multiply the exact weight (a times the power
// of two the epilogue applies). The epilogue is store_output's arithmetic (scale, escape
// corrections in list order, bias, BF16), with the corrections of the patched escapes left
// out: only escapes that cannot be patched (inf, NaN, values whose scaled form would be
// subnormal or out of range) still cost activation loads there, from each row's first such
// escape on (esc_fix, also computed at load time).
//
// What shaped it: with the A operand in registers, ptxas reuses the fragment registers of the
// MMAs still in flight for the next column's decode unless they are kept alive (keep_regs); a
// branch on the thread index around the MMAs, or a spin loop inside one, makes ptxas
// serialize them (ptxas C7518; the roles are warp-uniform, the arrivals predicated). The
// copies are started by a warp that never runs a proxy fence, so that no fence waits on them.
// An unrolled epilogue loop several times the size of the main loop runs several times slower
// than a short one.

#include "common.cuh"
#include "wgmma.cuh"

extern "C" __global__ void __launch_bounds__(256)
w12_permute_x(const bf16_t* __restrict__ x, u32* __restrict__ xp, int M, int K, int ldx,
              int nchunks, int bn, int pairs) {
  // block (c, tb, q): tokens tb * bn + 32 q .. + 31 of chunk c, one 16-byte unit a thread:
  // its four 32-bit words come from one 128-byte row segment of x, loaded together, and go out
  // in one store; `pairs`: x rows 4-byte aligned (the GEMM after it, launched with
  // programmatic dependent launch, may start now: it waits for this grid's writes before it
  // copies the images; a no-op without such a dependent)
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const int c = blockIdx.x;
  uint4* image = reinterpret_cast<uint4*>(xp + ((size_t)blockIdx.y * nchunks + c) * bn * 32);
  const int s = blockIdx.z * 256 + threadIdx.x;  // the unit's place in the image
  const int n = s >> 3;                          // token within the block
  const int unit = (s & 7) ^ (n & 7);            // 16-byte unit 2 j + h, swizzled
  const int tok = blockIdx.y * bn + n;
  u32 v[4] = {0u, 0u, 0u, 0u};
  if (tok < M) {
    const bf16_t* row = x + (size_t)tok * ldx + c * 64 + 2 * unit;  // word 8 t + unit: + 16 t
    if (pairs && c * 64 + 64 <= K) {
#pragma unroll
      for (int t = 0; t < 4; ++t) v[t] = *reinterpret_cast<const u32*>(row + 16 * t);
    } else {
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const int col = c * 64 + 2 * unit + 16 * t;
        v[t] = (col < K ? (u32)row[16 * t] : 0u) |
               ((col + 1 < K ? (u32)row[16 * t + 1] : 0u) << 16);
      }
    }
  }
  image[s] = make_uint4(v[0], v[1], v[2], v[3]);
}

// Narrow partial sums: what one block hands another (a stream-K piece, a two-range block's
// push of the other share) goes as the top 24 bits of each float32 (sign, exponent and 15 of
// the 23 mantissa bits: truncated, a relative error below 2^-15, against the 2^-9 of the BF16
// output), four floats in three words: 25% fewer bytes on the slowest step of the epilogue.
// (the packing in one volatile asm, so that the compiler cannot move it above the MMAs' wait:
// reading the accumulators there made ptxas serialize the main loop's MMAs, C7514)
__device__ __forceinline__ uint3 pack24(float a, float b, float c, float d) {
  uint3 w;
  asm volatile("{\n.reg .b32 ua, ub, uc, ud;\n"
               "mov.b32 ua, %3;\nmov.b32 ub, %4;\nmov.b32 uc, %5;\nmov.b32 ud, %6;\n"
               "shr.b32 ua, ua, 8;\nshr.b32 ub, ub, 8;\nshr.b32 uc, uc, 8;\nshr.b32 ud, ud, 8;\n"
               "shl.b32 %0, ub, 24;\nor.b32 %0, %0, ua;\n"
               "shr.b32 %1, ub, 8;\nshl.b32 ub, uc, 16;\nor.b32 %1, %1, ub;\n"
               "shr.b32 %2, uc, 16;\nshl.b32 ud, ud, 8;\nor.b32 %2, %2, ud;\n}"
               : "=r"(w.x), "=r"(w.y), "=r"(w.z) : "f"(a), "f"(b), "f"(c), "f"(d));
  return w;
}
__device__ __forceinline__ float cut24(float a) {  // (a float through pack24 and unpack24)
  return __uint_as_float(__float_as_uint(a) & 0xFFFFFF00u);
}
__device__ __forceinline__ float4 unpack24(uint3 w) {
  return make_float4(__uint_as_float(w.x << 8),
                     __uint_as_float(((w.x >> 24) << 8) | (w.y << 16)),
                     __uint_as_float(((w.y >> 16) << 8) | (w.z << 24)),
                     __uint_as_float(w.z & 0xFFFFFF00u));
}
// sixteen floats (f[o .. o + 15], o a constant after unrolling) as three 16-byte words, and
// back. (The array by reference, indexed: a pointer into it cost the main loop 10
// instructions.)
template <int NF>
__device__ __forceinline__ void pack24x16(const float (&f)[NF], int o, uint4* p, int stride) {
  const uint3 a = pack24(f[o], f[o + 1], f[o + 2], f[o + 3]);
  const uint3 b = pack24(f[o + 4], f[o + 5], f[o + 6], f[o + 7]);
  const uint3 c = pack24(f[o + 8], f[o + 9], f[o + 10], f[o + 11]);
  const uint3 d = pack24(f[o + 12], f[o + 13], f[o + 14], f[o + 15]);
  p[0] = make_uint4(a.x, a.y, a.z, b.x);
  p[stride] = make_uint4(b.y, b.z, c.x, c.y);
  p[2 * stride] = make_uint4(c.z, d.x, d.y, d.z);
}
__device__ __forceinline__ void unpack24x16(uint4 p0, uint4 p1, uint4 p2, float4 (&v)[4]) {
  v[0] = unpack24(make_uint3(p0.x, p0.y, p0.z));
  v[1] = unpack24(make_uint3(p0.w, p1.x, p1.y));
  v[2] = unpack24(make_uint3(p1.z, p1.w, p2.x));
  v[3] = unpack24(make_uint3(p2.y, p2.z, p2.w));
}
// sixteen such floats (three 16-byte words ``stride`` words apart) added to f[o .. o + 15]
template <int NF>
__device__ __forceinline__ void add24x16(float (&f)[NF], int o, const uint4* p, int stride) {
  float4 v[4];
  unpack24x16(p[0], p[stride], p[2 * stride], v);
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    f[o + 4 * h] += v[h].x;
    f[o + 4 * h + 1] += v[h].y;
    f[o + 4 * h + 2] += v[h].z;
    f[o + 4 * h + 3] += v[h].w;
  }
}

// XORDER (a table entry's choice): the activations straight from x, no image pass. The MMA
// then sums each chunk column in x's own K order (K index kk of MMA step j is column 16 j + kk),
// so a lane's A fragment of step j comes from chunk lane 4 g + j of its tile (layout.py): words
// t >> 1 and 2 + (t >> 1) of plane t & 1 (the low bytes) and of plane 2 (the top bits). The
// activations come by one tensor copy a stage from x (128-byte swizzle: the layout the image
// had), and the chunk words by a tensor copy with the 128-byte swizzle too, so that those
// gathers meet at most two lanes' words per bank.

// WREUSE (a table entry's choice): the token blocks of one tile block together. Where M takes
// several token blocks, each of them reads the tile block's chunk columns, so that a layer's
// weights are read once a token block. Launched in the grid's order (x fastest), block (x, y)
// is tile block x, token block y, so the token blocks of one tile block start a whole grid
// row apart: once the weights outgrow the L2, each token block reads them from memory again.
// With WREUSE the host launches the grid with x and y swapped (x the token block, y the tile
// block), so that those blocks run at once, on the same columns at about the same pace; and
// stream-K's unit u is tile block u % (the launch's tile blocks), token block u / (them), so
// that with the steps cut in about equal shares, block b and block b + gridDim.x / (token
// blocks) work on the same tile block's same columns at about the same time.

// L2HINT (a table entry's choice): L2 eviction hints on the copies, the activations' stages
// (image or x) copied with an evict_last policy, the chunk words with
// evict_first. Each activation stage is read by every tile block of its token block, at times
// spread over the whole call where the blocks' shares start at different columns (stream-K),
// while the weights stream past once or twice; without the hints weight lines evict activation
// lines that are read again, and those then come from memory. The same bits either way.

// The next escape column kept per warp: a column's escape check is a vote over the warp's
// batch (is any lane's escape in this column?), then a shuffle of lane 31's column (is the
// batch used up?), ~12 instructions and two cross-lane round trips, although nearly every
// column has no escape. So a warp keeps the smallest column of its batch's escapes past the
// column last checked (enext, the same in every lane: a warp-wide min, __reduce_min_sync,
// after each check that ran) and runs that check only at a column >= enext: one compare and a
// branch elsewhere. The batches are in chunk order, so no later batch holds a column below it.

// The L2 policies of L2HINT's copies: keep (the activations) or evict first (the weights).
__device__ __forceinline__ unsigned long long l2_keep() {
  unsigned long long p;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
  return p;
}
__device__ __forceinline__ unsigned long long l2_stream() {
  unsigned long long p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}

// Matrix descriptor of a K-major operand with the 128-byte swizzle: 8-row groups 1024 bytes
// apart; `p` is the 1024-byte aligned buffer plus 32 bytes per K step.
__device__ __forceinline__ unsigned long long sw128_desc(const void* p) {
  const u32 addr = (u32)__cvta_generic_to_shared(p);
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) |
         ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
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

// The copies of the stages, with an L2 policy where the function template's L2HINT asks for
// one: OP the instruction, SRC its source operands, BAR and POL the operand numbers of the
// barrier and the policy, POLICY the policy (evaluated only where it is used), then the
// source's operands (from %1 on). The destination is %0.
#define W12_COPY(OP, SRC, BAR, POL, POLICY, ...)                                           \
  if constexpr (L2HINT) {                                                                 \
    asm volatile(OP ".L2::cache_hint [%0], " SRC ", [" BAR "], " POL ";"                  \
                 :: "r"(smem_addr(dst)), __VA_ARGS__, "r"(smem_addr(bar)), "l"(POLICY)    \
                 : "memory");                                                             \
  } else {                                                                                \
    asm volatile(OP " [%0], " SRC ", [" BAR "];"                                          \
                 :: "r"(smem_addr(dst)), __VA_ARGS__, "r"(smem_addr(bar)) : "memory");    \
  }

template <bool L2HINT>
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, u32 bytes,
                                          unsigned long long* bar) {
  W12_COPY("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes", "[%1], %2",
           "%3", "%4", l2_keep(), "l"(src), "r"(bytes))
}

// A CUtensorMap, passed by value as a __grid_constant__ kernel parameter.
struct alignas(64) TensorMap {
  unsigned long long word[16];
};

// Stream-K's schedule (PERS), passed by value as a __grid_constant__ kernel parameter: block b
// takes steps q[b] .. q[b + 1] - 1 (stream_k.py, stream_k_cuts; at most 256 blocks).
struct StreamKCuts {
  int q[257];
};

// The chunk words of `tiles` consecutive 16-row tiles (the box of `map`, the generic address
// of a __grid_constant__ TensorMap) from tile `tile` on, chunk column `col`, into dst as
// [tiles][1536 bytes], by one tensor copy (launcher.py, ``_weight_map``: the chunks as a 3-D
// tensor of 8-byte words, 192 a chunk x columns x tiles). Tiles past the last come in as
// zeros (and count as bytes all the same).
template <bool L2HINT>
__device__ __forceinline__ void tile_copy(void* dst, const void* map, int col, int tile,
                                          unsigned long long* bar) {
  W12_COPY("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes",
           "[%1, {%2, %3, %4}]", "%5", "%6", l2_stream(), "l"(map), "r"(0), "r"(col),
           "r"(tile))
}

// (XORDER) Rows tok .. tok + BN - 1, columns col .. col + 63 of x (the box of `map`: x as a
// 2-D tensor of 2-byte elements, 128-byte swizzle, launcher.py ``_x_map``) into dst: row r at
// r * 128, its 16-byte unit u at u ^ (r % 8); rows past M and columns past K come in as zeros.
template <bool L2HINT>
__device__ __forceinline__ void x_copy(void* dst, const void* map, int col, int tok,
                                       unsigned long long* bar) {
  W12_COPY("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes",
           "[%1, {%2, %3}]", "%4", "%5", l2_keep(), "l"(map), "r"(col), "r"(tok))
}

// (XORDER) tile_copy with the 128-byte swizzle (launcher.py, ``_weight_map``'s swizzled
// form: 16 8-byte words x 12 rows a chunk x columns x tiles): the same bytes, 128-byte row q
// of the stage holding its 16-byte unit u at u ^ (q % 8).
template <bool L2HINT>
__device__ __forceinline__ void tile_copy_sw(void* dst, const void* map, int col, int tile,
                                             unsigned long long* bar) {
  W12_COPY("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes",
           "[%1, {%2, %3, %4, %5}]", "%6", "%7", l2_stream(), "l"(map), "r"(0), "r"(0),
           "r"(col), "r"(tile))
}

// (XORDER) The four BF16 pairs of an A fragment in x's K order: la, lb the low-byte words of
// steps t >> 1 and 2 + (t >> 1) of plane t & 1, ta, tb those steps' top-bit words; s1, s2 the
// rotations that bring this lane's pairs' top bits (pairs 2 (t & 1) and 2 (t & 1) + 1 of the
// word, B_POSITIONS) to bits 15, 10..8 of both halves (decode8's shifts, as rotations: the
// bits they differ in are masked off).
__device__ __forceinline__ void decode_x(u32 la, u32 lb, u32 ta, u32 tb, u32 s1, u32 s2,
                                         u32 (&r)[4]) {
  u32 p0, p1, p2, p3, a1, a2, b1, b2;
  asm("prmt.b32 %0, %1, 0x38383838, 0x4140;" : "=r"(p0) : "r"(la));
  asm("prmt.b32 %0, %1, 0x38383838, 0x4342;" : "=r"(p1) : "r"(la));
  asm("prmt.b32 %0, %1, 0x38383838, 0x4140;" : "=r"(p2) : "r"(lb));
  asm("prmt.b32 %0, %1, 0x38383838, 0x4342;" : "=r"(p3) : "r"(lb));
  asm("shf.l.wrap.b32 %0, %1, %1, %2;" : "=r"(a1) : "r"(ta), "r"(s1));
  asm("shf.l.wrap.b32 %0, %1, %1, %2;" : "=r"(a2) : "r"(ta), "r"(s2));
  asm("shf.l.wrap.b32 %0, %1, %1, %2;" : "=r"(b1) : "r"(tb), "r"(s1));
  asm("shf.l.wrap.b32 %0, %1, %1, %2;" : "=r"(b2) : "r"(tb), "r"(s2));
  asm("lop3.b32 %0, %1, 0x87008700, %2, 0xEA;" : "=r"(r[0]) : "r"(a1), "r"(p0));
  asm("lop3.b32 %0, %1, 0x87008700, %2, 0xEA;" : "=r"(r[1]) : "r"(a2), "r"(p1));
  asm("lop3.b32 %0, %1, 0x87008700, %2, 0xEA;" : "=r"(r[2]) : "r"(b1), "r"(p2));
  asm("lop3.b32 %0, %1, 0x87008700, %2, 0xEA;" : "=r"(r[3]) : "r"(b2), "r"(p3));
}

// (XORDER) An escape's register place (esc_entry's: lane << 8 | (4 j + r) << 1 | half, in the
// chunk order) moved to x's K order: the element of row g + 8 (r & 1), chunk column
// 16 t + 4 j + 2 (r >> 1) + half is, there, step t, k = 4 j + 2 (r >> 1) + half, so lane
// 4 g + (k & 7) / 2, register (r & 1) + 2 (k >> 3).
__device__ __forceinline__ int xorder_place(int pk) {
  const int l = pk >> 8, q = (pk >> 1) & 15, half = pk & 1;
  const int g = l >> 2, t = l & 3, j = q >> 2, r = q & 3;
  const int kk = 4 * j + 2 * (r >> 1) + half;
  return ((4 * g + ((kk & 7) >> 1)) << 8) | ((4 * t + (r & 1) + 2 * (kk >> 3)) << 1) | half;
}

// The escape value v as the decoded tile holds it (v / scale, scale = 2^(e0 - 112)), if that
// is a BF16 zero or normal number that gives v back exactly; false otherwise.
__device__ __forceinline__ bool patch_value(bf16_t v, float sc, bf16_t& a) {
  const float vf = bf16_to_float(v);
  a = float_to_bf16(vf * (1.0f / sc));
  const u32 mag = a & 0x7FFFu, expo = a & 0x7F80u;
  return (mag == 0u || (expo != 0u && expo != 0x7F80u)) && bf16_to_float(a) * sc == vf;
}

// The outputs of a thread's accumulators acc[0 .. 4 COLS) (register i: token 8 (i / 4) + 2 t +
// i % 2, row g + 8 ((i % 4) / 2) of its warp's 16 rows), each row's sum times its scale sc[h]
// plus its bias b[h] where there is one, rounded to BF16 and stored token-major into the
// staging tile at `tile` (token rows of STRIDE bytes: 16 bytes past the weight rows, so that
// neither stmatrix.trans nor the reads back collide on a bank); row0: the warp's first row in
// the tile.
template <int COLS, int STRIDE, int NF>
__device__ __forceinline__ void stage_tile(const float (&acc)[NF], const float (&sc)[2],
                                           const float (&b)[2], bool has_bias,
                                           unsigned char* tile, int row0, int lane) {
#pragma unroll
  for (int c = 0; c < COLS; c += 2) {
    u32 w[4];
#pragma unroll
    for (int mm = 0; mm < 4; ++mm) {
      const int i = 4 * (c + (mm >> 1)) + 2 * (mm & 1);
      float o0 = acc[i] * sc[mm & 1], o1 = acc[i + 1] * sc[mm & 1];
      if (has_bias) {
        o0 += b[mm & 1];
        o1 += b[mm & 1];
      }
      w[mm] = (u32)float_to_bf16(o0) | ((u32)float_to_bf16(o1) << 16);
    }
    const int q = lane >> 3;
    const u32 addr = smem_addr(tile + (8 * (c + (q >> 1)) + (lane & 7)) * STRIDE +
                               (row0 + 8 * (q & 1)) * 2);
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};"
                 :: "r"(addr), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]) : "memory");
  }
}

// The staging tile's first `ntok` token rows (R weight rows each) stored to y at token tok0,
// row row0, in 16-byte pieces (a warp's stores: whole 256-byte row segments); me: the thread
// among THREADS (a multiple of R / 8).
template <int R, int STRIDE, int THREADS>
__device__ __forceinline__ void store_staged(const unsigned char* tile, bf16_t* y, int n_rows,
                                             int tok0, int row0, int ntok, u32 me) {
  constexpr int CH = R / 8;  // 16-byte pieces of a token's row
  const int c8 = (int)me % CH;
  const bool live = row0 + 8 * c8 < n_rows;
  bf16_t* yo = y + (size_t)tok0 * n_rows + row0 + 8 * c8;
  const int hi = ntok * CH;
  for (int u = (int)me; u < hi; u += THREADS) {
    const int tk = u / CH;
    const uint4 v = *reinterpret_cast<const uint4*>(tile + tk * STRIDE + 16 * c8);
    if (live) *reinterpret_cast<uint4*>(yo + (size_t)tk * n_rows) = v;
  }
}

// Waits (the whole warp) until the 32-bit flag at p is set by another block (stream-K's
// pieces): lane 0 polls with relaxed loads, then one acquire fence orders the reads after it.
__device__ __forceinline__ void wait_flag(const unsigned* p) {
  u32 v = 0u;
  do {
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    v = __shfl_sync(0xffffffffu, v, 0);
  } while (v == 0u);
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
}

template <int BN, int WGS, int SX, int SW, int SPLIT, int AREG, int PERS, bool XORDER,
          bool WREUSE, bool L2HINT>
__device__ __forceinline__ void wgl_body(
    const Words4* __restrict__ chunks, const bf16_t* __restrict__ xp,
    const bf16_t* __restrict__ x, int ldx, bf16_t* __restrict__ y,
    const float* __restrict__ scale, const int* __restrict__ rowptr,
    const int* __restrict__ esc_col, const bf16_t* __restrict__ esc_val,
    const float* __restrict__ esc_delta, const uint2* __restrict__ esc_entry,
    const int* __restrict__ esc_fix, const bf16_t* __restrict__ bias, int M, int n_rows,
    int ntiles, int nchunks, float* __restrict__ work, unsigned* __restrict__ flags,
    const void* __restrict__ wmap, int tile_base, const int* __restrict__ cuts,
    const void* __restrict__ xmap) {
  static_assert(BN % 64 == 0 && BN <= 256, "BN: 64, 128, 192 or 256 activation rows");
  static_assert(AREG >= 1 && AREG <= 3, "AREG: the A operand in registers, 1, 2 or 3");
  static_assert(SX >= 3 && SW >= 2 && SPLIT >= 1 && SPLIT <= 4, "config");
  static_assert(PERS == 0 || (AREG == 2 && SPLIT == 1), "stream-K: producer warpgroup, one range");
  static_assert(AREG != 3 || WGS == 1, "interleaved columns: one group of 64 weight rows");
  constexpr bool CL = SPLIT > 1;  // a cluster
  // AREG 3: two MMA warpgroups on the block's one group of 64 weight rows, warpgroup w taking
  // the block's columns w, w + 2, w + 4, ... (each stage read by one warpgroup), their sums
  // added in the epilogue (warpgroup 0's, then warpgroup 1's: a fixed order)
  constexpr bool KIL = AREG == 3;
  constexpr int MWG = KIL ? 2 : WGS;      // MMA warpgroups
  constexpr int D = KIL ? 2 : 1;          // columns from one of a warpgroup's to its next
  constexpr int THREADS = 128 * MWG;
  constexpr int XSTAGE = BN * 128;        // activation bytes per stage
  constexpr int WSTAGE = 4 * WGS * 1536;  // chunk bytes per stage
  constexpr int R = 64 * WGS;             // weight rows per block
  constexpr int PST = R + 4;              // floats per token row of the partial tile
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  unsigned char* wstages = smem + SX * XSTAGE;
  unsigned long long* xfull = reinterpret_cast<unsigned long long*>(wstages + SW * WSTAGE);
  unsigned long long* wfull = xfull + SX;
  unsigned long long* xempty = wfull + SW;  // arrived at by each warpgroup's MMAs being done
  unsigned long long* wempty = xempty + SX;  // arrived at by each consumer warp's loads
  // PERS: what a segment needs that its consumers would otherwise wait for, written by the
  // producer warpgroup's idle warps a segment ahead: each consumer
  // warp's first escape batch (escring: ecol, then eok << 31 | epos << 16 | eval; escwarp:
  // ebase, eend), needed at the segment's start, and the epilogue's row data (rowring: scale,
  // bias, first and end of the escapes to correct), needed at its end. One slot each, with a
  // full (96 producer threads arrive) and an empty (256 consumer threads) barrier.
  unsigned long long* rowfull = wempty + SW;
  unsigned long long* rowempty = rowfull + 1;
  unsigned long long* escfull = rowfull + 2;
  unsigned long long* escempty = rowfull + 3;
  float4* rowring = reinterpret_cast<float4*>(rowfull + 4);
  uint2* escring = reinterpret_cast<uint2*>(rowring + R);
  int2* escwarp = reinterpret_cast<int2*>(escring + 4 * WGS * 32);
  const int tid = threadIdx.x;
  const int wg = tid >> 7;
  const int wrow = KIL ? 0 : wg;  // the warpgroup's group of 64 weight rows
  const int warp = (tid >> 5) & 3;
  const int lane = tid & 31;
  // (the tile block - tile_base and the token block: WREUSE's launch has them as y and x)
  constexpr bool SWAP = WREUSE && PERS == 0;
  const unsigned bx = SWAP ? blockIdx.y : blockIdx.x, by = SWAP ? blockIdx.x : blockIdx.y;
  int tok0 = by * BN;
  const int rank = SPLIT > 1 ? (int)blockIdx.z : 0;  // cluster (1, 1, SPLIT): K range = z
  const int per = (nchunks + SPLIT - 1) / SPLIT;
  const int c0 = min(nchunks, rank * per);
  const int n = min(nchunks, c0 + per) - c0;
  // (the block's tile block: tile_base + blockIdx.x, so that one launch may take the tile
  // blocks from tile_base on, launcher.gemm_wgl's ``tail``; with PERS the units are those
  // of the tile blocks from tile_base on)
  const int tblock = (int)bx + tile_base;
  int tile0 = tblock * 4 * WGS;
  const bf16_t* ximg = xp + (size_t)by * nchunks * (XSTAGE / 2);

  // PERS (stream-K): the block takes steps q0 .. q1 - 1 of all units' chunk columns (unit u =
  // tile block tile_base + u / tblocks, token block u % tblocks, or as WREUSE says; step q =
  // column q % nchunks of unit q / nchunks), q0 = cuts[blockIdx.x] and q1 = cuts[blockIdx.x + 1]
  // (the host's schedule, stream_k.stream_k_cuts: increasing, cuts[0] = 0, cuts[gridDim.x] =
  // all the units' steps, at least one step a block), in segments of one unit each: unit u0 + s
  // for segment s, its columns clo .. chi - 1, stage counter column + qoff (counted from the
  // block's first step). A segment from column 0 stores the outputs of its unit, after adding
  // (in block order) the partial sums that the blocks after it left in `work` for that unit's
  // later columns; a segment starting later (only ever a block's first) is such a piece: it
  // leaves its sums in work[block] and sets flags[block].
  // Owners wait only for pieces, which wait for nothing, and every block is resident (one a
  // multiprocessor, gridDim.x at most the multiprocessors), so no block waits forever.
  int u0 = 0, nseg = 1, clo = 0, chi = nchunks, qoff = 0;
  const int tblocks = (M + BN - 1) / BN;
  // (q0 and q1 read from the parameter where needed: that they come from a parameter moves
  // the main loop's stage counting to the uniform datapath)
  auto cut = [&](int j) { return PERS != 0 ? cuts[blockIdx.x + j] : 0; };
  if constexpr (PERS != 0) {
    u0 = cut(0) / nchunks;
    nseg = (cut(1) - 1) / nchunks - u0 + 1;
  }
  // (a unit's place: u / ublocks and u % ublocks, the tile block and the token block or, with
  // WREUSE, the other way round, ublocks then the launch's tile blocks)
  const int ublocks = WREUSE ? (ntiles + 4 * WGS - 1) / (4 * WGS) - tile_base : tblocks;
  auto set_segment = [&](int sg) {
    const int u = u0 + sg;
    clo = sg == 0 ? cut(0) - u * nchunks : 0;
    chi = sg == nseg - 1 ? cut(1) - u * nchunks : nchunks;
    qoff = u * nchunks - cut(0);
    const int uq = u / ublocks, ur = u - uq * ublocks;
    const int ut = WREUSE ? ur : uq, ub = WREUSE ? uq : ur;
    tile0 = (tile_base + ut) * 4 * WGS;
    tok0 = ub * BN;
    ximg = xp + (size_t)ub * nchunks * (XSTAGE / 2);
  };
  if constexpr (PERS != 0) set_segment(0);

  // (the producer) start the copies of column col: its activation image into stage col % SX,
  // its chunk words into weight stage col % SW
  // (st: the stage, col % SX and col % SW without PERS)
  auto issue_x = [&](int st, int col) {
    unsigned long long* bar = xfull + st;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(smem_addr(bar)), "r"(XSTAGE) : "memory");
    if constexpr (XORDER) {
      x_copy<L2HINT>(smem + st * XSTAGE, xmap, (c0 + col) * 64, tok0, bar);
      return;
    }
    bulk_copy<L2HINT>(smem + st * XSTAGE, ximg + (size_t)(c0 + col) * (XSTAGE / 2), XSTAGE,
                      bar);
  };
  auto issue_w = [&](int st, int col) {
    unsigned long long* bar = wfull + st;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(smem_addr(bar)), "r"(WSTAGE) : "memory");
    if constexpr (XORDER) {  // (the map's swizzled form)
      tile_copy_sw<L2HINT>(wstages + st * WSTAGE, wmap, c0 + col, tile0, bar);
      return;
    }
    tile_copy<L2HINT>(wstages + st * WSTAGE, wmap, c0 + col, tile0, bar);  // the block's tiles
  };
  // an arrival on `bar` by the threads where `on` holds, predicated rather than branched
  // around (a thread-dependent branch near the MMAs makes ptxas serialize them)
  auto arrive_if = [&](bool on, unsigned long long* bar) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.u32 p, %1, 0;\n"
                 "@p mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n}"
                 :: "r"(smem_addr(bar)), "r"((u32)on) : "memory");
  };
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < SX + SW; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_addr(xfull + s)));
#pragma unroll
    for (int s = 0; s < SX; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
                   :: "r"(smem_addr(xempty + s)), "r"(WGS));
#pragma unroll
    for (int s = 0; s < SW; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
                   :: "r"(smem_addr(wempty + s)), "r"(4 * WGS));
    if constexpr (PERS != 0) {
#pragma unroll
      for (int s = 0; s < 4; s += 2) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 96;" :: "r"(smem_addr(rowfull + s)));
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
                     :: "r"(smem_addr(rowempty + s)), "r"(THREADS));
      }
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
  // What the epilogue needs of its row (thread (group, r) finishes row r, see the end), read
  // now so that the loads are long done by then: its scale, its bias and where its escapes
  // that the tiles cannot hold start (epatch: none when the row has none of those).
  constexpr int GROUPS = THREADS / R;  // the consumer threads only
  const int r_out = tid % R, group = tid / R;
  const int row_out = tblock * R + r_out;
  const bool out_live = !PERS && group < GROUPS && row_out < n_rows;
  float out_sc = 0.0f, out_b = 0.0f;
  int e_first = 0, e_last = 0;
  if (out_live) {
    out_sc = scale[row_out];
    out_b = bias != nullptr ? bf16_to_float(bias[row_out]) : 0.0f;
    e_first = esc_fix[row_out];  // (computed at load time: the first that needs a correction)
    e_last = rowptr[row_out + 1];
  }
  // the extra warp only starts the copies (broadcast from lane 0, so that ptxas sees a
  // warp-uniform branch and does not serialize the MMAs)
  const bool producer = __shfl_sync(0xffffffffu, tid >= THREADS ? 1 : 0, 0) != 0;
  // Each stage is refilled once every warp has read its chunk words (wempty) or once every
  // warpgroup's MMAs of its activations are done (xempty); the copies are started by a thread
  // that never runs the proxy fence (a fence may wait for what its thread has in flight).
  // Nothing here waits on the consumers except for a stage to refill. (The whole warp waits,
  // so that no spin loop sits in a thread-dependent branch: that too makes ptxas serialize
  // the MMAs.)
  // Column 0's chunk words go first: they do not depend on the kernel before this one
  // (w12_permute_x), which a launch with programmatic dependent launch (launcher.py)
  // lets still run; griddepcontrol.wait then returns once its images are written and visible
  // (at once without that launch). Nothing else here reads what it writes.
  // (PERS: the block's segments one after another, the stage counter j running on)
  auto produce = [&]() {
    if constexpr (PERS != 0) {
      u32 j = 0;
      for (int sg = 0; sg < nseg; ++sg) {
        set_segment(sg);
        for (int col = clo; col < chi; ++col, ++j) {
          if (j >= SW) mbar_wait(wempty + j % SW, (j / SW - 1) & 1u);
          if (lane == 0) issue_w(j % SW, col);
          if (j == 0) asm volatile("griddepcontrol.wait;" ::: "memory");
          if (j >= SX) mbar_wait(xempty + j % SX, (j / SX - 1) & 1u);
          if (lane == 0) issue_x(j % SX, col);
        }
      }
      return;
    }
    for (int col = 0; col < n; ++col) {
      if (col >= SW) mbar_wait(wempty + col % SW, (u32)(col / SW - 1) & 1u);
      if (lane == 0) issue_w(col % SW, col);
      if (col == 0) asm volatile("griddepcontrol.wait;" ::: "memory");
      if (col >= SX) mbar_wait(xempty + col % SX, (u32)(col / SX - 1) & 1u);
      if (lane == 0) issue_x(col % SX, col);
    }
  };
  // PERS: the producer warpgroup's other 96 threads write each segment's escape batches and
  // row data (see the top; the walk to a row's first escape that the tiles cannot hold is the
  // one the non-persistent kernel does at its start), so that neither the consumers' start of
  // a segment nor its epilogue waits on a chain of global loads.
  auto escape_batches = [&](int sg) {  // segment sg's, into escring and escwarp
    set_segment(sg);
    const int p = tid - THREADS - 32;
    constexpr int ENTRIES = 4 * WGS * 32;
#pragma unroll
    for (int it = 0; it < (ENTRIES + 95) / 96; ++it) {  // (unrolled: the entries' loads overlap)
      const int e = p + 96 * it;
      if (e < ENTRIES) {
        const int tile = min(tile0 + (e >> 5), ntiles - 1);
        const int b0 = rowptr[16 * tile], b1 = rowptr[16 * tile + 16];
        if ((e & 31) == 0) escwarp[e >> 5] = make_int2(b0, b1);
        escring[e] = b0 + (e & 31) < b1 ? esc_entry[b0 + (e & 31)]
                                        : make_uint2(0x7FFFFFFFu, 0u);
      }
    }
    asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];"
                 :: "r"(smem_addr(escfull)) : "memory");
  };
  auto row_data = [&](int sg) {  // segment sg's, into rowring
    set_segment(sg);
    const int p = tid - THREADS - 32;
#pragma unroll
    for (int it = 0; it < (R + 95) / 96; ++it) {
      const int r = p + 96 * it;
      if (r < R) {
        const int row = min(tile0 * 16 + r, n_rows - 1);  // (rows past the last: not stored)
        const float sc = scale[row];
        const float b = bias != nullptr ? bf16_to_float(bias[row]) : 0.0f;
        const int l = rowptr[row + 1];
        const int f = esc_fix[row];
        rowring[r] = make_float4(sc, b, __int_as_float(f), __int_as_float(l));
      }
    }
    asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];"
                 :: "r"(smem_addr(rowfull)) : "memory");
  };
  // Segment 0's batches the consumers load themselves, as the non-persistent kernel does (in
  // the time its first weights take to land); those of segment sg + 1 come before segment
  // sg's row data, so that a short segment does not wait for them. (Segment sg + 1's batches
  // overwrite segment sg's once the consumers have read those, at segment sg's start.)
  auto segment_data = [&]() {
    for (int sg = 0; sg < nseg; ++sg) {
      if (sg + 1 < nseg) {
        if (sg >= 1) mbar_wait(escempty, (u32)(sg - 1) & 1u);
        escape_batches(sg + 1);
      }
      if (sg >= 1) mbar_wait(rowempty, (u32)(sg - 1) & 1u);
      row_data(sg);
    }
  };
  if (AREG >= 2) {
    // A producer warpgroup that gives its registers to the two MMA warpgroups (setmaxnreg),
    // so that 128 accumulators and two sets of A fragments fit per thread: its first warp
    // starts the copies, then the whole warpgroup meets the consumers' block barriers (the
    // same ones, in the same order) and leaves; none of the consumers' code runs on it.
    if (producer) {
      asm volatile("setmaxnreg.dec.sync.aligned.u32 40;" ::: "memory");
      if (__shfl_sync(0xffffffffu, (tid >> 5) == (THREADS >> 5) ? 1 : 0, 0)) produce();
      else if (PERS != 0) segment_data();
      if constexpr (PERS == 0) {  // (PERS: the consumers meet no block barrier after the start)
        __syncthreads_or(0);  // the main loop's end
        if (CL) cluster_sync_all(); else __syncthreads();  // the partial tile stored
        if (CL) cluster_sync_all();  // the cluster's memory read
      }
      return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;" ::: "memory");
  } else if (producer) {
    produce();
  }

  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;

  // this lane's A values: register r of step j is row 16 warp + g + 8 (r % 2) of the
  // warpgroup, unit 2 j + r / 2, word t
  const int g = lane >> 2, t = lane & 3;
  const int woff = (wrow * 4 + warp) * 1536 + lane * 16;  // Words4 lane, lane + 32, lane + 64
  // (XORDER) the byte offsets in a weight stage of this lane's words of MMA step j: plane
  // t & 1 (xoff[j]) and plane 2 (xoff[4 + j]) of chunk lane 4 g + j, word t >> 1 (and 8 bytes
  // on, word 2 + (t >> 1)), where the swizzled copy put them; s1, s2: decode_x's rotations
  u32 xoff[8];
  const u32 s1 = 8u * (u32)(t & 1), s2 = 4u + 24u * (u32)(t & 1);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int lin = (wrow * 4 + warp) * 1536 + (j < 4 ? (t & 1) * 512 : 1024) +
                    (4 * g + (j & 3)) * 16 + 4 * (t >> 1);
    xoff[j] = (u32)(lin ^ (((lin >> 7) & 7) << 4));
  }

  // This warp's tile's escapes, in chunk order, 32 at a time: lane l holds entry ebase + l as
  // its chunk column (ecol; INT_MAX past the end), where it goes (epos: its byte in the A
  // buffer; with AREG the lane that holds it in registers, 256 x, plus 2 x its register
  // 4 j + r and its half: layout.escape_slot) and its value.
  int mytile = min(tile0 + wrow * 4 + warp, ntiles - 1);
  // (PERS: the segments' batches come from segment_data)
  int eend = producer || PERS != 0 ? 0 : rowptr[16 * mytile + 16];
  int ebase = producer || PERS != 0 ? 0 : rowptr[16 * mytile];
  int ecol = 0x7FFFFFFF, epos = 0;
  int enext = -1;  // (the next escape column: the first column checked computes it)
  bool eok = false;
  bf16_t eval = 0;
  auto load_escape = [&]() {
    ecol = 0x7FFFFFFF;
    eok = false;
    const int idx = ebase + lane;
    if (idx < eend) {  // (the entry computed at load time, layout.py)
      const uint2 en = esc_entry[idx];
      ecol = (int)en.x;
      eok = (en.y >> 31) != 0u;
      epos = (int)((en.y >> 16) & 0x7FFFu);
      if constexpr (XORDER) epos = xorder_place(epos);
      eval = (bf16_t)(en.y & 0xFFFFu);
    }
  };
  if (ebase < eend) load_escape();

  // The warp's release of a weight stage to the producer, whose next tensor copy (the async
  // proxy) overwrites it: the proxy fence orders this warp's generic reads of the stage before
  // that copy, as PTX requires. The release alone does not (ptxas issues it with the loads
  // still in flight): a refill that lands quickly (stream-K's staggered blocks find the column
  // in L2) could hand late lanes the next column's words, the suspected cause of stream-K's
  // run-to-run differences.
  auto release_weights = [&](unsigned long long* bar) {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncwarp();  // every lane's words are read: the warp releases the stage
    arrive_if(lane == 0, bar);
  };
  // Column i's chunk words, once they have landed, decoded into this lane's A fragments; the
  // warp then releases the weight stage.
  auto decode_column = [&](int i, u32 (&a)[4][4]) {
    const u32 q = (u32)(i + qoff);  // PERS: the stage counter
    const int ws = PERS != 0 ? (int)(q % SW) : i % SW;
    // column i's chunk words have landed
    mbar_wait(wfull + ws, PERS != 0 ? (q / SW) & 1u : (u32)(i / SW) & 1u);
    if constexpr (XORDER) {
      // (shared-space addresses: a lane's offset plus the stage's, which is the same for the
      // whole warp, so that each load is one instruction with no address arithmetic)
      const u32 wst = smem_addr(wstages) + (u32)(ws * WSTAGE);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        u32 la, lb, ta, tb;
        asm volatile("ld.shared.u32 %0, [%2];\n\tld.shared.u32 %1, [%2+8];"
                     : "=r"(la), "=r"(lb) : "r"(xoff[j] + wst) : "memory");
        asm volatile("ld.shared.u32 %0, [%2];\n\tld.shared.u32 %1, [%2+8];"
                     : "=r"(ta), "=r"(tb) : "r"(xoff[4 + j] + wst) : "memory");
        decode_x(la, lb, ta, tb, s1, s2, a[j]);
      }
      release_weights(wempty + ws);
      return;
    }
    const unsigned char* wsrc = wstages + ws * WSTAGE + woff;
    const Words4 w0 = *reinterpret_cast<const Words4*>(wsrc);
    const Words4 w1 = *reinterpret_cast<const Words4*>(wsrc + 512);
    const Words4 w2 = *reinterpret_cast<const Words4*>(wsrc + 1024);
    decode8(w0.x, w1.x, w2.x, a[0]);
    decode8(w0.y, w1.y, w2.y, a[1]);
    decode8(w0.z, w1.z, w2.z, a[2]);
    decode8(w0.w, w1.w, w2.w, a[3]);
    release_weights(wempty + ws);
  };

  // AREG: each warp decodes column i straight into the A fragment registers of wgmma (set
  // i % 2), writes its escapes into them (the lane holding an escape hands it to the lane that
  // owns its element), and runs the MMAs with A from those registers; waiting until column
  // i - 1 is multiplied frees the other set and that column's activation stage. No shared
  // memory for the A operand, no proxy fence, no barrier.
  auto column_regs = [&](int i, u32 (&a)[4][4], u32 (&prev)[4][4]) {
    decode_column(i, a);
    const int gc = c0 + i;
    for (;;) {
      if (gc < enext) break;  // (warp-uniform: no escape of this warp's here)
      u32 hits = __ballot_sync(0xffffffffu, ecol == gc && eok);
      while (hits) {
        const int src = __ffs(hits) - 1;
        hits &= hits - 1;
        const int pk = __shfl_sync(0xffffffffu, epos, src);
        const u32 v = __shfl_sync(0xffffffffu, (u32)eval, src);
        const bool mine = (pk >> 8) == lane;
        const int q = (pk >> 1) & 15;
        const u32 sh = (u32)(pk & 1) * 16u;
#pragma unroll
        for (int qq = 0; qq < 16; ++qq) {  // selects, no branch: the register index is dynamic
          u32& w = a[qq >> 2][qq & 3];
          const u32 patched = (w & ~(0xFFFFu << sh)) | (v << sh);
          w = (mine && q == qq) ? patched : w;
        }
      }
      if (__shfl_sync(0xffffffffu, ecol, 31) > gc || ebase + 32 >= eend) {
        enext = __reduce_min_sync(0xffffffffu, ecol > gc ? ecol : 0x7FFFFFFF);
        break;
      }
      ebase += 32;
      load_escape();
    }
    const u32 q = (u32)(i + qoff);  // PERS: the stage counter
    const int xs = PERS != 0 ? (int)(q % SX) : i % SX;
    // column i's activations have landed
    mbar_wait(xfull + xs, PERS != 0 ? (q / SX) & 1u : (u32)(i / SX) & 1u);
    const unsigned char* stage = smem + xs * XSTAGE;
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int j = 0; j < 4; ++j) WgmmaRS<BN>::mma(acc, a[j], sw128_desc(stage + 32 * j));
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    wgmma_wait<1>();  // column i - 1 is multiplied: its registers and activation stage are free
    keep_regs(prev);
    // (PERS: the stage of the column before, also where that was the previous segment's last:
    // its stage is refilled only once this segment has started)
    // (KIL: the warpgroup's column before, i - 2)
    arrive_if((PERS != 0 ? q >= 1u : i >= D) && (tid & 127) == 0,
              xempty + (PERS != 0 ? (int)((q + SX - 1) % SX) : (i + SX - D) % SX));
  };
  u32 a0[4][4], a1[4][4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) a0[j][r] = a1[j][r] = 0u;
  if constexpr (PERS != 0) {
    // Stream-K (see the top): the block's segments in turn, the outputs of a unit stored
    // straight from the accumulators, so that the stages stay with the producer, which
    // fills them with the next segment's first columns meanwhile. This thread's
    // accumulators are rows rloc and rloc + 8 of the unit's R (register i: row
    // rloc + 8 ((i % 4) / 2), token 8 (i / 4) + 2 t + i % 2 of its BN), and as a piece they
    // go to work[block] as BN / 8 float4s, thread-major (index c * THREADS + tid), which
    // the owner reads back into the same registers of the same thread.
    for (int sg = 0; sg < nseg; ++sg) {
      set_segment(sg);
      // this warp's first escape batch (escapes of columns before clo are never matched):
      // segment 0's loaded here, the others' from segment_data
      if (sg == 0) {
        mytile = min(tile0 + wg * 4 + warp, ntiles - 1);
        eend = rowptr[16 * mytile + 16];
        ebase = rowptr[16 * mytile];
        if (ebase < eend) load_escape();
        enext = -1;
      } else {
        mbar_wait(escfull, (u32)(sg - 1) & 1u);
        const int2 wb = escwarp[wg * 4 + warp];
        const uint2 e = escring[(wg * 4 + warp) * 32 + lane];
        arrive_if(true, escempty);
        ebase = wb.x;
        eend = wb.y;
        ecol = (int)e.x;
        eok = (e.y >> 31) != 0u;
        epos = (int)((e.y >> 16) & 0x7FFFu);
        if constexpr (XORDER) epos = xorder_place(epos);
        eval = (bf16_t)(e.y & 0xFFFFu);
        enext = -1;
      }
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
      // (the loop counts stage steps, whose stage indices are then those of the
      // non-persistent loop; the columns are the steps less qoff)
      const int qe = chi + qoff;
      for (int qq = clo + qoff; qq < qe; qq += 2) {
        column_regs(qq - qoff, a0, a1);
        if (qq + 1 < qe) column_regs(qq + 1 - qoff, a1, a0);
      }
      wgmma_wait<0>();  // (the last column's stage is released by the next one's MMAs)
      // What the epilogue needs of the segment, computed again from an opaque copy of its
      // index rather than kept in registers through the main loop, where none is left.
      int sge;
      asm volatile("mov.b32 %0, %1;" : "=r"(sge) : "r"(sg));
      set_segment(sge);
      float4* slot = reinterpret_cast<float4*>(work);
      // (the thread index read again, not kept in a register through the main loop, where
      // none is left: at 168 registers a kept one spills)
      u32 me;
      asm volatile("mov.u32 %0, %%tid.x;" : "=r"(me));
      const int rloc = (me >> 7) * 64 + 16 * ((me >> 5) & 3) + ((me & 31) >> 2);
      if (clo > 0) {
        // a piece: its sums to work[block], then (all consumer threads' stores made visible
        // at GPU scope, then met at barrier 3) flags[block] set
        float4* wp = slot + (size_t)blockIdx.x * (BN / 8) * THREADS + me;
        // (16 floats as 3 16-byte words, thread-major)
        uint4* np = reinterpret_cast<uint4*>(wp);
#pragma unroll
        for (int c = 0; c < BN / 32; ++c)
          pack24x16(acc, 16 * c, np + 3 * c * THREADS, THREADS);
        __threadfence();
        asm volatile("bar.sync 3, %0;" :: "n"(THREADS) : "memory");
        asm volatile("{\n.reg .pred p;\nsetp.eq.u32 p, %1, 0;\n"
                     "@p st.release.gpu.global.u32 [%0], 1;\n}"
                     :: "l"(flags + blockIdx.x), "r"(me) : "memory");
        // (its row data unused, but waited for all the same: a phase of rowfull left
        // unwaited would let the wait at the next segment's end, by parity, pass a phase
        // early, before that segment's row data is written)
        mbar_wait(rowfull, (u32)sg & 1u);
        arrive_if(true, rowempty);
        continue;
      }
      if (chi < nchunks) {
        // the owner of a unit cut between blocks: the pieces of blocks blockIdx.x + 1 ..
        // (the last is the one holding the unit's last step) added in block order, each
        // once its flag is set (every warp waits on its own, warp-uniform), then the flags
        // cleared for the next call (after barrier 3: every warp has seen them). Each piece
        // is read straight into the registers it adds to (fetching the pieces by bulk
        // copies into the idle stages is not faster).
        const int uend = (u0 + sg + 1) * nchunks;
        int bb = blockIdx.x;
        do {
          ++bb;
          wait_flag(flags + bb);
          const float4* wp = slot + (size_t)bb * (BN / 8) * THREADS + me;
          const uint4* np = reinterpret_cast<const uint4*>(wp);
#pragma unroll
          for (int c = 0; c < BN / 32; ++c) add24x16(acc, 16 * c, np + 3 * c * THREADS, THREADS);
        } while (cuts[bb + 1] < uend);
        asm volatile("bar.sync 3, %0;" :: "n"(THREADS) : "memory");
        for (int f = blockIdx.x + 1; f <= bb; ++f)
          asm volatile("{\n.reg .pred p;\nsetp.eq.u32 p, %1, 0;\n"
                       "@p st.relaxed.gpu.global.u32 [%0], 0;\n}"
                       :: "l"(flags + f), "r"(me) : "memory");
      }
      // the unit's outputs: store_output's arithmetic (scale, the corrections in list
      // order, bias, BF16). Rows with corrections (rare: inf, NaN, out-of-range escapes)
      // get them here, in place, and then the multiplier 1 (exact), so that the loop below
      // is the same code for all rows.
      mbar_wait(rowfull, (u32)sg & 1u);
      const float4 d0 = rowring[rloc], d1 = rowring[rloc + 8];
      arrive_if(true, rowempty);
      const int gr0 = tile0 * 16 + rloc, gr1 = gr0 + 8;
      float m0 = d0.x, m1 = d1.x;
      const int f0 = __float_as_int(d0.z), l0 = __float_as_int(d0.w);
      const int f1 = __float_as_int(d1.z), l1 = __float_as_int(d1.w);
      auto correct = [&](int hi, int f, int l, float sc) {
#pragma unroll
        for (int i = 0; i < BN / 2; ++i)
          if (((i & 3) >> 1) == hi) acc[i] *= sc;
#pragma unroll 1
        for (int e = f; e < l; ++e) {
          bf16_t unused;
          if (patch_value(esc_val[e], sc, unused)) continue;  // multiplied in the main loop
          // (a pointer walking the tokens, so that no per-token offset outlives the loop)
          const bf16_t* xr = x + (size_t)(tok0 + 2 * t) * ldx + esc_col[e];
          const float d = esc_delta[e];
          const int rem = M - tok0 - 2 * t;  // tokens past M are not stored
#pragma unroll
          for (int c = 0; c < BN / 8; ++c) {
            if (8 * c < rem) acc[4 * c + 2 * hi] += bf16_to_float(xr[0]) * d;
            if (8 * c + 1 < rem) acc[4 * c + 2 * hi + 1] += bf16_to_float(xr[ldx]) * d;
            xr += 8 * (size_t)ldx;
          }
        }
      };
      if (__any_sync(0xffffffffu, f0 < l0 || f1 < l1)) {  // (warp-uniform)
        if (f0 < l0) { correct(0, f0, l0, m0); m0 = 1.0f; }
        if (f1 < l1) { correct(1, f1, l1, m1); m1 = 1.0f; }
      }
      // The block's last segment (nothing is copied into the stages after it): its outputs
      // go through a token-major BF16 staging tile in the stages' memory (stmatrix.trans,
      // rows padded by 16 bytes) and out in 16-byte stores of whole 256-byte row segments,
      // where the stores straight from the accumulators write 16 bytes of four lines each
      // (~5 us a unit). The same arithmetic, so the same bits.
      if (sge == nseg - 1 && (n_rows & 7) == 0 && (reinterpret_cast<size_t>(y) & 15) == 0) {
        constexpr int STRIDE = 2 * R + 16;  // bytes of a token's row in the staging tile
        // (both warpgroups' MMAs are done with the stages)
        asm volatile("bar.sync 3, %0;" :: "n"(THREADS) : "memory");
        const float sc[2] = {m0, m1}, b[2] = {d0.y, d1.y};
        stage_tile<BN / 8, STRIDE>(acc, sc, b, bias != nullptr, smem, rloc & ~7, me & 31);
        asm volatile("bar.sync 3, %0;" :: "n"(THREADS) : "memory");
        store_staged<R, STRIDE, THREADS>(smem, y, n_rows, tok0, tile0 * 16, min(BN, M - tok0),
                                         me);
        continue;
      }
      bf16_t* yb = y + (size_t)(tok0 + 2 * t) * n_rows;
      const bool live0 = gr0 < n_rows, live1 = gr1 < n_rows;
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) {
        const int hi = (i & 3) >> 1;
        const int tk = 8 * (i >> 2) + (i & 1);  // past tok0 + 2 t
        float o = acc[i] * (hi ? m1 : m0);
        if (bias != nullptr) o += hi ? d1.y : d0.y;
        if (tok0 + 2 * t + tk < M && (hi ? live1 : live0))
          yb[(size_t)tk * n_rows + (hi ? gr1 : gr0)] = float_to_bf16(o);
      }
    }
    return;
  }
  // (KIL: this warpgroup's columns, from its index on; broadcast, so that ptxas sees a
  // warp-uniform loop around the MMAs)
  const int i0 = KIL ? __shfl_sync(0xffffffffu, wg, 0) : 0;
  for (int i = i0; i < n && !producer; i += 2 * D) {
    column_regs(i, a0, a1);
    if (i + D < n) column_regs(i + D, a1, a0);
  }

  if (!producer) wgmma_wait<0>();
  // The 8-row store path (below): its rows' scales and biases, loaded now so that they land
  // while the partial tile is stored.
  constexpr int RG = R / 8;          // groups of 8 weight rows in the block
  constexpr int TPP = THREADS / RG;  // tokens a pass of the consumer threads
  const int rg = tid % RG, row8 = tblock * R + 8 * rg;
  // (one K range or two (PUSH): where the other ranks' tiles are read, its 16-byte
  // distributed shared-memory loads make the epilogue slower than the row-a-thread path)
  const bool vec_ok = (SPLIT == 1 || SPLIT == 2) && (n_rows & 7) == 0 &&
                      (reinterpret_cast<size_t>(y) & 15) == 0;
  float vsc[8], vb[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const bool on = vec_ok && !producer && row8 < n_rows;
    vsc[j] = on ? scale[row8 + j] : 0.0f;
    vb[j] = on && bias != nullptr ? bf16_to_float(bias[row8 + j]) : 0.0f;
  }
  // the stages are free: the memory takes the partial tile [BN][PST]; whether a row of the
  // block has corrections to add (then the row-a-thread path below, for the whole block)
  const bool corrections = __syncthreads_or(out_live && e_first < e_last) != 0;

  // Tokens of this block's share. With 3 ranks the shares overrun the block (3 x 86 > 256):
  // the last one stops at the block's end, not at the next block's first tokens (which it
  // would overwrite with sums read past the partial tile).
  constexpr int TS = (BN + SPLIT - 1) / SPLIT;
  const int first = rank * TS;
  const int last = min(first + TS, BN % SPLIT != 0 ? min(BN, M - tok0) : M - tok0);
  // PUSH (2 K ranges): each block copies its sums of every other rank's share of tokens into
  // that rank's inbox (one bulk copy a rank, shared memory to distributed shared memory), so
  // that every rank adds its share from its own shared memory; with 3 or 4 the ranks read each
  // other's tiles, 4 bytes a thread (with 3 the copies take ~1.5 us more; launcher.py's
  // shared_bytes holds the inbox). inbox slot s holds the sums of rank s
  // (s < rank) or s + 1, tokens first.., as in the tile.
  constexpr bool PUSH = SPLIT == 2;
  float* part = reinterpret_cast<float*>(smem);
  float* inbox = part + BN * PST;
  unsigned long long* inbar =
      reinterpret_cast<unsigned long long*>(inbox + (SPLIT - 1) * TS * PST);
  if (PUSH && tid == 0) {  // (the stages' memory is free: the main loop is over)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_addr(inbar)));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  // OWN (two K ranges): a block keeps the sums of its
  // own share of tokens in its accumulators and writes only the other rank's share to the
  // partial tile (the bytes it pushes); after the push it adds the other rank's sums from its
  // inbox into the accumulators and stores through a BF16 staging tile in the own share's
  // part of the tile (neither pushed from nor pushed into). Rank 0's sums plus rank 1's in
  // either order are the same float (one rounding), and the arithmetic after is the 8-row
  // path's, so the bits are the partial tile's (the pushed share cut to 24 bits in either
  // path). Both ranks take the same path (the same rows).
  constexpr bool OWN = PUSH;
  const bool own = OWN && vec_ok && !corrections;  // (block-uniform)
  // (own) this thread's rows, their scales and biases, loaded now to land during the push.
  // (The rank and the thread index are read again here, not kept through the main loop: kept,
  // they cost its loop 3 instructions.)
  int orank = 0;
  u32 me = 0;
  if constexpr (OWN) {
    asm volatile("mov.u32 %0, %%ctaid.z;" : "=r"(orank));
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(me));
  }
  const int olane = (int)(me & 31), og = olane >> 2, ot = olane & 3;
  // (KIL: both warpgroups on the block's 64 rows)
  const int orl = (int)((KIL ? 0u : (me >> 7) * 64) + 16 * ((me >> 5) & 3)) + og;
  // threads holding distinct sums (KIL: warpgroup 0, once it has added warpgroup 1's), the
  // stride of the narrow hand-over's thread-major words
  constexpr int PT = KIL ? 128 : THREADS;
  const int orow = tblock * R + orl;
  float osc[2] = {0.0f, 0.0f}, ob[2] = {0.0f, 0.0f};
  if (own && !producer) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rr = min(orow + 8 * h, n_rows - 1);  // (rows past the last: not stored)
      osc[h] = scale[rr];
      ob[h] = bias != nullptr ? bf16_to_float(bias[rr]) : 0.0f;
    }
  }
  constexpr int HALF = BN / 4;  // accumulators of one share (tokens 8 (i / 4) + 2 t + i % 2)
  // (OWN: a block that takes another path (below) cuts the sums it pushes to the same 24
  // bits, so that both paths give the same bits)
  if (own && !producer) {
    // the own share's accumulators to acc[0 .. HALF), the other's to acc[HALF ..) (selects:
    // register indices stay constant), then the other's into the tile at its tokens' places
#pragma unroll
    for (int i = 0; i < HALF; ++i) {
      const float lo = acc[i], hi = acc[i + HALF];
      acc[i] = orank != 0 ? hi : lo;
      acc[i + HALF] = orank != 0 ? lo : hi;
    }
    // (a thread's sums of share s in the tile, float32 at their tokens' places)
    auto at = [&](int s) { return part + (s * TS + 2 * ot) * PST + orl; };
    auto place = [](int i) { return (8 * (i >> 2) + (i & 1)) * PST + 8 * ((i & 3) >> 1); };
    if (KIL && wg == 1) {
      // KIL: warpgroup 1 hands both shares to warpgroup 0 (the MMA threads meet below), which
      // adds them to its own (warpgroup 0's sums plus warpgroup 1's: the partial tile's)
      float* op = at(1 - orank);
      float* mp = at(orank);
#pragma unroll
      for (int i = 0; i < HALF; ++i) {
        op[place(i)] = acc[i + HALF];
        mp[place(i)] = acc[i];
      }
    }
    if constexpr (KIL) {
      asm volatile("bar.sync 4, %0;" :: "n"(THREADS) : "memory");
      if (wg == 0) {
        const float* op = at(1 - orank);
        const float* mp = at(orank);
#pragma unroll
        for (int i = 0; i < HALF; ++i) {
          acc[i + HALF] += op[place(i)];
          acc[i] += mp[place(i)];
        }
        // (the narrow words below overwrite other threads' floats: all read first)
        asm volatile("bar.sync 5, 128;" ::: "memory");
      }
    }
    if (!KIL || wg == 0) {
      // (thread-major: the partner's thread me reads them back)
      uint4* np = reinterpret_cast<uint4*>(part + (1 - orank) * TS * PST) + me;
#pragma unroll
      for (int c = 0; c < HALF / 16; ++c)
        pack24x16(acc, HALF + 16 * c, np + 3 * c * PT, PT);
    }
  } else if (!producer && (!KIL || wg == 0)) {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) {
      const int r = wrow * 64 + 16 * warp + g + 8 * ((i & 3) >> 1);
      const int col = 8 * (i >> 2) + 2 * t + (i & 1);
      part[col * PST + r] = OWN && !KIL && (i >= HALF) == (rank == 0) ? cut24(acc[i]) : acc[i];
    }
  }
  if (KIL && !own) {  // warpgroup 1's sums added to warpgroup 0's (the MMA threads meet)
    if (!producer) asm volatile("bar.sync 4, %0;" :: "n"(THREADS) : "memory");
    if (!producer && wg == 1) {
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) {
        const int r = 16 * warp + g + 8 * ((i & 3) >> 1);
        const int col = 8 * (i >> 2) + 2 * t + (i & 1);
        const float v = part[col * PST + r] + acc[i];
        part[col * PST + r] = OWN && (i >= HALF) == (rank == 0) ? cut24(v) : v;
      }
    }
  }
  if (PUSH) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // for the copies
  if (CL) cluster_sync_all(); else __syncthreads();
  if constexpr (PUSH) {
    auto tokens = [](int q) { return min(BN, (q + 1) * TS) - q * TS; };
    if (tid == 0) {
      // (own: the other share's accumulators, 3 bytes each, of PT threads)
      constexpr int NB = HALF * 3 * PT;
      const bool nw = own;  // (the same in both blocks: the same rows)
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                   :: "r"(smem_addr(inbar)), "r"(nw ? NB : (SPLIT - 1) * tokens(rank) * PST * 4)
                   : "memory");
#pragma unroll
      for (int q = 0; q < SPLIT; ++q) {
        if (q == rank) continue;
        u32 dst, bar;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(dst)
                     : "r"(smem_addr(inbox + (rank < q ? rank : rank - 1) * TS * PST)),
                       "r"(q));
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(bar)
                     : "r"(smem_addr(inbar)), "r"(q));
        asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes"
                     " [%0], [%1], %2, [%3];"
                     :: "r"(dst), "r"(smem_addr(part + q * TS * PST)),
                        "r"(nw ? NB : tokens(q) * PST * 4), "r"(bar) : "memory");
      }
    }
    mbar_wait(inbar, 0u);  // the other ranks' sums of this share have landed
  }
  // rank q's sums of token col (of this block's share) at row offset 0
  auto share = [&](int q, int col) -> const float* {
    if (!PUSH || q == rank) return part + col * PST;
    return inbox + (q < rank ? q : q - 1) * TS * PST + (col - first) * PST;
  };
  // The outputs: thread (group, r) finishes row r for every GROUPS-th token of this block's
  // share (tokens rank * BN / SPLIT ..): store_output's arithmetic with the corrections of the
  // escapes written into the tiles left out. Rows without other escapes (nearly all) take a
  // short loop: a long unrolled one ran several times slower here, its code not staying in
  // the instruction cache. Rows with escapes to correct take TB tokens at
  // a time, so that the activation loads of an escape are in flight together.
  constexpr int TB = 4;
  auto partial_sum = [&](int col) {
    float v;
    if (SPLIT > 1 && !PUSH) {
      const float* p = part + col * PST + r_out;
      v = load_cluster(p, 0);
#pragma unroll
      for (int q = 1; q < SPLIT; ++q) v += load_cluster(p, q);  // fixed order
    } else {
      v = share(0, col)[r_out];
#pragma unroll
      for (int q = 1; q < SPLIT; ++q) v += share(q, col)[r_out];  // fixed order
    }
    return v;
  };
  auto partial_sum8 = [&](int col, float (&v)[8]) {  // (1 or 2 ranks only: vec_ok)
    const float4* p = reinterpret_cast<const float4*>(share(0, col) + 8 * rg);
    float4 a = p[0], b = p[1];
#pragma unroll
    for (int q = 1; q < SPLIT; ++q) {  // fixed order, as partial_sum
      const float4* o = reinterpret_cast<const float4*>(share(q, col) + 8 * rg);
      const float4 c = o[0], d = o[1];
      a.x += c.x; a.y += c.y; a.z += c.z; a.w += c.w;
      b.x += d.x; b.y += d.y; b.z += d.z; b.w += d.w;
    }
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  };
  if (own) {
    // (OWN, above) the other rank's sums of this share added in, then store_output's
    // arithmetic (scale, bias, BF16) into a token-major staging tile (stmatrix.trans, rows
    // padded by 16 bytes) and out in 16-byte stores of whole 256-byte row segments
    constexpr int STRIDE = 2 * R + 16;  // bytes of a token's row in the staging tile
    unsigned char* stg = reinterpret_cast<unsigned char*>(part + orank * TS * PST);
    if (!producer && (!KIL || wg == 0)) {
      const uint4* np = reinterpret_cast<const uint4*>(inbox) + me;
#pragma unroll
      for (int c = 0; c < HALF / 16; ++c) add24x16(acc, 16 * c, np + 3 * c * PT, PT);
      stage_tile<HALF / 4, STRIDE>(acc, osc, ob, bias != nullptr, stg, orl - og, olane);
    }
    if (!producer) {
      asm volatile("bar.sync 3, %0;" :: "n"(THREADS) : "memory");
      const int ofirst = orank * TS;
      store_staged<R, STRIDE, THREADS>(stg, y, n_rows, tok0 + ofirst, tblock * R,
                                       max(0, min(TS, M - tok0 - ofirst)), me);
    }
  } else if (vec_ok && !corrections) {
    // Every row of the block without corrections, N a multiple of 8: thread (token, group)
    // finishes 8 consecutive rows of one token (store_output's arithmetic, as below) and
    // stores them as one 16-byte word; a warp stores whole 256-byte row segments of y
    // TU tokens' sums are read before any is stored.
    constexpr int TU = 4;
    if (!producer && row8 < n_rows) {
      bf16_t* yrow = y + (size_t)tok0 * n_rows + row8;
      for (int base = first + tid / RG; base < last; base += TPP * TU) {
        float v[TU][8];
#pragma unroll
        for (int u = 0; u < TU; ++u) partial_sum8(min(base + u * TPP, last - 1), v[u]);
#pragma unroll
        for (int u = 0; u < TU; ++u) {
          const int col = base + u * TPP;
          u32 w[4];
#pragma unroll
          for (int j = 0; j < 8; j += 2) {
            float o0 = v[u][j] * vsc[j], o1 = v[u][j + 1] * vsc[j + 1];
            if (bias != nullptr) {
              o0 += vb[j];
              o1 += vb[j + 1];
            }
            w[j / 2] = (u32)float_to_bf16(o0) | ((u32)float_to_bf16(o1) << 16);
          }
          if (col < last)
            *reinterpret_cast<uint4*>(yrow + (size_t)col * n_rows) =
                make_uint4(w[0], w[1], w[2], w[3]);
        }
      }
    }
  } else if (out_live && e_first == e_last) {
    // TF tokens' sums are read before any is stored, so that their (distributed) shared
    // memory loads are in flight together
    constexpr int TF = 8;
    bf16_t* yrow = y + (size_t)tok0 * n_rows + row_out;
    for (int base = first + group; base < last; base += GROUPS * TF) {
      float v[TF];
#pragma unroll
      for (int u = 0; u < TF; ++u) v[u] = partial_sum(min(base + u * GROUPS, last - 1));
#pragma unroll
      for (int u = 0; u < TF; ++u) {
        const int col = base + u * GROUPS;
        float o = v[u] * out_sc;
        if (bias != nullptr) o += out_b;
        if (col < last) yrow[(size_t)col * n_rows] = float_to_bf16(o);
      }
    }
  } else if (out_live) {
    for (int base = first + group; base < last; base += GROUPS * TB) {
      float out[TB];
#pragma unroll
      for (int u = 0; u < TB; ++u) out[u] = partial_sum(min(base + u * GROUPS, last - 1)) * out_sc;
      for (int e = e_first; e < e_last; ++e) {
        bf16_t unused;
        if (patch_value(esc_val[e], out_sc, unused)) continue;  // multiplied in the main loop
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
          if (bias != nullptr) o += out_b;
          y[(size_t)(tok0 + col) * n_rows + row_out] = float_to_bf16(o);
        }
      }
    }
  }
  // no block leaves while another reads its memory
  if (CL) cluster_sync_all();
}
