// Context: one llama_context (KV cache of one sequence), the prompt cache that makes prefix
// reuse possible, and the generation loop (sampling, grammar, jump-forward, speculation,
// cancel and deadline). Every slow call runs in an AsyncWorker; one operation at a time (EBUSY).
#pragma once

#include <napi.h>

#include "llama.h"

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace percept {

class Model;
class Speculator;

// What sits in the KV cache, position by position: a text token or a whole image.
struct CacheItem {
    int32_t token = -1;       // >= 0 for a token
    uint64_t imageHash = 0;   // for an image
    int32_t imageTokens = 0;  // > 0 for an image (its number of positions)
    int32_t positions() const { return imageTokens > 0 ? imageTokens : 1; }
    bool sameAs(const CacheItem & o) const {
        return imageTokens > 0 ? (o.imageTokens == imageTokens && o.imageHash == imageHash) : o.imageTokens == 0 && o.token == token;
    }
};

struct ContextOptions {
    uint32_t nCtx = 4096;
    uint32_t nBatch = 512;
    uint32_t nUbatch = 512;
    uint32_t nSeq = 1;
    uint32_t maxOutputs = 16;     // outputs per batch: 1 + the longest draft (sizes the compute buffer)
    int32_t flashAttention = -1;  // -1 auto, 0 off, 1 on
    std::string kvType = "f16";
    int32_t threads = 0;  // 0: all cores
    // Filled at creation: the persistent CPU threadpool (as llama-bench attaches one); without it
    // ggml spawns and joins its worker threads on every graph.
    struct ggml_threadpool * threadpool = nullptr;
};

class Context : public Napi::ObjectWrap<Context> {
public:
    static Napi::Function Init(Napi::Env env);
    explicit Context(const Napi::CallbackInfo & info);
    ~Context() override;

    llama_context * raw() const { return ctx_; }
    Model * model() const { return model_; }
    const ContextOptions & options() const { return opts_; }

    // One operation at a time: throws EBUSY when another is running, EDISPOSED after dispose.
    void acquire(Napi::Env env);
    void releaseBusy() { busy_.store(false); }

    // Speculator bookkeeping (the speculator holds a reference to this context).
    void attach(Speculator * s);
    void detach(Speculator * s);
    Speculator * speculator() const { return spec_; }

    // The KV cache content; only touched by the single running operation.
    std::vector<CacheItem> & cache() { return cache_; }

    // Cancel and deadline, read by the generation loop and by llama.cpp's abort callback.
    void resetStop(int64_t deadlineNs) {
        cancel_.store(false);
        deadlineNs_.store(deadlineNs);
    }
    // 0: keep going, 1: cancelled, 2: deadline passed.
    int stopRequested() const;

private:
    Napi::Value Info(const Napi::CallbackInfo & info);
    Napi::Value MemoryBreakdown(const Napi::CallbackInfo & info);
    Napi::Value Generate(const Napi::CallbackInfo & info);
    Napi::Value Cancel(const Napi::CallbackInfo & info);
    Napi::Value ClearCache(const Napi::CallbackInfo & info);
    Napi::Value CachedPositions(const Napi::CallbackInfo & info);
    Napi::Value Dispose(const Napi::CallbackInfo & info);
    static Napi::Value Create(const Napi::CallbackInfo & info);
    static bool abortCallback(void * data);
    void freeNative();

    llama_context * ctx_ = nullptr;
    Model * model_ = nullptr;
    Napi::ObjectReference modelRef_;
    ContextOptions opts_;
    std::vector<CacheItem> cache_;
    Speculator * spec_ = nullptr;
    std::atomic<bool> busy_{false};
    std::atomic<bool> cancel_{false};
    std::atomic<int64_t> deadlineNs_{0};
};

}  // namespace percept
