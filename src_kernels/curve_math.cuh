// Space-filling-curve maps shared by host and device (hilbert_lab's CUDA curve kernels).
//
// Conventions (pinned by tests against galtay/hilbertcurve 2.0.5 and hilbert_lab.curves):
//  * Hilbert: Skilling's transpose algorithm exactly as hilbertcurve's distance_from_point /
//    point_from_distance; in the index, coordinate 0 supplies the most significant bit of every
//    ndim-bit group. For 2D with order <= 16 a branch-free prefix-scan form (rawrunprotected's
//    public-domain construction) is used; it yields exactly the same indices (tested).
//  * Morton: plain bit interleave with coordinate 0 as the most significant bit of each group
//    (the same bit placement as the Hilbert transpose, i.e. Hilbert without the rotations).
// The file has no dependency beyond the CUDA headers, so it compiles for the host as well.
#pragma once
#include <stdint.h>

#if defined(__CUDACC__)
#define HL_HD __host__ __device__ __forceinline__
#else
#define HL_HD inline
#endif

namespace hl {

// ---- 2D fast path (order <= 16) -------------------------------------------------------------
HL_HD uint32_t interleave16(uint32_t x) {
  x = (x | (x << 8)) & 0x00FF00FFu;
  x = (x | (x << 4)) & 0x0F0F0F0Fu;
  x = (x | (x << 2)) & 0x33333333u;
  x = (x | (x << 1)) & 0x55555555u;
  return x;
}

HL_HD uint32_t deinterleave16(uint32_t x) {
  x = x & 0x55555555u;
  x = (x | (x >> 1)) & 0x33333333u;
  x = (x | (x >> 2)) & 0x0F0F0F0Fu;
  x = (x | (x >> 4)) & 0x00FF00FFu;
  x = (x | (x >> 8)) & 0x0000FFFFu;
  return x;
}

HL_HD uint32_t prefix_scan16(uint32_t x) {
  x = (x >> 8) ^ x;
  x = (x >> 4) ^ x;
  x = (x >> 2) ^ x;
  x = (x >> 1) ^ x;
  return x;
}

// (x, y) in [0, 2^order)^2 -> index in [0, 4^order); rawrunprotected's convention.
HL_HD uint32_t hilbert2d_xy_to_index(uint32_t order, uint32_t x, uint32_t y) {
  x = x << (16 - order);
  y = y << (16 - order);
  uint32_t A, B, C, D;
  {
    uint32_t a = x ^ y;
    uint32_t b = 0xFFFFu ^ a;
    uint32_t c = 0xFFFFu ^ (x | y);
    uint32_t d = x & (y ^ 0xFFFFu);
    A = a | (b >> 1);
    B = (a >> 1) ^ a;
    C = ((c >> 1) ^ (b & (d >> 1))) ^ c;
    D = ((a & (c >> 1)) ^ (d >> 1)) ^ d;
  }
  {
    uint32_t a = A, b = B, c = C, d = D;
    A = ((a & (a >> 2)) ^ (b & (b >> 2)));
    B = ((a & (b >> 2)) ^ (b & ((a ^ b) >> 2)));
    C ^= ((a & (c >> 2)) ^ (b & (d >> 2)));
    D ^= ((b & (c >> 2)) ^ ((a ^ b) & (d >> 2)));
  }
  {
    uint32_t a = A, b = B, c = C, d = D;
    A = ((a & (a >> 4)) ^ (b & (b >> 4)));
    B = ((a & (b >> 4)) ^ (b & ((a ^ b) >> 4)));
    C ^= ((a & (c >> 4)) ^ (b & (d >> 4)));
    D ^= ((b & (c >> 4)) ^ ((a ^ b) & (d >> 4)));
  }
  {
    uint32_t a = A, b = B, c = C, d = D;
    C ^= ((a & (c >> 8)) ^ (b & (d >> 8)));
    D ^= ((b & (c >> 8)) ^ ((a ^ b) & (d >> 8)));
  }
  uint32_t a = C ^ (C >> 1);
  uint32_t b = D ^ (D >> 1);
  uint32_t i0 = x ^ y;
  uint32_t i1 = b | (0xFFFFu ^ (i0 | a));
  uint32_t index = (interleave16(i1) << 1) | interleave16(i0);
  return order == 0 ? 0u : index >> (32 - 2 * order);
}

HL_HD void hilbert2d_index_to_xy(uint32_t order, uint32_t index, uint32_t* x, uint32_t* y) {
  if (order == 0) { *x = 0; *y = 0; return; }
  index = index << (32 - 2 * order);
  uint32_t i0 = deinterleave16(index);
  uint32_t i1 = deinterleave16(index >> 1);
  uint32_t t0 = (i0 | i1) ^ 0xFFFFu;
  uint32_t t1 = i0 & i1;
  uint32_t prefix_t0 = prefix_scan16(t0);
  uint32_t prefix_t1 = prefix_scan16(t1);
  uint32_t a = (((i0 ^ 0xFFFFu) & prefix_t1) | (i0 & prefix_t0));
  *x = (a ^ i1) >> (16 - order);
  *y = (a ^ i0 ^ i1) >> (16 - order);
}

// ---- any ndim (<= 8), ndim * order <= 64: Skilling's transpose (hilbertcurve's convention) ----
template <int NDIM>
HL_HD uint64_t transpose_to_index(const uint64_t (&x)[NDIM], int order) {
  uint64_t h = 0;
  for (int bit = order - 1; bit >= 0; --bit) {
#pragma unroll
    for (int d = 0; d < NDIM; ++d) h = (h << 1) | ((x[d] >> bit) & 1ull);
  }
  return h;
}

template <int NDIM>
HL_HD void index_to_transpose(uint64_t h, int order, uint64_t (&x)[NDIM]) {
#pragma unroll
  for (int d = 0; d < NDIM; ++d) x[d] = 0;
  for (int bit = order - 1; bit >= 0; --bit) {
#pragma unroll
    for (int d = 0; d < NDIM; ++d) {
      int shift = bit * NDIM + (NDIM - 1 - d);
      x[d] |= ((h >> shift) & 1ull) << bit;
    }
  }
}

template <int NDIM>
HL_HD uint64_t hilbert_encode(uint64_t (&x)[NDIM], int order) {
  if (order <= 0) return 0;
  const uint64_t m = 1ull << (order - 1);
  for (uint64_t q = m; q > 1; q >>= 1) {
    const uint64_t p = q - 1;
#pragma unroll
    for (int i = 0; i < NDIM; ++i) {
      if (x[i] & q) {
        x[0] ^= p;
      } else {
        uint64_t t = (x[0] ^ x[i]) & p;
        x[0] ^= t;
        x[i] ^= t;
      }
    }
  }
#pragma unroll
  for (int i = 1; i < NDIM; ++i) x[i] ^= x[i - 1];
  uint64_t t = 0;
  for (uint64_t q = m; q > 1; q >>= 1)
    if (x[NDIM - 1] & q) t ^= q - 1;
#pragma unroll
  for (int i = 0; i < NDIM; ++i) x[i] ^= t;
  return transpose_to_index<NDIM>(x, order);
}

template <int NDIM>
HL_HD void hilbert_decode(uint64_t h, int order, uint64_t (&x)[NDIM]) {
  index_to_transpose<NDIM>(h, order, x);
  if (order <= 0) return;
  const uint64_t z = 2ull << (order - 1);
  uint64_t t = x[NDIM - 1] >> 1;
#pragma unroll
  for (int i = NDIM - 1; i > 0; --i) x[i] ^= x[i - 1];
  x[0] ^= t;
  for (uint64_t q = 2; q != z; q <<= 1) {
    const uint64_t p = q - 1;
#pragma unroll
    for (int i = NDIM - 1; i >= 0; --i) {
      if (x[i] & q) {
        x[0] ^= p;
      } else {
        uint64_t u = (x[0] ^ x[i]) & p;
        x[0] ^= u;
        x[i] ^= u;
      }
    }
  }
}

template <int NDIM>
HL_HD uint64_t morton_encode(const uint64_t (&x)[NDIM], int order) {
  return transpose_to_index<NDIM>(x, order);
}

template <int NDIM>
HL_HD void morton_decode(uint64_t h, int order, uint64_t (&x)[NDIM]) {
  index_to_transpose<NDIM>(h, order, x);
}

// 2D Morton with magic bits (order <= 16): coordinate 0 on the odd (higher) bit of each pair.
HL_HD uint32_t morton2d_encode16(uint32_t c0, uint32_t c1) {
  return (interleave16(c0) << 1) | interleave16(c1);
}

HL_HD void morton2d_decode16(uint32_t h, uint32_t* c0, uint32_t* c1) {
  *c0 = deinterleave16(h >> 1);
  *c1 = deinterleave16(h);
}

// ---- 2D Hilbert as a 4-state machine over 4-bit chunks (lookup tables built from the above) ----
// enc[state * 256 + (x4 << 4 | y4)] = index chunk (8 bits) | next state << 8;
// dec[state * 256 + chunk] = (x4 << 4 | y4) | next state << 8. The tables cover the 16-bit curve;
// built once on the host from the prefix-scan form (4 states, found by comparing chunk tables).
struct Hilbert2dTables {
  uint16_t enc[1024];
  uint16_t dec[1024];
  int ok;
};

inline int hilbert2d_chunk_signature(uint32_t px, uint32_t py, int level, uint8_t* sig) {
  for (uint32_t x4 = 0; x4 < 16; ++x4)
    for (uint32_t y4 = 0; y4 < 16; ++y4) {
      uint32_t X = (px << (16 - 4 * level)) | (x4 << (12 - 4 * level));
      uint32_t Y = (py << (16 - 4 * level)) | (y4 << (12 - 4 * level));
      sig[x4 * 16 + y4] = (uint8_t)((hilbert2d_xy_to_index(16, X, Y) >> (24 - 8 * level)) & 0xFFu);
    }
  return 0;
}

inline Hilbert2dTables build_hilbert2d_tables() {
  Hilbert2dTables t = {};
  uint8_t sigs[4][256];
  uint32_t rep_x[4], rep_y[4];
  int rep_level[4];
  int num_states = 1;
  hilbert2d_chunk_signature(0, 0, 0, sigs[0]);
  rep_x[0] = rep_y[0] = 0;
  rep_level[0] = 0;
  t.ok = 1;
  for (int s = 0; s < num_states; ++s) {
    if (rep_level[s] > 2) { t.ok = 0; break; }
    for (uint32_t x4 = 0; x4 < 16; ++x4)
      for (uint32_t y4 = 0; y4 < 16; ++y4) {
        uint32_t cx = (rep_x[s] << 4) | x4, cy = (rep_y[s] << 4) | y4;
        uint8_t sig[256];
        hilbert2d_chunk_signature(cx, cy, rep_level[s] + 1, sig);
        int found = -1;
        for (int u = 0; u < num_states; ++u) {
          bool same = true;
          for (int e = 0; e < 256 && same; ++e) same = sigs[u][e] == sig[e];
          if (same) { found = u; break; }
        }
        if (found < 0) {
          if (num_states == 4) { t.ok = 0; return t; }
          found = num_states++;
          for (int e = 0; e < 256; ++e) sigs[found][e] = sig[e];
          rep_x[found] = cx;
          rep_y[found] = cy;
          rep_level[found] = rep_level[s] + 1;
        }
        uint32_t cell = x4 * 16 + y4;
        t.enc[s * 256 + cell] = (uint16_t)(sigs[s][cell] | (found << 8));
        t.dec[s * 256 + sigs[s][cell]] = (uint16_t)(cell | (found << 8));
      }
  }
  return t;
}

// Table-driven versions (same results as hilbert2d_xy_to_index / hilbert2d_index_to_xy): the
// order-n curve is the 16-bit curve read at its top n bits, so ceil(n / 4) chunks from the top.
HL_HD uint32_t hilbert2d_encode_lut(const uint16_t* enc, uint32_t order, uint32_t x, uint32_t y) {
  const uint32_t levels = (order + 3) / 4;
  x <<= 16 - order;
  y <<= 16 - order;
  uint32_t state = 0, h = 0;
  for (uint32_t level = 0; level < levels; ++level) {
    uint32_t shift = 12 - 4 * level;
    uint32_t e = enc[(state << 8) | (((x >> shift) & 15u) << 4) | ((y >> shift) & 15u)];
    h = (h << 8) | (e & 0xFFu);
    state = e >> 8;
  }
  return h >> (8 * levels - 2 * order);
}

HL_HD void hilbert2d_decode_lut(const uint16_t* dec, uint32_t order, uint32_t h, uint32_t* x, uint32_t* y) {
  const uint32_t levels = (order + 3) / 4;
  h <<= 8 * levels - 2 * order;
  uint32_t state = 0, cx = 0, cy = 0;
  for (uint32_t level = 0; level < levels; ++level) {
    uint32_t e = dec[(state << 8) | ((h >> (8 * (levels - 1 - level))) & 0xFFu)];
    cx = (cx << 4) | ((e >> 4) & 15u);
    cy = (cy << 4) | (e & 15u);
    state = e >> 8;
  }
  *x = cx >> (4 * levels - order);
  *y = cy >> (4 * levels - order);
}

}  // namespace hl
