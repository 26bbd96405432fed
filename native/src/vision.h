// Vision: one llama.cpp clip context (tools/mtmd clip.h) loaded from an mmproj GGUF, encoding
// percept's preprocessed pixels into image embeddings in the decoder's width. Load and encode run
// in AsyncWorkers; one encode at a time per context (EBUSY); dispose() is explicit and idempotent.
#pragma once

#include <napi.h>

#include <atomic>
#include <cstdint>
#include <string>

struct clip_ctx;

namespace percept {

// What the GGUF says about the vision tower, read (and type-checked) before clip_init, because
// clip's key readers GGML_ASSERT on a wrong type and would take the process down.
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

class Vision : public Napi::ObjectWrap<Vision> {
public:
    static Napi::Function Init(Napi::Env env);
    explicit Vision(const Napi::CallbackInfo & info);
    ~Vision() override;

    clip_ctx * raw() const { return ctx_; }
    const VisionMeta & meta() const { return meta_; }
    int32_t nEmbd() const { return nEmbd_; }
    void releaseBusy() { busy_.store(false); }

private:
    static Napi::Value Load(const Napi::CallbackInfo & info);
    Napi::Value Info(const Napi::CallbackInfo & info);
    Napi::Value Encode(const Napi::CallbackInfo & info);
    Napi::Value Dispose(const Napi::CallbackInfo & info);

    clip_ctx * ctx_ = nullptr;
    VisionMeta meta_;
    int32_t nEmbd_ = 0;
    std::atomic<bool> busy_{false};
};

}  // namespace percept
