// The decode of the packed weight to BF16 [N, K] on the GPU (launcher.py), for the large-M
// rows that the GEMM kernels do not take: decode, then cuBLAS.
//
// w12_decode: the in-window weights (escapes come out as record 0); w12_write_escapes writes
// the escapes in after it.

#include "common.cuh"

__device__ __forceinline__ u32 scale_pair(u32 pair, float s) {
  const float lo = __uint_as_float(pair << 16) * s;
  const float hi = __uint_as_float(pair & 0xFFFF0000u) * s;
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// The decode, one warp per chunk (grid-stride): lane (g, t) decodes columns 16t..16t+15 of rows
// g and g + 8 into the warp's own 16 x 64 tile of shared memory (rows padded by 16 bytes, so
// neither the lanes' 16-byte writes nor the row reads collide on a bank), then the warp writes
// the tile back as 4 stores of 4 full 128-byte rows. Storing each lane's own fragment instead
// covered half of every 32-byte sector per store and ran at 2.0-2.3 TB/s against 3.3-3.6 TB/s
// on the H200.
constexpr int DECODE_ROW_WORDS = 36;  // 64 BF16 + 8 padding, in 32-bit words

__global__ void __launch_bounds__(256) w12_decode(const Words4* __restrict__ chunks,
                                                  const float* __restrict__ scale,
                                                  bf16_t* __restrict__ out, int N, int K,
                                                  int nchunks, long long total_chunks) {
  __shared__ __align__(16) u32 tiles[8][16 * DECODE_ROW_WORDS];
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  u32* tile = tiles[threadIdx.x >> 5];
  const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
  for (long long id = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
       id < total_chunks; id += warps) {
    const Words4* p = chunks + id * 96 + lane;
    const Words4 w0 = load_stream(p), w1 = load_stream(p + 32), w2 = load_stream(p + 64);
    const u32 lo_a[4] = {w0.x, w0.y, w0.z, w0.w};
    const u32 lo_b[4] = {w1.x, w1.y, w1.z, w1.w};
    const u32 top[4] = {w2.x, w2.y, w2.z, w2.w};
    const long long tile_row = id / nchunks;
    const int c = (int)(id - tile_row * nchunks);
    u32 a[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) decode8(lo_a[j], lo_b[j], top[j], a[j]);
    __syncwarp();  // the previous chunk's rows are read
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = g + 8 * half;
      const long long row = tile_row * 16 + r;
      const float s = row < N ? scale[row] : 0.0f;
      u32 v[8];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[2 * j] = scale_pair(a[j][half], s);
        v[2 * j + 1] = scale_pair(a[j][2 + half], s);
      }
      uint4* dst = reinterpret_cast<uint4*>(tile + r * DECODE_ROW_WORDS + 8 * t);
      dst[0] = make_uint4(v[0], v[1], v[2], v[3]);
      dst[1] = make_uint4(v[4], v[5], v[6], v[7]);
    }
    __syncwarp();
    const int piece = lane & 7;  // 8 columns
    const int col = c * 64 + 8 * piece;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = 4 * i + (lane >> 3);
      const long long row = tile_row * 16 + r;
      if (row >= N || col >= K) continue;
      const uint4 v = *reinterpret_cast<const uint4*>(tile + r * DECODE_ROW_WORDS + 4 * piece);
      bf16_t* dst = out + row * K + col;
      if (col + 8 <= K && (K & 7) == 0) {
        *reinterpret_cast<uint4*>(dst) = v;
      } else {
        const u32 w[4] = {v.x, v.y, v.z, v.w};
        for (int e = 0; e < 8 && col + e < K; ++e)
          dst[e] = (bf16_t)((w[e >> 1] >> (16 * (e & 1))) & 0xFFFFu);
      }
    }
  }
}

// out[row[i], col[i]] = val[i] (BF16 bits) for every escape, after the decode: one launch
// (positions are unique, so the result does not depend on the order of the writes).
__global__ void __launch_bounds__(256) w12_write_escapes(bf16_t* __restrict__ out,
                                                         const int* __restrict__ row,
                                                         const int* __restrict__ col,
                                                         const bf16_t* __restrict__ val,
                                                         long long count, int K) {
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += step)
    out[(long long)row[i] * K + col[i]] = val[i];
}
