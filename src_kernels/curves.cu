// CUDA curve maps: Hilbert / Morton encode and decode for 2D and 3D points (hilbert_lab).
//
// Launchers take raw device pointers and a cudaStream_t (as void*) so that this file needs no
// torch headers; bindings.cpp exposes them to Python. Coordinates are (n, ndim) row-major, int32
// or int64; indices int32 or int64. Every launcher returns the cudaError_t of its launch.
#include <cuda_runtime.h>
#include <stdint.h>

#include "curve_math.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kHilbert = 0;
constexpr int kMorton = 1;

template <typename T>
__device__ __forceinline__ T load_nc(const T* p) { return __ldg(p); }

// Vectorised 2D kernels (int32 in and out): the unit is a pair of points, coords as one int4 and
// indices as one int2. Each thread takes pairs base + lane and base + 32 + lane of a 64-pair warp
// chunk, so every load and store instruction of a warp covers one contiguous span.
#define HL_PAIR_LOOP(...)                                                                   \
  const int lane = threadIdx.x & 31;                                                        \
  const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;                \
  const int64_t num_warps = ((int64_t)gridDim.x * blockDim.x) >> 5;                          \
  for (int64_t base = warp * 64; base < npairs; base += num_warps * 64) {                   \
    const int64_t p0 = base + lane, p1 = base + 32 + lane;                                   \
    if (p0 < npairs) { const int64_t p = p0; __VA_ARGS__ }                                   \
    if (p1 < npairs) { const int64_t p = p1; __VA_ARGS__ }                                   \
  }

template <int CURVE>
__global__ void encode2d_i32x4(const int4* __restrict__ coords, int2* __restrict__ out, int64_t npairs, uint32_t order) {
  HL_PAIR_LOOP({
    int4 a = load_nc(coords + p);
    if (CURVE == kHilbert)
      out[p] = make_int2((int)hl::hilbert2d_xy_to_index(order, (uint32_t)a.x, (uint32_t)a.y),
                         (int)hl::hilbert2d_xy_to_index(order, (uint32_t)a.z, (uint32_t)a.w));
    else
      out[p] = make_int2((int)hl::morton2d_encode16((uint32_t)a.x, (uint32_t)a.y),
                         (int)hl::morton2d_encode16((uint32_t)a.z, (uint32_t)a.w));
  })
}

template <int CURVE>
__global__ void decode2d_i32x4(const int2* __restrict__ index, int4* __restrict__ coords, int64_t npairs, uint32_t order) {
  HL_PAIR_LOOP({
    int2 h = load_nc(index + p);
    uint32_t x0, y0, x1, y1;
    if (CURVE == kHilbert) {
      hl::hilbert2d_index_to_xy(order, (uint32_t)h.x, &x0, &y0);
      hl::hilbert2d_index_to_xy(order, (uint32_t)h.y, &x1, &y1);
    } else {
      hl::morton2d_decode16((uint32_t)h.x, &x0, &y0);
      hl::morton2d_decode16((uint32_t)h.y, &x1, &y1);
    }
    coords[p] = make_int4((int)x0, (int)y0, (int)x1, (int)y1);
  })
}

template <int LEVELS>
__device__ __forceinline__ uint32_t encode_lut(const uint16_t* lut, uint32_t order, uint32_t x, uint32_t y) {
  x <<= 16 - order;
  y <<= 16 - order;
  uint32_t state = 0, h = 0;
#pragma unroll
  for (int level = 0; level < LEVELS; ++level) {
    const int shift = 12 - 4 * level;
    uint32_t e = lut[(state << 8) | (((x >> shift) & 15u) << 4) | ((y >> shift) & 15u)];
    h = (h << 8) | (e & 0xFFu);
    state = e >> 8;
  }
  return h >> (8 * LEVELS - 2 * order);
}

template <int LEVELS>
__device__ __forceinline__ int2 decode_lut(const uint16_t* lut, uint32_t order, uint32_t h) {
  h <<= 8 * LEVELS - 2 * order;
  uint32_t state = 0, cx = 0, cy = 0;
#pragma unroll
  for (int level = 0; level < LEVELS; ++level) {
    uint32_t e = lut[(state << 8) | ((h >> (8 * (LEVELS - 1 - level))) & 0xFFu)];
    cx = (cx << 4) | ((e >> 4) & 15u);
    cy = (cy << 4) | (e & 15u);
    state = e >> 8;
  }
  return make_int2((int)(cx >> (4 * LEVELS - order)), (int)(cy >> (4 * LEVELS - order)));
}

