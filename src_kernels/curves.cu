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

// Vectorised 2D kernels (int32 in and out). The unit is a pair of points: coordinates as one int4
// (x0, y0, x1, y1), indices as one int2 (or two pairs: Quad below). Each thread takes ITEMS units,
// block-strided so that every load and store instruction of a warp covers one contiguous span, and
// issues all its loads before any arithmetic, then loads the state-machine table into shared memory
// while they are in flight. An Op maps one In vector to one Out vector; kTable says whether it reads
// the shared table.
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

template <int LEVELS>
struct HilbertEncodeTable {
  using In = int4;
  using Out = int2;
  static constexpr bool kTable = true;
  static __device__ __forceinline__ Out apply(In a, const uint16_t* lut, uint32_t order) {
    return make_int2((int)encode_lut<LEVELS>(lut, order, (uint32_t)a.x, (uint32_t)a.y),
                     (int)encode_lut<LEVELS>(lut, order, (uint32_t)a.z, (uint32_t)a.w));
  }
};

template <int LEVELS>
struct HilbertDecodeTable {
  using In = int2;
  using Out = int4;
  static constexpr bool kTable = true;
  static __device__ __forceinline__ Out apply(In h, const uint16_t* lut, uint32_t order) {
    int2 a = decode_lut<LEVELS>(lut, order, (uint32_t)h.x);
    int2 b = decode_lut<LEVELS>(lut, order, (uint32_t)h.y);
    return make_int4(a.x, a.y, b.x, b.y);
  }
};

template <int CURVE>
struct Encode2d {  // branch-free forms: Hilbert prefix scan ("bitscan") or Morton interleave
  using In = int4;
  using Out = int2;
  static constexpr bool kTable = false;
  static __device__ __forceinline__ Out apply(In a, const uint16_t*, uint32_t order) {
    if (CURVE == kHilbert)
      return make_int2((int)hl::hilbert2d_xy_to_index(order, (uint32_t)a.x, (uint32_t)a.y),
                       (int)hl::hilbert2d_xy_to_index(order, (uint32_t)a.z, (uint32_t)a.w));
    return make_int2((int)hl::morton2d_encode16((uint32_t)a.x, (uint32_t)a.y),
                     (int)hl::morton2d_encode16((uint32_t)a.z, (uint32_t)a.w));
  }
};

template <int CURVE>
struct Decode2d {
  using In = int2;
  using Out = int4;
  static constexpr bool kTable = false;
  static __device__ __forceinline__ Out apply(In h, const uint16_t*, uint32_t order) {
    uint32_t x0, y0, x1, y1;
    if (CURVE == kHilbert) {
      hl::hilbert2d_index_to_xy(order, (uint32_t)h.x, &x0, &y0);
      hl::hilbert2d_index_to_xy(order, (uint32_t)h.y, &x1, &y1);
    } else {
      hl::morton2d_decode16((uint32_t)h.x, &x0, &y0);
      hl::morton2d_decode16((uint32_t)h.y, &x1, &y1);
    }
    return make_int4((int)x0, (int)y0, (int)x1, (int)y1);
  }
};

// Two vectors side by side: a thread maps 4 points at a time (2 pairs), so encode stores one 16-byte
// index vector and decode loads one.
template <class V>
struct alignas(2 * sizeof(V)) Twice {
  V a, b;
};

__device__ __forceinline__ int2 load_vec(const int2* p) { return __ldg(p); }
__device__ __forceinline__ int4 load_vec(const int4* p) { return __ldg(p); }
__device__ __forceinline__ Twice<int2> load_vec(const Twice<int2>* p) {
  const int4 v = __ldg(reinterpret_cast<const int4*>(p));
  return {make_int2(v.x, v.y), make_int2(v.z, v.w)};
}
__device__ __forceinline__ Twice<int4> load_vec(const Twice<int4>* p) {
  const int4* q = reinterpret_cast<const int4*>(p);
  return {__ldg(q), __ldg(q + 1)};
}
__device__ __forceinline__ void store_vec(int2* p, int2 v) { *p = v; }
__device__ __forceinline__ void store_vec(int4* p, int4 v) { *p = v; }
__device__ __forceinline__ void store_vec(Twice<int2>* p, Twice<int2> v) {
  *reinterpret_cast<int4*>(p) = make_int4(v.a.x, v.a.y, v.b.x, v.b.y);
}
__device__ __forceinline__ void store_vec(Twice<int4>* p, Twice<int4> v) {
  int4* q = reinterpret_cast<int4*>(p);
  q[0] = v.a;
  q[1] = v.b;
}

template <class Op>
struct Quad {  // Op on two consecutive pairs
  using In = Twice<typename Op::In>;
  using Out = Twice<typename Op::Out>;
  static constexpr bool kTable = Op::kTable;
  static __device__ __forceinline__ Out apply(In v, const uint16_t* lut, uint32_t order) {
    return {Op::apply(v.a, lut, order), Op::apply(v.b, lut, order)};
  }
};

