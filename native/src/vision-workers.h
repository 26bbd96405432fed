// The workers behind Vision's promises (vision.h): the load, off the JS thread in an AsyncWorker, and
// the encodes and the GPU JPEG path's pixels, on the thread the Vision owns. Each start* function
// queues its worker and returns the worker's promise.
#pragma once

#include "device-jpeg.h"
#include "vision-graph.h"
#include "vision.h"

#include <napi.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace percept {

// Vision.load's options. Every field is required from JS (native/vision.ts owns the defaults).
struct LoadOptions {
    std::string path;
    bool useGpu = false;
    int32_t threads = 0;
    FlashAttention flashAttention = FlashAttention::Auto;
    bool warmup = false;
    bool profile = false;
    bool perceptGraph = true;  // percept's persistent graph where it mirrors the tower, else clip's encode
};

// One JPEG frame for the GPU path: its bytes (kept alive by the worker's references), the stored
// size its header was read as, and its EXIF orientation.
struct JpegFrame {
    const uint8_t * data = nullptr;
    size_t bytes = 0;
    int32_t storedWidth = 0, storedHeight = 0;
    int32_t orientation = 1;
};

// clip logs through its own sink (stderr by default). Routes it to the addon's logger; a load also keeps its own thread's lines.
void installClipLog();

// Loads an mmproj off the JS thread. The promise resolves with `ctor` constructed from what was loaded.
Napi::Promise startLoad(Napi::Env env, Napi::Function ctor, LoadOptions opts);
// Encodes images of one size on the Vision's thread. The caller has taken the Vision's busy flag; the worker releases it.
Napi::Promise startEncode(Napi::Env env, Napi::Object self, Vision * vision, const std::vector<Napi::Float32Array> & images,
                          PixelLayout layout, int32_t width, int32_t height, VisionProfile::Mode profile, bool single);
// The same for JPEG frames, decoded and laid out on the graph's GPU (Vision::decodesJpeg) into one batch.
Napi::Promise startEncodeJpeg(Napi::Env env, Napi::Object self, Vision * vision, const std::vector<Napi::Uint8Array> & arrays,
                              std::vector<JpegFrame> frames, const DeviceJpegPlan & plan, VisionProfile::Mode profile, bool single);
// The pixels startEncodeJpeg would hand the graph for one frame, brought back to the host. Busy as for startEncode.
Napi::Promise startJpegPixels(Napi::Env env, Napi::Object self, Vision * vision, Napi::Uint8Array array, const JpegFrame & frame,
                              const DeviceJpegPlan & plan);

}  // namespace percept