// 2D Hilbert, order <= 15, int32 -> int32, pairs of points as above, 4-bit state machine in shared memory.
template <int LEVELS>
__global__ void hilbert_encode2d_lut_x4(const int4* __restrict__ coords, int2* __restrict__ out, int64_t npairs,
                                        uint32_t order, const uint16_t* __restrict__ table) {
  __shared__ uint16_t lut[1024];
  for (int i = threadIdx.x; i < 1024; i += blockDim.x) lut[i] = table[i];
  __syncthreads();
  HL_PAIR_LOOP({
    int4 a = load_nc(coords + p);
    out[p] = make_int2((int)encode_lut<LEVELS>(lut, order, (uint32_t)a.x, (uint32_t)a.y),
                       (int)encode_lut<LEVELS>(lut, order, (uint32_t)a.z, (uint32_t)a.w));
  })
}

template <int LEVELS>
__global__ void hilbert_decode2d_lut_x4(const int2* __restrict__ index, int4* __restrict__ coords, int64_t npairs,
                                        uint32_t order, const uint16_t* __restrict__ table) {
  __shared__ uint16_t lut[1024];
  for (int i = threadIdx.x; i < 1024; i += blockDim.x) lut[i] = table[i];
  __syncthreads();
  HL_PAIR_LOOP({
    int2 h = load_nc(index + p);
    int2 a = decode_lut<LEVELS>(lut, order, (uint32_t)h.x);
    int2 b = decode_lut<LEVELS>(lut, order, (uint32_t)h.y);
    coords[p] = make_int4(a.x, a.y, b.x, b.y);
  })
}

// Any supported case, one point per thread.
template <int NDIM, int CURVE, typename CT, typename IT>
__global__ void encode_generic(const CT* __restrict__ coords, IT* __restrict__ out, int64_t n, int order) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    uint64_t x[NDIM];
#pragma unroll
    for (int d = 0; d < NDIM; ++d) x[d] = (uint64_t)coords[i * NDIM + d];
    uint64_t h;
    if (CURVE == kHilbert) {
      if (NDIM == 2 && order <= 16)
        h = hl::hilbert2d_xy_to_index((uint32_t)order, (uint32_t)x[0], (uint32_t)x[NDIM - 1]);
      else
        h = hl::hilbert_encode<NDIM>(x, order);
    } else {
      h = hl::morton_encode<NDIM>(x, order);
    }
    out[i] = (IT)h;
  }
}

template <int NDIM, int CURVE, typename IT, typename CT>
__global__ void decode_generic(const IT* __restrict__ index, CT* __restrict__ coords, int64_t n, int order) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    uint64_t h = (uint64_t)index[i];
    uint64_t x[NDIM];
    if (CURVE == kHilbert) {
      if (NDIM == 2 && order <= 16) {
        uint32_t a, b;
        hl::hilbert2d_index_to_xy((uint32_t)order, (uint32_t)h, &a, &b);
        x[0] = a;
        x[NDIM - 1] = b;
      } else {
        hl::hilbert_decode<NDIM>(h, order, x);
      }
    } else {
      hl::morton_decode<NDIM>(h, order, x);
    }
#pragma unroll
    for (int d = 0; d < NDIM; ++d) coords[i * NDIM + d] = (CT)x[d];
  }
}

int grid_for(int64_t work) {
  int dev = 0, sms = 132;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  int64_t blocks = (work + kThreads - 1) / kThreads;
  int64_t cap = (int64_t)sms * 32;  // grid-stride beyond 32 blocks per SM
  if (blocks > cap) blocks = cap;
  return (int)(blocks < 1 ? 1 : blocks);
}

template <int NDIM, int CURVE, typename CT, typename IT>
void launch_encode(const void* coords, void* out, int64_t n, int order, cudaStream_t stream) {
  encode_generic<NDIM, CURVE, CT, IT><<<grid_for(n), kThreads, 0, stream>>>(
      static_cast<const CT*>(coords), static_cast<IT*>(out), n, order);
}