template <class Op, int ITEMS>
__global__ void __launch_bounds__(512) map_pairs(const typename Op::In* __restrict__ in, typename Op::Out* __restrict__ out,
                                                 int64_t count, uint32_t order, const uint16_t* __restrict__ table) {
  __shared__ __align__(16) uint16_t lut[Op::kTable ? 1024 : 8];
  const int64_t base = (int64_t)blockIdx.x * blockDim.x * ITEMS + threadIdx.x;
  typename Op::In v[ITEMS];
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int64_t p = base + (int64_t)k * blockDim.x;
    if (p < count) v[k] = load_vec(in + p);
  }
  if (Op::kTable) {  // 2 KiB table, 16 bytes per thread, while the loads above are in flight
    for (int i = threadIdx.x; i < 128; i += blockDim.x)
      reinterpret_cast<uint4*>(lut)[i] = __ldg(reinterpret_cast<const uint4*>(table) + i);
    __syncthreads();
  }
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int64_t p = base + (int64_t)k * blockDim.x;
    if (p < count) store_vec(out + p, Op::apply(v[k], lut, order));
  }
}

// Launch configuration of map_pairs (benchmarks may change it through hl_curve_launch_config):
// vectors per thread, threads per block, and points per vector (2: pairs, 4: two pairs) to encode and
// to decode. Defaults: the fastest measured on an H100 (reports/results/gpu_curves.json, launch_sweep):
// encode stores 16-byte index vectors (4 points), decode stays on pairs (its 4-point form writes 32
// bytes per thread per vector and ran 7-15% slower).
int g_items = 4;
int g_threads = 256;
int g_encode_points = 4;
int g_decode_points = 2;

template <class Op, int ITEMS>
void launch_as(const void* in, void* out, int64_t count, uint32_t order, const uint16_t* table, cudaStream_t s) {
  const int64_t per_block = (int64_t)g_threads * ITEMS;
  const int64_t blocks = (count + per_block - 1) / per_block;
  map_pairs<Op, ITEMS><<<(unsigned)blocks, g_threads, 0, s>>>(
      static_cast<const typename Op::In*>(in), static_cast<typename Op::Out*>(out), count, order, table);
}

template <class Op>
void launch_items(const void* in, void* out, int64_t count, uint32_t order, const uint16_t* table, cudaStream_t s) {
  switch (g_items) {
    case 1: launch_as<Op, 1>(in, out, count, order, table, s); break;
    case 2: launch_as<Op, 2>(in, out, count, order, table, s); break;
    case 8: launch_as<Op, 8>(in, out, count, order, table, s); break;
    default: launch_as<Op, 4>(in, out, count, order, table, s); break;
  }
}

// npairs pairs of points; four points per vector when configured and the pair count and the
// pointers allow it (16-byte aligned), else two.
template <class Op>
void launch_pairs(const void* in, void* out, int64_t npairs, uint32_t order, const uint16_t* table, cudaStream_t s) {
  const int points = sizeof(typename Op::In) > sizeof(typename Op::Out) ? g_encode_points : g_decode_points;
  const bool quads = points == 4 && npairs % 2 == 0 && reinterpret_cast<uintptr_t>(in) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (quads) launch_items<Quad<Op>>(in, out, npairs / 2, order, table, s);
  else launch_items<Op>(in, out, npairs, order, table, s);
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

bool launch_hilbert2d_lut(bool decode, const void* in, void* out, int64_t npairs, uint32_t order, cudaStream_t s) {
  const uint16_t* table = hilbert2d_device_table(decode);
  if (table == nullptr) return false;
  const int levels = (int)(order + 3) / 4;
#define HL_LUT_CASE(L)                                                                     \
  case L:                                                                                \
    if (decode) launch_pairs<HilbertDecodeTable<L>>(in, out, npairs, order, table, s);   \
    else launch_pairs<HilbertEncodeTable<L>>(in, out, npairs, order, table, s);          \
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
    if (curve == kHilbert) launch_pairs<Encode2d<kHilbert>>(coords, out, npairs, (uint32_t)order, nullptr, s);
    else launch_pairs<Encode2d<kMorton>>(coords, out, npairs, (uint32_t)order, nullptr, s);
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
    if (curve == kHilbert) launch_pairs<Decode2d<kHilbert>>(index, coords, npairs, (uint32_t)order, nullptr, s);
    else launch_pairs<Decode2d<kMorton>>(index, coords, npairs, (uint32_t)order, nullptr, s);
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

// Launch configuration of the vectorised 2D kernels: items (vectors per thread: 1, 2, 4, 8), threads
// per block (32..512, a multiple of 32), points per vector to encode and to decode (2 or 4). Returns 0,
// or -1 (unchanged) for values outside those sets.
int hl_curve_launch_config(int items, int threads, int encode_points, int decode_points) {
  if (!(items == 1 || items == 2 || items == 4 || items == 8) || threads < 32 || threads > 512 || threads % 32 ||
      !(encode_points == 2 || encode_points == 4) || !(decode_points == 2 || decode_points == 4))
    return -1;
  g_items = items;
  g_threads = threads;
  g_encode_points = encode_points;
  g_decode_points = decode_points;
  return 0;
}
