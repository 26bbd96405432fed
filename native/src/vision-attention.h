// Attention for the vision graph on CUDA, in place of ggml-cuda's flash attention: softmax(scale·q·kᵀ)·v
// per head over every patch of an image, without a mask (a vision tower attends everywhere). ggml-cuda's
// kernel reaches ~76 TFLOPS on an H200 at the towers' shapes (2–4k positions, head size 64–80), 30 of
// SigLIP so400m's 53 ms; this one is a FlashAttention-2 forward (tensor-core mma.sync, K/V tiles double
// buffered in shared memory through cp.async, online softmax in registers) for exactly that case: a
// so400m layer (4096 patches, 16 heads of 72) took 0.41 ms on an H200, timed alone with an earlier
// (element-wise) packing step (~190 TFLOPS; PyTorch's SDPA on the same GPU: 0.21 ms).
// Built with CUDA (PERCEPT_CUDA_KERNELS); elsewhere built() is false and the constructor throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace percept {

// A tensor on the device as ggml describes it: f32 or f16 elements, sizes and byte strides.
struct DeviceTensorView {
    const void * data = nullptr;
    bool f16 = false;
    int64_t ne[4] = {0, 0, 0, 0};
    size_t nb[4] = {0, 0, 0, 0};
};

// What gemma4v does to each head between its projections and attention, done by the kernel's packing
// step instead of by graph nodes (one pass over q, k and v instead of five ggml kernels a layer that run
// one 64-value row per block): RMS normalization of each head's values (per operand, q k v), times a
// per-column weight where one is given (f32, on the device), then on q and k the 2-D RoPE of heads
// ordered for one vision rope (RopeOrderedHeads, vision-graph.h): pairs (i, i + d/2), rotated by the
// patch's column for i < d/4 and by its row after, at theta ropeTheta^(−4j/d) for the j-th pair of
// each part.
struct AttentionPrologue {
    bool norm[3] = {false, false, false};
    const float * weight[3] = {nullptr, nullptr, nullptr};
    float eps = 0;
    const int32_t * positions = nullptr;  // device: the column of every position, then the row of every one; null: no RoPE
    float ropeTheta = 0;
};

class VisionAttention {
public:
    // Whether this build has the kernel.
    static bool built();
    // The largest head size the kernel takes (heads are zero-padded to a multiple of 16 inside it).
    static constexpr int64_t maxHead = 128;
    // On CUDA device `device` (ggml-cuda's index); throws where not built.
    explicit VisionAttention(int32_t device);
    ~VisionAttention();
    VisionAttention(const VisionAttention &) = delete;
    VisionAttention & operator=(const VisionAttention &) = delete;

    // ggml_flash_attn_ext's operands without a mask: q [d, positions, heads, images], k and v
    // [d, keys, kvHeads, images] (heads a multiple of kvHeads), any strides; out receives
    // [d, heads, positions, images] f32, contiguous, as flash_attn_ext's result. Waits for the kernel.
    // Throws std::invalid_argument for shapes it does not take, std::runtime_error for CUDA errors.
    // `prologue` (may be null) is applied to q, k and v first.
    void run(const DeviceTensorView & q, const DeviceTensorView & k, const DeviceTensorView & v, float scale, float * out,
             const AttentionPrologue * prologue = nullptr);
    // The same without waiting: the kernel's stream first waits for CUDA event `after` (a cudaEvent_t,
    // recorded where q, k and v are computed), and records `done` (a cudaEvent_t) when out is written.
    void enqueue(const DeviceTensorView & q, const DeviceTensorView & k, const DeviceTensorView & v, float scale, float * out,
                 const AttentionPrologue * prologue, void * after, void * done);

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace percept