template <int NDIM, int CURVE, typename IT, typename CT>
void launch_decode(const void* index, void* coords, int64_t n, int order, cudaStream_t stream) {
  decode_generic<NDIM, CURVE, IT, CT><<<grid_for(n), kThreads, 0, stream>>>(
      static_cast<const IT*>(index), static_cast<CT*>(coords), n, order);
}

template <int NDIM, int CURVE>
void dispatch_encode(const void* coords, void* out, int64_t n, int order, bool c64, bool i64, cudaStream_t s) {
  if (c64 && i64) launch_encode<NDIM, CURVE, int64_t, int64_t>(coords, out, n, order, s);
  else if (c64) launch_encode<NDIM, CURVE, int64_t, int32_t>(coords, out, n, order, s);
  else if (i64) launch_encode<NDIM, CURVE, int32_t, int64_t>(coords, out, n, order, s);
  else launch_encode<NDIM, CURVE, int32_t, int32_t>(coords, out, n, order, s);
}

template <int NDIM, int CURVE>
void dispatch_decode(const void* index, void* coords, int64_t n, int order, bool i64, bool c64, cudaStream_t s) {
  if (i64 && c64) launch_decode<NDIM, CURVE, int64_t, int64_t>(index, coords, n, order, s);
  else if (i64) launch_decode<NDIM, CURVE, int64_t, int32_t>(index, coords, n, order, s);
  else if (c64) launch_decode<NDIM, CURVE, int32_t, int64_t>(index, coords, n, order, s);
  else launch_decode<NDIM, CURVE, int32_t, int32_t>(index, coords, n, order, s);
}

// Device copies of the 2D Hilbert state-machine tables, built once per device (host code).
const uint16_t* hilbert2d_device_table(bool decode) {
  static uint16_t* tables[64][2] = {};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64) return nullptr;
  if (tables[dev][0] == nullptr) {
    static const hl::Hilbert2dTables host = hl::build_hilbert2d_tables();
    if (!host.ok) return nullptr;
    uint16_t* buffer = nullptr;
    if (cudaMalloc(&buffer, 2 * 1024 * sizeof(uint16_t)) != cudaSuccess) return nullptr;
    cudaMemcpy(buffer, host.enc, sizeof(host.enc), cudaMemcpyHostToDevice);
    cudaMemcpy(buffer + 1024, host.dec, sizeof(host.dec), cudaMemcpyHostToDevice);
    tables[dev][0] = buffer;
    tables[dev][1] = buffer + 1024;
  }
  return tables[dev][decode ? 1 : 0];
}

int lut_grid(int64_t work) {
  int dev = 0, sms = 132;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  int64_t blocks = (work + kThreads - 1) / kThreads;
  int64_t cap = (int64_t)sms * 8;  // persistent-ish: the table is loaded once per block
  return (int)(blocks < 1 ? 1 : (blocks > cap ? cap : blocks));
}

bool launch_hilbert2d_lut(bool decode, const void* in, void* out, int64_t npairs, uint32_t order, cudaStream_t s) {
  const uint16_t* table = hilbert2d_device_table(decode);
  if (table == nullptr) return false;
  const int levels = (int)(order + 3) / 4;
  const int grid = lut_grid((npairs + 1) / 2);
#define HL_LUT_CASE(L)                                                                                          \
  case L:                                                                                                     \
    if (decode)                                                                                               \
      hilbert_decode2d_lut_x4<L><<<grid, kThreads, 0, s>>>(static_cast<const int2*>(in), static_cast<int4*>(out), \
                                                           npairs, order, table);                              \
    else                                                                                                      \
      hilbert_encode2d_lut_x4<L><<<grid, kThreads, 0, s>>>(static_cast<const int4*>(in), static_cast<int2*>(out), \
                                                           npairs, order, table);                              \
    return true;
  switch (levels) {
    HL_LUT_CASE(1)
    HL_LUT_CASE(2)
    HL_LUT_CASE(3)
    HL_LUT_CASE(4)
    default:
      return false;
  }
#undef HL_LUT_CASE
}

}  // namespace

