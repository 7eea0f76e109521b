// Python bindings for hilbert_lab's CUDA kernels (built by hilbert_lab/kernels/cuda_build.py).
// Arguments are raw device pointers and a stream handle as integers; the Python wrappers
// (hilbert_lab/kernels/cuda_curves.py) validate tensors and pass data_ptr() values.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

int hl_curve_encode(const void* coords, void* out, int64_t n, int ndim, int order, int curve, int coords_are_int64,
                    int out_is_int64, int method, void* stream_ptr);
int hl_curve_decode(const void* index, void* coords, int64_t n, int ndim, int order, int curve, int index_is_int64,
                    int coords_are_int64, int method, void* stream_ptr);
int hl_curve_launch_config(int items, int threads, int encode_points, int decode_points);
int hl_permute_rows(const void* x, void* out, int64_t batch, int64_t seq_len, int64_t row_bytes, const int64_t* perm,
                    int64_t segment_length, const int64_t* tail_perm, void* stream_ptr);

namespace {

void check(int code, const char* what) {
  if (code == -1) throw std::invalid_argument(std::string(what) + ": unsupported (curve, ndim)");
  if (code != 0) throw std::runtime_error(std::string(what) + " failed with CUDA error " + std::to_string(code));
}

template <typename T>
T* ptr(int64_t address) { return reinterpret_cast<T*>(static_cast<uintptr_t>(address)); }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "hilbert_lab CUDA curve maps and segment permutation (raw-pointer launchers)";
  m.def("curve_encode", [](int64_t coords, int64_t out, int64_t n, int ndim, int order, int curve, bool c64, bool i64,
                           int method, int64_t stream) {
    check(hl_curve_encode(ptr<const void>(coords), ptr<void>(out), n, ndim, order, curve, c64, i64, method,
                          ptr<void>(stream)),
          "curve_encode");
  });
  m.def("curve_decode", [](int64_t index, int64_t coords, int64_t n, int ndim, int order, int curve, bool i64, bool c64,
                           int method, int64_t stream) {
    check(hl_curve_decode(ptr<const void>(index), ptr<void>(coords), n, ndim, order, curve, i64, c64, method,
                          ptr<void>(stream)),
          "curve_decode");
  });
  m.def("curve_launch_config", [](int items, int threads, int encode_points, int decode_points) {
    if (hl_curve_launch_config(items, threads, encode_points, decode_points) != 0)
      throw std::invalid_argument("curve_launch_config: items must be 1, 2, 4 or 8, threads a multiple of 32 in "
                                  "[32, 512], points 2 or 4");
  });
  m.def("permute_rows", [](int64_t x, int64_t out, int64_t batch, int64_t seq_len, int64_t row_bytes, int64_t perm,
                           int64_t segment_length, int64_t tail_perm, int64_t stream) {
    check(hl_permute_rows(ptr<const void>(x), ptr<void>(out), batch, seq_len, row_bytes, ptr<const int64_t>(perm),
                          segment_length, ptr<const int64_t>(tail_perm), ptr<void>(stream)),
          "permute_rows");
  });
}
