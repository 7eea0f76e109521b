// Host-side check of src_kernels/curve_math.cuh (built by tests/kernels/test_cuda_sources.py with
// nvcc, run on the CPU): reads "op curve ndim order count" and count rows from stdin, prints results.
// op: E (encode, fast 2D path when possible), G (encode, generic Skilling path), D (decode, fast),
// H (decode, generic), T (2D Hilbert encode by the state-machine tables), U (their decode).
// curve: 0 hilbert, 1 morton.
#include <cstdio>
#include <cstdint>

#include "curve_math.cuh"

static const hl::Hilbert2dTables kTables = hl::build_hilbert2d_tables();

template <int NDIM>
void run(char op, int curve, int order, long count) {
  for (long k = 0; k < count; ++k) {
    uint64_t x[NDIM];
    if (op == 'T') {
      unsigned long long a, b;
      if (scanf("%llu %llu", &a, &b) != 2) return;
      printf("%u\n", kTables.ok ? hl::hilbert2d_encode_lut(kTables.enc, order, (uint32_t)a, (uint32_t)b) : 0xFFFFFFFFu);
      continue;
    }
    if (op == 'U') {
      unsigned long long h;
      if (scanf("%llu", &h) != 1) return;
      uint32_t a = 0, b = 0;
      if (kTables.ok) hl::hilbert2d_decode_lut(kTables.dec, order, (uint32_t)h, &a, &b);
      printf("%u %u\n", a, b);
      continue;
    }
    if (op == 'E' || op == 'G') {
      for (int d = 0; d < NDIM; ++d) {
        unsigned long long v;
        if (scanf("%llu", &v) != 1) return;
        x[d] = v;
      }
      uint64_t h;
      if (curve == 1) h = (NDIM == 2 && op == 'E' && order <= 16) ? hl::morton2d_encode16((uint32_t)x[0], (uint32_t)x[NDIM - 1])
                                                                   : hl::morton_encode<NDIM>(x, order);
      else if (NDIM == 2 && op == 'E' && order <= 16) h = hl::hilbert2d_xy_to_index(order, (uint32_t)x[0], (uint32_t)x[NDIM - 1]);
      else h = hl::hilbert_encode<NDIM>(x, order);
      printf("%llu\n", (unsigned long long)h);
    } else {
      unsigned long long h;
      if (scanf("%llu", &h) != 1) return;
      if (NDIM == 2 && op == 'D' && order <= 16) {
        uint32_t a, b;
        if (curve == 1) hl::morton2d_decode16((uint32_t)h, &a, &b);
        else hl::hilbert2d_index_to_xy(order, (uint32_t)h, &a, &b);
        x[0] = a;
        x[NDIM - 1] = b;
      } else if (curve == 1) {
        hl::morton_decode<NDIM>(h, order, x);
      } else {
        hl::hilbert_decode<NDIM>(h, order, x);
      }
      for (int d = 0; d < NDIM; ++d) printf(d + 1 < NDIM ? "%llu " : "%llu\n", (unsigned long long)x[d]);
    }
  }
}

int main() {
  char op;
  int curve, ndim, order;
  long count;
  while (scanf(" %c %d %d %d %ld", &op, &curve, &ndim, &order, &count) == 5) {
    if (ndim == 2) run<2>(op, curve, order, count);
    else if (ndim == 3) run<3>(op, curve, order, count);
    else return 2;
  }
  return 0;
}
