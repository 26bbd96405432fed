// JPEG frames decoded and laid out on the GPU for the vision graph, with nvJPEG and two kernels.
// The pixels are those PIL and libvips decode, and they never touch the host.
// Built with CUDA where the toolkit has nvJPEG (PERCEPT_NVJPEG); elsewhere built() is false and the constructor throws.
// Steps: native/README.md#device-jpeg
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace percept {

// How the decoded image becomes the encoder's input (the host layout pass's options, pixels.cc).
struct DeviceJpegPlan {
    int32_t width = 0, height = 0;  // the encoder's input size, display-oriented
    bool patches = false;           // 16×16 HWC patches in row-major order (Gemma 4), else planar CHW
    int32_t patch = 16;
    bool cubic = false;           // bicubic (a = −0.5), else bilinear
    int32_t orientation = 1;      // EXIF 1–8
    float scale = 1, offset = 0;  // value = (v/255 − offset)/scale
};

class DeviceJpeg {
public:
    // Whether this build has nvJPEG.
    static bool built();
    // Decoder and resampler on CUDA device `device` (ggml-cuda's index); throws where not built or when
    // CUDA or nvJPEG cannot start.
    explicit DeviceJpeg(int32_t device);
    ~DeviceJpeg();
    DeviceJpeg(const DeviceJpeg &) = delete;
    DeviceJpeg & operator=(const DeviceJpeg &) = delete;

    // Decodes a JPEG into device memory and waits for it; returns its stored size. Throws naming
    // what nvJPEG refused.
    void decode(const uint8_t * data, size_t size, int32_t & width, int32_t & height);
    // Resamples the last decoded image into `out`, device memory of plan.width × plan.height × 3
    // floats, and waits for it.
    void layout(float * out, const DeviceJpegPlan & plan);
    // The same into host memory (through a device buffer): what the graph would get, for tests and
    // checks against the host path.
    void layoutToHost(float * out, const DeviceJpegPlan & plan);

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace percept
