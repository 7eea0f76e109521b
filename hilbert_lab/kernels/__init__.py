"""Leaf kernels on plain ints, arrays and tensors: Numba CPU curve maps (hilbert_numba, morton_numba,
gilbert_numba), CUDA curve maps and segment permutation (cuda_build + cuda_curves, sources in
src_kernels/), fused Triton dilated attention (triton_dilated), the Triton decoding step (triton_decode),
many small attention problems in one launch (triton_small_blocks), listed rows of a share added into a strided
total (triton_rows), calls into a compiled-kernel library replayed from a record (recorded_launches).
Submodules are imported on demand; none imports anything from hilbert_lab outside kernels (triton_support: the
optional Triton import the Triton modules share)."""
