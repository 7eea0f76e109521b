// Per-segment token permutation of (B, N, H, D) tensors: out[b, n] = x[b, source(n)] (hilbert_lab).
//
// Rows (one token: H * D elements) are copied with 16-byte vectors when the row size and the
// pointers allow, else with 4-byte or 1-byte words. source(n) = s * L + perm[n - s * L] for the
// full segments (s = n / L) and S * L + tail_perm[n - S * L] in a shorter last segment.
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;

template <typename V>
__global__ void permute_rows(const V* __restrict__ x, V* __restrict__ out, int64_t batch, int64_t seq_len,
                             int64_t vecs_per_row, const int64_t* __restrict__ perm, int64_t segment_length,
                             const int64_t* __restrict__ tail_perm) {
  const int64_t full_tokens = (seq_len / segment_length) * segment_length;
  const int64_t total = batch * seq_len * vecs_per_row;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
    const int64_t row = t / vecs_per_row;
    const int64_t col = t - row * vecs_per_row;
    const int64_t b = row / seq_len;
    const int64_t n = row - b * seq_len;
    int64_t src;
    if (n < full_tokens) {
      const int64_t s = n / segment_length;
      src = s * segment_length + __ldg(perm + (n - s * segment_length));
    } else {
      src = full_tokens + __ldg(tail_perm + (n - full_tokens));
    }
    out[t] = __ldg(x + (b * seq_len + src) * vecs_per_row + col);
  }
}

template <typename V>
void launch(const void* x, void* out, int64_t batch, int64_t seq_len, int64_t row_bytes, const int64_t* perm,
            int64_t segment_length, const int64_t* tail_perm, cudaStream_t stream) {
  const int64_t vecs = row_bytes / (int64_t)sizeof(V);
  const int64_t total = batch * seq_len * vecs;
  int dev = 0, sms = 132;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  int64_t blocks = (total + kThreads - 1) / kThreads;
  const int64_t cap = (int64_t)sms * 16;
  if (blocks > cap) blocks = cap;
  if (blocks < 1) blocks = 1;
  permute_rows<V><<<(int)blocks, kThreads, 0, stream>>>(static_cast<const V*>(x), static_cast<V*>(out), batch, seq_len,
                                                        vecs, perm, segment_length, tail_perm);
}

}  // namespace

// Returns 0 on success, else the CUDA error code of the launch.
int hl_permute_rows(const void* x, void* out, int64_t batch, int64_t seq_len, int64_t row_bytes, const int64_t* perm,
                    int64_t segment_length, const int64_t* tail_perm, void* stream_ptr) {
  cudaStream_t s = static_cast<cudaStream_t>(stream_ptr);
  if (batch * seq_len * row_bytes == 0) return 0;
  const uintptr_t align = reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(out) | (uintptr_t)row_bytes;
  if (align % 16 == 0)
    launch<int4>(x, out, batch, seq_len, row_bytes, perm, segment_length, tail_perm, s);
  else if (align % 4 == 0)
    launch<int>(x, out, batch, seq_len, row_bytes, perm, segment_length, tail_perm, s);
  else
    launch<unsigned char>(x, out, batch, seq_len, row_bytes, perm, segment_length, tail_perm, s);
  return (int)cudaGetLastError();
}
