// Vision: one llama.cpp clip context (tools/mtmd clip.h), loaded from an mmproj GGUF.
// It encodes percept's preprocessed pixels into image embeddings in the decoder's width.
// It runs percept's persistent graph over clip's weights (vision-graph.h), or clip's own encode.
// Load runs in an AsyncWorker. Encodes run on the thread the Vision owns, so no libuv thread waits for them (vision-workers.h).
// One encode at a time per context (EBUSY); dispose() is explicit and idempotent.
#pragma once

#include "context-thread.h"
#include "device-jpeg.h"
#include "llama-internal.h"
#include "vision-graph.h"

#include <napi.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

struct clip_ctx;

namespace percept {

// What the GGUF says about the vision tower, read and type-checked before clip_init.
// clip's key readers GGML_ASSERT on a wrong type, which would take the process down.
struct VisionMeta {
    std::string path;
    std::string projector;  // "gemma3" | "gemma4v"
    int32_t hidden = 0;     // vision tower width
    int32_t layers = 0;
    int32_t heads = 0;
    int32_t ffn = 0;
    int32_t patchSize = 0;
    int32_t imageSize = 0;      // gemma3: the one accepted input side
    int32_t merge = 0;          // pooling kernel over the patch grid
    int32_t positionTable = 0;  // gemma4v: entries per position table
    int32_t projectionDim = 0;
    bool useGpu = false;
    int32_t threads = 1;
};

// What the load resolved. For percept's graph: flash attention, one split, its nodes for one image, the buffer laid out at load.
// For clip: what it reported while it loaded and reserved its compute graph, parsed from its log, the only place it says.
// That is whether flash attention ended up on, the graph's split across backends, and the compute buffers.
// It adds the ops the GPU backend cannot run, which fall back to the CPU.
struct VisionLoadReport {
    // Why clip's encode runs although percept's graph was asked for (empty: it was not, or it runs).
    std::string graphFallback;
    int32_t flashAttention = -1;     // -1 unknown, 0 off, 1 on
    int32_t flashAttentionHead = 0;  // the head size it runs at (the tower's, or padded above); 0 off or unknown
    std::string attentionKernel;     // whose flash-attention kernel runs: "percept", "ggml"; empty off or unknown
    int32_t graphSplits = 0;
    int32_t graphNodes = 0;
    size_t copiedWeightBytes = 0;  // percept's graph: weights copied at load in another layout
    std::vector<std::pair<std::string, double>> computeBuffersMiB;
    std::vector<std::string> unsupportedOps;
};

// Per-call timing through clip's graph-evaluation callback, installed only when loaded with profile.
// 'phases' observes the first node. Setup is graph build, allocation and input upload before it; compute is the rest.
// 'ops' observes every node and synchronizes after each, so per-op times add up to more than an unprofiled run.
struct VisionProfile {
    enum class Mode { Off, Phases, Ops };
    struct OpStat {
        double ms = 0;
        int32_t count = 0;
        int32_t onHost = 0;  // nodes whose output lives in host memory (computed on the CPU)
    };
    Mode mode = Mode::Off;
    int64_t firstNodeNs = 0;
    int64_t lastNs = 0;
    int32_t asked = 0;
    std::map<std::string, OpStat> ops;
    void begin(Mode m);
};

// Buffers reused from one encode to the next (one encode at a time per context).
struct VisionScratch {
    std::vector<float> hwc;
    ClipImages images;
};

class Vision : public Napi::ObjectWrap<Vision> {
public:
    static Napi::Function Init(Napi::Env env);
    explicit Vision(const Napi::CallbackInfo & info);
    ~Vision() override;

    clip_ctx * raw() const { return ctx_; }
    const VisionMeta & meta() const { return meta_; }
    int32_t nEmbd() const { return nEmbd_; }
    void releaseBusy() { busy_.store(false); }
    VisionScratch & scratch() { return scratch_; }
    SerialThread & thread() { return *thread_; }
    // Null unless loaded with profile.
    VisionProfile * profile() const { return profile_.get(); }
    // Null when clip's own encode runs.
    VisionGraph * graph() const { return graph_.get(); }
    // Whether encodeJpeg can run: percept's graph on a CUDA device, in a build with nvJPEG.
    bool decodesJpeg() const { return DeviceJpeg::built() && graph_ != nullptr && graph_->cudaDevice() >= 0; }
    // The GPU JPEG decoder, made on first use (on the encode thread, which alone uses it).
    DeviceJpeg & deviceJpeg();

private:
    static Napi::Value Load(const Napi::CallbackInfo & info);
    Napi::Value Info(const Napi::CallbackInfo & info);
    Napi::Value Encode(const Napi::CallbackInfo & info);
    Napi::Value EncodeBatch(const Napi::CallbackInfo & info);
    Napi::Value EncodeJpeg(const Napi::CallbackInfo & info);
    Napi::Value EncodeJpegBatch(const Napi::CallbackInfo & info);
    Napi::Value JpegPixels(const Napi::CallbackInfo & info);
    Napi::Value AllocatePixels(const Napi::CallbackInfo & info);
    Napi::Value Dispose(const Napi::CallbackInfo & info);
    Napi::Value Queue(const Napi::CallbackInfo & info, std::vector<Napi::Float32Array> images, const Napi::Object & options, bool single);
    struct EncodeShape;
    EncodeShape checkEncodeShape(Napi::Env env, const Napi::Object & o, const char * fn) const;
    void takeBusy(Napi::Env env);
    struct JpegRequest;
    JpegRequest checkJpegRequest(const Napi::CallbackInfo & info, const char * fn, size_t maxFrames) const;
    Napi::Value QueueJpeg(const Napi::CallbackInfo & info, const char * fn, bool single);

    clip_ctx * ctx_ = nullptr;
    VisionMeta meta_;
    VisionLoadReport report_;
    std::unique_ptr<VisionProfile> profile_;
    std::unique_ptr<VisionGraph> graph_;  // destroyed before the clip context whose weights it uses
    std::unique_ptr<DeviceJpeg> jpeg_;
    VisionScratch scratch_;
    int32_t nEmbd_ = 0;
    std::atomic<bool> busy_{false};
    std::unique_ptr<SerialThread> thread_;  // runs the encodes
};

}  // namespace percept