// curve: 0 = hilbert, 1 = morton; ndim: 2 or 3; order: bits per axis (ndim * order <= 63).
// Returns 0 on success, -1 for an unsupported (curve, ndim), else the CUDA error code.
// method: 0 = default (state-machine table for 2D Hilbert), 1 = branch-free prefix-scan form.
int hl_curve_encode(const void* coords, void* out, int64_t n, int ndim, int order, int curve,
                    int coords_are_int64, int out_is_int64, int method, void* stream_ptr) {
  cudaStream_t s = static_cast<cudaStream_t>(stream_ptr);
  if (n == 0) return 0;
  const bool c64 = coords_are_int64 != 0, i64 = out_is_int64 != 0;
  const bool vec = ndim == 2 && order <= 15 && !c64 && !i64 && n % 2 == 0 &&
                   (reinterpret_cast<uintptr_t>(coords) % 16 == 0) && (reinterpret_cast<uintptr_t>(out) % 8 == 0);
  if (vec) {
    const int64_t npairs = n / 2;
    if (curve == kHilbert && method == 0 && launch_hilbert2d_lut(false, coords, out, npairs, (uint32_t)order, s))
      return (int)cudaGetLastError();
    const int grid = grid_for((npairs + 1) / 2);
    if (curve == kHilbert)
      encode2d_i32x4<kHilbert><<<grid, kThreads, 0, s>>>(static_cast<const int4*>(coords), static_cast<int2*>(out), npairs, (uint32_t)order);
    else
      encode2d_i32x4<kMorton><<<grid, kThreads, 0, s>>>(static_cast<const int4*>(coords), static_cast<int2*>(out), npairs, (uint32_t)order);
  } else if (ndim == 2 && curve == kHilbert) {
    dispatch_encode<2, kHilbert>(coords, out, n, order, c64, i64, s);
  } else if (ndim == 2 && curve == kMorton) {
    dispatch_encode<2, kMorton>(coords, out, n, order, c64, i64, s);
  } else if (ndim == 3 && curve == kHilbert) {
    dispatch_encode<3, kHilbert>(coords, out, n, order, c64, i64, s);
  } else if (ndim == 3 && curve == kMorton) {
    dispatch_encode<3, kMorton>(coords, out, n, order, c64, i64, s);
  } else {
    return -1;
  }
  return (int)cudaGetLastError();
}

int hl_curve_decode(const void* index, void* coords, int64_t n, int ndim, int order, int curve,
                    int index_is_int64, int coords_are_int64, int method, void* stream_ptr) {
  cudaStream_t s = static_cast<cudaStream_t>(stream_ptr);
  if (n == 0) return 0;
  const bool i64 = index_is_int64 != 0, c64 = coords_are_int64 != 0;
  const bool vec = ndim == 2 && order <= 15 && !c64 && !i64 && n % 2 == 0 &&
                   (reinterpret_cast<uintptr_t>(coords) % 16 == 0) && (reinterpret_cast<uintptr_t>(index) % 8 == 0);
  if (vec) {
    const int64_t npairs = n / 2;
    if (curve == kHilbert && method == 0 && launch_hilbert2d_lut(true, index, coords, npairs, (uint32_t)order, s))
      return (int)cudaGetLastError();
    const int grid = grid_for((npairs + 1) / 2);
    if (curve == kHilbert)
      decode2d_i32x4<kHilbert><<<grid, kThreads, 0, s>>>(static_cast<const int2*>(index), static_cast<int4*>(coords), npairs, (uint32_t)order);
    else
      decode2d_i32x4<kMorton><<<grid, kThreads, 0, s>>>(static_cast<const int2*>(index), static_cast<int4*>(coords), npairs, (uint32_t)order);
  } else if (ndim == 2 && curve == kHilbert) {
    dispatch_decode<2, kHilbert>(index, coords, n, order, i64, c64, s);
  } else if (ndim == 2 && curve == kMorton) {
    dispatch_decode<2, kMorton>(index, coords, n, order, i64, c64, s);
  } else if (ndim == 3 && curve == kHilbert) {
    dispatch_decode<3, kHilbert>(index, coords, n, order, i64, c64, s);
  } else if (ndim == 3 && curve == kMorton) {
    dispatch_decode<3, kMorton>(index, coords, n, order, i64, c64, s);
  } else {
    return -1;
  }
  return (int)cudaGetLastError();
}
