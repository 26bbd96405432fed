// Context: one llama_context (KV cache of one sequence), the prompt cache that makes prefix reuse
// possible, the speculator state it owns, and the thread that runs its llama.cpp calls
// (context-thread.h). Generation itself lives in generate.h. Every slow call runs off the JS
// thread; one operation at a time (EBUSY). A context of several sequences (nSeq > 1, one per
// camera) runs its generations through a BatchScheduler (batch.h) instead: one at a time per
// sequence, every sequence at once.
#pragma once

#include <napi.h>

#include "batch.h"
#include "context-thread.h"
#include "llama-cpp.h"
#include "prompt.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

struct ggml_threadpool;

namespace percept {

class Model;
class SpecState;
class ShapeGraphs;

// Every field is required from JS (native/llama.ts owns the defaults).
struct ContextOptions {
    uint32_t nCtx = 0;
    uint32_t nBatch = 0;
    uint32_t nUbatch = 0;
    uint32_t nSeq = 0;
    bool kvUnified = false;       // one KV buffer for every sequence (else a stream per sequence)
    uint32_t maxActive = 0;       // sequences per batched step (nSeq > 1)
    uint32_t prefillChunk = 0;    // prompt positions per batched step (nSeq > 1)
    bool admitTogether = false;   // arrivals wait for the running group and are admitted as the next one (nSeq > 1)
    bool admitTail = false;       // admitting together: the group's tail takes them in once they outnumber its members
    uint32_t tailJoin = 1;        // admitting the tail: the fewest waiting requests that go in beside it
    bool weighTail = false;       // admitting the tail: when predicted to pay (BatchOptions::weighTail), not by count
    bool joinRunning = true;      // admitting together: one that would miss waiting joins the running group (BatchOptions)
    bool backendSampling = true;  // greedy requests without a grammar take their argmax in llama.cpp's graph (BatchOptions)
    double groupWaitMs = 0;       // admitting together: how long an idle decoder holds for frames on their way
    uint32_t maxOutputs = 0;      // outputs per batch: 1 + the longest draft (sizes the compute buffer)
    // Tokens per sequence and generation step, padded (1: none). Same-shape steps let llama.cpp reuse
    // its graph and ggml-cuda replay it. On a fast GPU the padded rows cost what the replay saves,
    // so it is a knob for hosts that build graphs slower (native/README.md#measurements).
    uint32_t stepTokens = 1;
    // Batched, one KV buffer: every token decode has a row and an output for every sequence, and its rows
    // are padded to a multiple of stepRows (0: off), so its shape repeats (BatchOptions::stepRows).
    uint32_t stepRows = 0;
    // CUDA: one ggml-cuda graph per step shape (ShapeGraphs, llama-internal.h), so steps of
    // alternating shapes each replay their own graph.
    bool shapeGraphs = false;
    // Built graphs kept besides the current one, each with its scheduler (setGraphSlots,
    // llama-internal.h), so steps that alternate between shapes reuse theirs (0: only the last).
    uint32_t graphSlots = 0;
    // A Gemma 4 image read causally shares one decode with the prompt text after it
    // (patches/llama-mixed-batch-gemma4.diff): one llama_decode fewer a prefill.
    bool mixedPrefill = false;
    // Batched: a step's causal Gemma 4 image rows and its token rows in one decode (BatchOptions::mixSteps).
    bool mixSteps = false;
    int32_t flashAttention = -1;  // -1 auto, 0 off, 1 on
    std::string kvType;           // "f16" | "q8_0"
    int32_t threads = 0;
};

// A CPU threadpool freed with ggml's own function, as llama-cpp.h does for llama.cpp's objects.
struct GgmlThreadpoolDeleter {
    void operator()(ggml_threadpool * t) const { ggml_threadpool_free(t); }
};
using GgmlThreadpoolPtr = std::unique_ptr<ggml_threadpool, GgmlThreadpoolDeleter>;

// What a context owns natively, declared in the order it is built. C++ destroys members in reverse,
// which is the teardown order: the scheduler and speculation before the llama_context, its threads last.
struct ContextNative {
    std::unique_ptr<SerialThread> thread;
    std::unique_ptr<DeadlineTimer> deadlineTimer;
    GgmlThreadpoolPtr threadpool;  // persistent CPU threads, as llama-bench attaches
    llama_context_ptr ctx;
    std::unique_ptr<ShapeGraphs> shapeGraphs;  // restores ctx's backends
    std::unique_ptr<SpecState> spec;           // the draft context refers to ctx
    std::unique_ptr<BatchScheduler> batch;     // its loop decodes on ctx
    ~ContextNative();
};

class Context : public Napi::ObjectWrap<Context> {
public:
    static Napi::Function Init(Napi::Env env);
    explicit Context(const Napi::CallbackInfo & info);
    ~Context() override;

