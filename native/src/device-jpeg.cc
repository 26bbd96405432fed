// DeviceJpeg where the build has no nvJPEG (CPU builds, or a CUDA toolkit without it): built() is
// false and nothing can be made. The real one is device-jpeg.cu.
#include "device-jpeg.h"

#ifndef PERCEPT_NVJPEG

#include <stdexcept>

namespace percept {

struct DeviceJpeg::Impl {};

bool DeviceJpeg::built() { return false; }

DeviceJpeg::DeviceJpeg(int32_t) { throw std::runtime_error("this build has no GPU JPEG decoder (CUDA with nvJPEG)"); }

DeviceJpeg::~DeviceJpeg() = default;

void DeviceJpeg::decode(const uint8_t *, size_t, int32_t &, int32_t &) { throw std::runtime_error("no GPU JPEG decoder"); }

void DeviceJpeg::layout(float *, const DeviceJpegPlan &) { throw std::runtime_error("no GPU JPEG decoder"); }

void DeviceJpeg::layoutToHost(float *, const DeviceJpegPlan &) { throw std::runtime_error("no GPU JPEG decoder"); }

}  // namespace percept

#endif
