// Attention for the vision graph on CUDA, in place of ggml-cuda's flash attention.
// It computes softmax(scale·q·kᵀ)·v per head over every patch of an image, without a mask.
// It is a FlashAttention-2 forward for exactly the towers' shapes.
// Built with CUDA (PERCEPT_CUDA_KERNELS); elsewhere built() is false and the constructor throws.
// Why and how: native/README.md#vision-attention
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

// What gemma4v does to each head between its projections and attention, done in the kernel's packing step.
// That is one pass over q, k and v, instead of five ggml kernels a layer that each run one 64-value row per block.
// Each head's values are RMS-normalized per operand (q, k, v), times a per-column weight where one is given.
// The weight is f32, on the device.
// Then q and k get the 2-D RoPE of heads ordered for one vision rope (RopeOrderedHeads, vision-graph.h).
// Pairs are (i, i + d/2), rotated by the patch's column for i < d/4 and by its row after.
// The j-th pair of each part turns at theta ropeTheta^(−4j/d).
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

    // ggml_flash_attn_ext's operands without a mask, at any strides. q is [d, positions, heads, images].
    // k and v are [d, keys, kvHeads, images], with heads a multiple of kvHeads.
    // out receives [d, heads, positions, images] f32, contiguous, as flash_attn_ext's result. Waits for the kernel.
    // Throws std::invalid_argument for shapes it does not take, std::runtime_error for CUDA errors.
    // `prologue` (may be null) is applied to q, k and v first.
    void run(const DeviceTensorView & q, const DeviceTensorView & k, const DeviceTensorView & v, float scale, float * out,
             const AttentionPrologue * prologue = nullptr);
    // The same without waiting. The kernel's stream first waits for CUDA event `after`, recorded where q, k and v are computed.
    // It records `done` when out is written. Both are cudaEvent_t.
    void enqueue(const DeviceTensorView & q, const DeviceTensorView & k, const DeviceTensorView & v, float scale, float * out,
                 const AttentionPrologue * prologue, void * after, void * done);

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace percept