    llama_context * raw() const { return native_ ? native_->ctx.get() : nullptr; }
    Model * model() const { return model_; }
    const ContextOptions & options() const { return opts_; }
    // The KV cache content; only touched by the single running operation.
    std::vector<CacheItem> & cache() { return cache_; }
    SpecState * speculator() const { return native_->spec.get(); }

    // One operation at a time: throws EBUSY when another is running, EDISPOSED after dispose.
    void acquire(Napi::Env env);
    void releaseBusy() { busy_.store(false); }

    // The thread that runs every llama.cpp call of this context (workers are queued on it).
    SerialThread & thread() { return *native_->thread; }

    // What may stop the next operation (JS thread, before queueing it): clears the stop flag.
    // `cancellable`: a cancel() may come while llama.cpp computes (a signal is attached).
    void resetStop(int64_t deadlineNs, bool cancellable);
    // 0: keep going, 1: cancelled, 2: deadline passed. Between tokens: also checks the clock.
    int stopRequested();

private:
    friend class AttachWorker;
    friend class CeilingWorker;
    friend class StopScope;

    Napi::Value Info(const Napi::CallbackInfo & info);
    Napi::Value MemoryBreakdown(const Napi::CallbackInfo & info);
    Napi::Value Generate(const Napi::CallbackInfo & info);
    Napi::Value Cancel(const Napi::CallbackInfo & info);
    Napi::Value ClearCache(const Napi::CallbackInfo & info);
    Napi::Value CachedPositions(const Napi::CallbackInfo & info);
    void Expect(const Napi::CallbackInfo & info);
    Napi::Value ShapeGraphShapes(const Napi::CallbackInfo & info);
    Napi::Value Prediction(const Napi::CallbackInfo & info);
    Napi::Value RestMs(const Napi::CallbackInfo & info);
    Napi::Value TimeAccount(const Napi::CallbackInfo & info);
    Napi::Value MeasureCeiling(const Napi::CallbackInfo & info);
    Napi::Value AttachSpeculator(const Napi::CallbackInfo & info);
    Napi::Value DetachSpeculator(const Napi::CallbackInfo & info);
    Napi::Value Dispose(const Napi::CallbackInfo & info);
    static Napi::Value Create(const Napi::CallbackInfo & info);
    // llama.cpp calls it after every graph node (on one of its threads): one relaxed load.
    static bool abortCallback(void * data);
    void freeNative();
    // After raw decodes (measureCeiling): no sequence's prompt cache holds what the KV cells had.
    void forgetCaches();
    // The batch scheduler's backend sampler chains off the context (none without a scheduler). On the context's thread.
    void dropBackendSamplers();

    std::unique_ptr<ContextNative> native_;  // null once disposed
    Model * model_ = nullptr;
    Napi::ObjectReference modelRef_;
    ContextOptions opts_;
    std::vector<CacheItem> cache_;
    Napi::ObjectReference draftModelRef_;
    std::atomic<bool> busy_{false};
    std::atomic<int> stop_{0};  // 0, 1 cancelled, 2 deadline passed (set by the timer, or between tokens)
    int64_t deadlineNs_ = 0;    // written on the JS thread before the operation is queued
    bool cancellable_ = false;

    // nSeq > 1: the scheduler, the function that settles its requests' promises on the JS thread,
    // and per sequence the request running there (JS thread only).
    Napi::Value GenerateOnSequence(const Napi::CallbackInfo & info, std::vector<Segment> segments, GenerateOptions g,
                                   GrammarInstance grammar, Napi::Object grammarObj);
    void settle(Napi::Env env, std::unique_ptr<SeqJob> job);
    int32_t requireSeq(const Napi::Value & v, const char * where) const;
    Napi::ThreadSafeFunction batchDone_;
    std::vector<SeqJob *> seqJobs_;
    int32_t inFlight_ = 0;
};

}  // namespace percept
