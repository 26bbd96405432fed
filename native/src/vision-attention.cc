// VisionAttention where the build has no CUDA: built() is false and nothing can be made. The real
// one is vision-attention.cu.
#include "vision-attention.h"

#ifndef PERCEPT_CUDA_KERNELS

#include <stdexcept>

namespace percept {

struct VisionAttention::Impl {};

bool VisionAttention::built() { return false; }

VisionAttention::VisionAttention(int32_t) { throw std::runtime_error("this build has no CUDA attention kernel"); }

VisionAttention::~VisionAttention() = default;

void VisionAttention::run(const DeviceTensorView &, const DeviceTensorView &, const DeviceTensorView &, float, float *,
                          const AttentionPrologue *) {
    throw std::runtime_error("no CUDA attention kernel");
}

void VisionAttention::enqueue(const DeviceTensorView &, const DeviceTensorView &, const DeviceTensorView &, float, float *,
                              const AttentionPrologue *, void *, void *) {
    throw std::runtime_error("no CUDA attention kernel");
}

}  // namespace percept

#endif
