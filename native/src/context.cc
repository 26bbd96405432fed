#include "context.h"

#include "generate.h"
#include "grammar.h"
#include "llama-internal.h"
#include "model.h"
#include "speculator.h"
#include "util.h"

#include "ggml-cpu.h"

#include <algorithm>
#include <cmath>

namespace percept {

namespace {

// The llama_context_params of a context with these options (the draft context of a speculator
// takes the same, with its own outputs and sequence count).
llama_context_params contextParams(const ContextOptions & o) {
    llama_context_params cp = llama_context_default_params();
    // stepRows' padding rows take cells of their own for the length of a decode.
    cp.n_ctx = o.nCtx + uint32_t(paddingCells(int32_t(o.nSeq), int32_t(o.stepRows)));
    cp.n_batch = o.nBatch;
    cp.n_ubatch = o.nUbatch;
    cp.n_seq_max = o.nSeq;
    cp.n_outputs_max = o.maxOutputs;
    cp.n_threads = o.threads;
    cp.n_threads_batch = o.threads;
    cp.flash_attn_type = llama_flash_attn_type(o.flashAttention);
    const ggml_type kv = o.kvType == "q8_0" ? GGML_TYPE_Q8_0 : GGML_TYPE_F16;
    cp.type_k = kv;
    cp.type_v = kv;
    cp.swa_full = true;  // partial KV removal (prefix reuse, rejected drafts) needs the full SWA cache
    cp.kv_unified = o.kvUnified;
    cp.no_perf = true;
    return cp;
}

// ------------------------------------------------------------------------------------------------
// Context creation

// What Context.create makes off the JS thread: the context's own thread, and the llama_context and
// CPU threadpool created on it. The Context takes the parts over; what is left is freed.
struct CreatedContext {
    std::unique_ptr<ContextNative> native = std::make_unique<ContextNative>();
    ContextOptions options;
};

class CreateWorker : public ThreadWorker {
public:
    CreateWorker(Napi::Env env, Napi::Object modelObj, Model * model, ContextOptions opts)
        : ThreadWorker(env, "percept:Context.create", "ECONTEXT"), modelRef_(Napi::Persistent(modelObj)), model_(model),
          made_(std::make_unique<CreatedContext>()) {
        made_->options = std::move(opts);
        made_->native->thread = std::make_unique<SerialThread>();
        model_->retain();  // the model cannot be disposed while we create on it
    }
    ~CreateWorker() override {
        made_.reset();
        model_->release();
    }
    SerialThread & thread() { return *made_->native->thread; }

protected:
    void Execute() override {
        try {
            create(*made_);
        } catch (const std::exception & e) {
            SetError(std::string("failed to create context: ") + e.what());
        }
    }
    void OnOK() override {
        Napi::Env env = Env();
        Napi::Object obj = addonData(env).contextCtor.New(
            {modelRef_.Value(),
             Napi::External<CreatedContext>::New(env, made_.release(), [](Napi::Env, CreatedContext * p) { delete p; })});
        deferred_.Resolve(obj);
    }

private:
    // On the context's thread, so the CPU threadpool's workers are its children.
    void create(CreatedContext & made) {
        LogCapture capture;
        ContextNative & n = *made.native;
        n.ctx.reset(llama_init_from_model(model_->raw(), contextParams(made.options)));
        if (!n.ctx) {
            std::string why = capture.text();
            throw std::runtime_error(why.empty() ? "llama_init_from_model failed" : why);
        }
        // Without a persistent threadpool ggml spawns and joins its workers on every graph.
        ggml_threadpool_params tpp = ggml_threadpool_params_default(made.options.threads);
        n.threadpool.reset(ggml_threadpool_new(&tpp));
        if (n.threadpool) llama_attach_threadpool(n.ctx.get(), n.threadpool.get(), nullptr);
        setGraphSlots(n.ctx.get(), made.options.graphSlots);
        if (made.options.shapeGraphs) n.shapeGraphs = ShapeGraphs::install(n.ctx.get());
    }

    Napi::ObjectReference modelRef_;
    Model * model_;
    std::unique_ptr<CreatedContext> made_;
};

// ------------------------------------------------------------------------------------------------
// Generation

void onTokensJs(Napi::Env env, Napi::Function fn, std::nullptr_t *, std::vector<llama_token> * tokens) {
    if (env != nullptr && fn != nullptr) {
        Napi::Int32Array arr = Napi::Int32Array::New(env, tokens->size());
        std::copy(tokens->begin(), tokens->end(), arr.Data());
        try {
            fn.Call({arr});
        } catch (...) {}
    }
    delete tokens;
}
using TokenTsfn = Napi::TypedThreadSafeFunction<std::nullptr_t, std::vector<llama_token>, onTokensJs>;

Napi::Object resultToJs(Napi::Env env, const GenerateResult & r, bool recordSampleTimes, bool topLogits) {
    Napi::Object o = Napi::Object::New(env);
    Napi::Int32Array toks = Napi::Int32Array::New(env, r.tokens.size());
    std::copy(r.tokens.begin(), r.tokens.end(), toks.Data());
    o.Set("tokens", toks);
    o.Set("text", Napi::String::New(env, r.text));
    o.Set("stopReason", r.stopReason);
    o.Set("promptTokens", r.promptTokens);
    o.Set("reusedTokens", r.reusedTokens);
    o.Set("drafted", r.drafted);
    o.Set("accepted", r.accepted);
    o.Set("forced", r.forced);
    o.Set("draftsCut", r.draftsCut);
    Napi::Object t = Napi::Object::New(env);
    t.Set("prefillMs", r.prefillMs);
    t.Set("prefillTokens", r.prefillTokens);
    t.Set("prefillDecodeCalls", r.prefillDecodeCalls);
    t.Set("ttftMs", r.ttftMs);
    t.Set("decodeMs", r.decodeMs);
    t.Set("decodeTokens", std::max<int32_t>(0, int32_t(r.tokens.size()) - 1));
    t.Set("decodeCalls", r.decodeCalls);
    t.Set("sampleMs", r.sampleMs);
    t.Set("draftMs", r.draftMs);
    t.Set("llamaDecodeMs", r.llamaDecodeMs);
    t.Set("singleDecodeCalls", r.singleDecodeCalls);
    t.Set("singleDecodeMs", r.singleDecodeMs);
    t.Set("graphReuses", r.graphReuses);
    t.Set("paddedSteps", r.paddedSteps);
    o.Set("timings", t);
    if (recordSampleTimes) {
        Napi::Float32Array us = Napi::Float32Array::New(env, r.sampleUs.size());
        std::copy(r.sampleUs.begin(), r.sampleUs.end(), us.Data());
        o.Set("sampleUs", us);
    }
    if (topLogits) {
        Napi::Array rows = Napi::Array::New(env, r.topLogits.size());
        for (size_t i = 0; i < r.topLogits.size(); i++) {
            const TopLogits & t = r.topLogits[i];
            Napi::Object row = Napi::Object::New(env);
            row.Set("step", t.step);
            Napi::Int32Array ids = Napi::Int32Array::New(env, t.ids.size());
            std::copy(t.ids.begin(), t.ids.end(), ids.Data());
            row.Set("ids", ids);
            Napi::Float32Array logits = Napi::Float32Array::New(env, t.logits.size());
            std::copy(t.logits.begin(), t.logits.end(), logits.Data());
            row.Set("logits", logits);
            rows.Set(uint32_t(i), row);
        }
        o.Set("topLogits", rows);
    }
    return o;
}

// A generate call on one sequence of a batch context: the scheduler's job plus what settles it on
// the JS thread (the promise, and references that keep the context and grammar alive meanwhile).
struct JsSeqJob : SeqJob {
    explicit JsSeqJob(Napi::Env env) : deferred(Napi::Promise::Deferred::New(env)) {}
    Napi::Promise::Deferred deferred;
    Napi::ObjectReference self;
    Napi::ObjectReference grammarRef;
};

Napi::Object batchResultToJs(Napi::Env env, const SeqJob & j) {
    Napi::Object o = resultToJs(env, j.result, j.opts.recordSampleTimes, j.opts.topLogits > 0);
    Napi::Object b = Napi::Object::New(env);
    b.Set("seq", j.seq);
    b.Set("queueMs", j.counts.queueMs);
    b.Set("waitSteps", j.counts.waitSteps);
    b.Set("steps", j.counts.steps);
    b.Set("peakSeqs", j.counts.peakSeqs);
    b.Set("graphReuses", j.counts.graphReuses);
    b.Set("predictedMs", j.counts.predictedMs);
    b.Set("predictedMiss", j.counts.predictedMiss);
    b.Set("backendSampled", j.counts.backendSampled);
    o.Set("batch", b);
    return o;
}

}  // namespace

// For the duration of one operation on the context's thread: arms the deadline timer, and installs
// llama.cpp's abort callback only when a deadline or a cancel can come (without one, graph nodes
// run with no callback at all).
class StopScope {
public:
    explicit StopScope(Context & c) : c_(c) {
        if (c_.deadlineNs_ > 0) c_.native_->deadlineTimer->arm(c_.deadlineNs_);
        if (c_.deadlineNs_ > 0 || c_.cancellable_) llama_set_abort_callback(c_.raw(), &Context::abortCallback, &c_);
    }
    ~StopScope() {
        llama_set_abort_callback(c_.raw(), nullptr, nullptr);
        c_.native_->deadlineTimer->disarm();
    }
    StopScope(const StopScope &) = delete;
    StopScope & operator=(const StopScope &) = delete;

private:
    Context & c_;
};

namespace {

class GenerateWorker : public ThreadWorker {
public:
    GenerateWorker(Napi::Env env, Napi::Object self, Context * ctx, std::vector<Segment> segments, GenerateOptions opts,
                   GrammarInstance grammar, Napi::Object grammarObj, Napi::Value onTokens)
        : ThreadWorker(env, "percept:Context.generate", "EGENERATE"), self_(Napi::Persistent(self)), ctx_(ctx),
          recordSampleTimes_(opts.recordSampleTimes), topLogits_(opts.topLogits > 0),
          generation_(*ctx, std::move(segments), std::move(opts), std::move(grammar), sinkFor(env, onTokens)) {
        if (!grammarObj.IsEmpty()) grammarRef_ = Napi::Persistent(grammarObj);
    }
    ~GenerateWorker() override {
        if (hasTsfn_) tsfn_.Release();
    }

protected:
    void Execute() override {
        try {
            StopScope armed(*ctx_);
            res_ = generation_.run();
        } catch (const CodedFailure & e) {
            SetCodedError(e.code, e.what());
        } catch (const std::exception & e) {
            SetError(e.what());
        }
    }
    void OnOK() override {
        ctx_->releaseBusy();
        deferred_.Resolve(resultToJs(Env(), res_, recordSampleTimes_, topLogits_));
    }
    void OnError(const Napi::Error & e) override {
        ctx_->releaseBusy();
        ThreadWorker::OnError(e);
    }

private:
    TokenSink sinkFor(Napi::Env env, Napi::Value onTokens) {
        if (!onTokens.IsFunction()) return nullptr;
        tsfn_ = TokenTsfn::New(env, onTokens.As<Napi::Function>(), "percept-tokens", 0, 1);
        hasTsfn_ = true;
        return [this](const std::vector<llama_token> & toks) { tsfn_.NonBlockingCall(new std::vector<llama_token>(toks)); };
    }

    Napi::ObjectReference self_;
    Napi::ObjectReference grammarRef_;
    Context * ctx_;
    TokenTsfn tsfn_;
    bool hasTsfn_ = false;
    bool recordSampleTimes_;
    bool topLogits_;
    Generation generation_;
    GenerateResult res_;
};

// ------------------------------------------------------------------------------------------------
// Speculator

// Speculator types that common/speculative can run for one sequence here.
const std::vector<std::string> kSpecTypes = {"draft-simple", "draft-mtp", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod"};

}  // namespace

// measureCeiling: llama-batched-bench's timing of one shape on this context (timeCeiling, batch.h).
class CeilingWorker : public ThreadWorker {
public:
    CeilingWorker(Napi::Env env, Context * ctx, int32_t nSeq, int32_t promptTokens, int32_t steps, int32_t repeats)
        : ThreadWorker(env, "percept:Context.measureCeiling", "ECEILING"), ctxRef_(Napi::Persistent(ctx->Value())), ctx_(ctx), nSeq_(nSeq),
          promptTokens_(promptTokens), steps_(steps), repeats_(repeats) {}

protected:
    void Execute() override {
        try {
            ctx_->dropBackendSamplers();
            times_ = timeCeiling(ctx_->raw(), nSeq_, promptTokens_, steps_, repeats_);
        } catch (const std::exception & e) {
            SetError(e.what());
        }
    }
    void OnOK() override {
        Napi::Env env = Env();
        ctx_->forgetCaches();
        ctx_->releaseBusy();
        const auto array = [&](const std::vector<double> & v) {
            Napi::Array a = Napi::Array::New(env, v.size());
            for (size_t i = 0; i < v.size(); i++) a.Set(uint32_t(i), v[i]);
            return a;
        };
        Napi::Object o = Napi::Object::New(env);
        o.Set("prefillMs", array(times_.prefillMs));
        o.Set("decodeMs", array(times_.decodeMs));
        deferred_.Resolve(o);
    }
    void OnError(const Napi::Error & e) override {
        ctx_->forgetCaches();
        ctx_->releaseBusy();
        ThreadWorker::OnError(e);
    }

private:
    Napi::ObjectReference ctxRef_;
    Context * ctx_;
    int32_t nSeq_, promptTokens_, steps_, repeats_;
    CeilingTimes times_;
};

class AttachWorker : public ThreadWorker {
public:
    AttachWorker(Napi::Env env, Context * ctx, Napi::Value draftObj, Model * draft, SpecOptions opts)
        : ThreadWorker(env, "percept:Context.attachSpeculator", "ESPECULATOR"), ctxRef_(Napi::Persistent(ctx->Value())), ctx_(ctx),
          draft_(draft), opts_(std::move(opts)) {
        if (draft_ != nullptr) draftRef_ = Napi::Persistent(draftObj.As<Napi::Object>());
    }

protected:
    void Execute() override {
        try {
            llama_context_params dp = contextParams(ctx_->options());
            dp.n_ctx = llama_n_ctx(ctx_->raw());
            dp.type_k = GGML_TYPE_F16;  // the draft's own KV (draft-simple) stays f16
            dp.type_v = GGML_TYPE_F16;
            state_ = std::make_unique<SpecState>(ctx_->raw(), draft_, dp, ctx_->native_->threadpool.get(), opts_);
        } catch (const std::exception & e) {
            SetError(std::string("failed to create speculator: ") + e.what());
        }
    }
    void OnOK() override {
        Napi::Env env = Env();
        ctx_->cache_.clear();  // SpecState emptied the KV cache
        ctx_->native_->spec = std::move(state_);
        if (!draftRef_.IsEmpty()) ctx_->draftModelRef_ = Napi::Persistent(draftRef_.Value());
        ctx_->releaseBusy();
        Napi::Object info = Napi::Object::New(env);
        info.Set("type", ctx_->native_->spec->type());
        info.Set("nMax", ctx_->native_->spec->nMax());
        deferred_.Resolve(info);
    }
    void OnError(const Napi::Error & e) override {
        ctx_->releaseBusy();
        ThreadWorker::OnError(e);
    }

private:
    Napi::ObjectReference ctxRef_;
    Napi::ObjectReference draftRef_;
    Context * ctx_;
    Model * draft_;
    SpecOptions opts_;
    std::unique_ptr<SpecState> state_;
};

namespace {

// ------------------------------------------------------------------------------------------------
// Argument parsing (on the JS thread: cheap shape and range checks; TS validated already)

// Sequences of one context at most (one per camera).
constexpr int64_t kMaxSequences = 256;
constexpr int64_t kMaxGraphSlots = 16;  // native/llama.ts's MAX_GRAPH_SLOTS

ContextOptions parseContextOptions(const Napi::Object & o) {
    const char * w = "Context.create options";
    ContextOptions c;
    c.nCtx = uint32_t(requireInt(o, "nCtx", 16, 1 << 24, w));
    c.nBatch = uint32_t(requireInt(o, "nBatch", 1, 1 << 20, w));
    c.nUbatch = uint32_t(requireInt(o, "nUbatch", 1, c.nBatch, w));
    c.nSeq = uint32_t(requireInt(o, "nSeq", 1, kMaxSequences, w));
    c.kvUnified = requireBool(o, "kvUnified", w);
    c.maxActive = uint32_t(requireInt(o, "maxActive", 1, c.nSeq, w));
    c.prefillChunk = uint32_t(requireInt(o, "prefillChunk", 1, c.nBatch, w));
    c.admitTogether = requireBool(o, "admitTogether", w);
    c.admitTail = requireBool(o, "admitTail", w);
    c.tailJoin = uint32_t(requireInt(o, "tailJoin", 1, c.nSeq, w));
    c.weighTail = requireBool(o, "weighTail", w);
    c.joinRunning = requireBool(o, "joinRunning", w);
    c.backendSampling = requireBool(o, "backendSampling", w);
    c.groupWaitMs = requireNumber(o, "groupWaitMs", 0, 1000, w);
    c.maxOutputs = uint32_t(requireInt(o, "maxOutputs", 1, c.nBatch, w));
    c.stepTokens = uint32_t(requireInt(o, "stepTokens", 1, std::max(1u, std::min(c.nUbatch, c.nBatch / c.maxActive)), w));
    c.stepRows = uint32_t(requireInt(o, "stepRows", 0, 256, w));
    // The padding rows go in the step's batch of nBatch rows, beside a row for every sequence at least.
    if (c.stepRows > 0 && uint32_t(paddingCells(int32_t(c.nSeq), int32_t(c.stepRows))) + c.nSeq > c.nBatch) {
        throw Napi::RangeError::New(o.Env(),
                                    "Context.create: stepRows " + std::to_string(c.stepRows) + " with nSeq " + std::to_string(c.nSeq) +
                                        " pads a decode past nBatch (" + std::to_string(c.nBatch) + ")");
    }
    c.shapeGraphs = requireBool(o, "shapeGraphs", w);
    c.graphSlots = uint32_t(requireInt(o, "graphSlots", 0, kMaxGraphSlots, w));
    c.mixedPrefill = requireBool(o, "mixedPrefill", w);
    c.mixSteps = requireBool(o, "mixSteps", w);
    Napi::Value fa = o.Get("flashAttention");
    if (fa.IsBoolean()) c.flashAttention = fa.As<Napi::Boolean>().Value() ? 1 : 0;
    else if (requireChoice(o, "flashAttention", {"auto"}, w) == 0) c.flashAttention = -1;
    c.kvType = requireChoice(o, "kvType", {"f16", "q8_0"}, w) == 0 ? "f16" : "q8_0";
    if (c.kvType == "q8_0" && c.flashAttention == 0) {
        throw Napi::Error::New(o.Env(),
                               "Context.create: kvType 'q8_0' needs flash attention (the quantized V cache is read by the FA kernel)");
    }
    c.threads = int32_t(requireInt(o, "threads", 1, 1024, w));
    return c;
}

Segment parseSegment(const Napi::Value & v, const ModelInfo & mi, const std::string & where) {
    Napi::Env env = v.Env();
    Napi::Object o = requireObject(v, where.c_str());
    Segment s;
    if (o.Has("text")) {
        s.kind = Segment::Text;
        s.text = requireString(o, "text", where.c_str());
        s.addSpecial = requireBool(o, "addSpecial", where.c_str());
    } else if (o.Has("tokens")) {
        s.kind = Segment::Tokens;
        s.tokens = requireTokens(o.Get("tokens"), mi.nVocab, where + ".tokens");
    } else if (o.Has("image")) {
        s.kind = Segment::Image;
        Napi::Value img = o.Get("image");
        if (!img.IsTypedArray() || img.As<Napi::TypedArray>().TypedArrayType() != napi_float32_array) {
            throw Napi::TypeError::New(env, where + ".image must be a Float32Array");
        }
        Napi::Float32Array f = img.As<Napi::Float32Array>();
        s.nTokens = int32_t(requireInt(o, "nTokens", 1, 1 << 20, where.c_str()));
        const size_t want = size_t(s.nTokens) * size_t(mi.nEmbd);
        if (f.ElementLength() != want) {
            throw Napi::RangeError::New(env,
                                        where + ".image has " + std::to_string(f.ElementLength()) + " floats; expected nTokens × nEmbd = " +
                                            std::to_string(s.nTokens) + " × " + std::to_string(mi.nEmbd) + " = " + std::to_string(want) +
                                            " (wrong embedding width for this model?)");
        }
        if (mi.imageStartToken < 0 || mi.imageEndToken < 0) {
            throw Napi::Error::New(env, where + ": this model's vocabulary has no image start/end tokens");
        }
        s.embd.assign(f.Data(), f.Data() + f.ElementLength());
        s.forceCausal = requireBool(o, "causal", where.c_str());
    } else {
        throw Napi::TypeError::New(env, where + " must have one of text, tokens or image");
    }
    return s;
}

std::vector<Segment> parseSegments(Napi::Env env, const Napi::Value & v, const ModelInfo & mi) {
    if (!v.IsArray()) throw Napi::TypeError::New(env, "generate: prompt must be an array of segments");
    Napi::Array arr = v.As<Napi::Array>();
    std::vector<Segment> out;
    for (uint32_t i = 0; i < arr.Length(); i++) out.push_back(parseSegment(arr.Get(i), mi, "prompt[" + std::to_string(i) + "]"));
    return out;
}

GenerateOptions parseGenerateOptions(const Napi::Object & o, const ModelInfo & mi) {
    Napi::Env env = o.Env();
    const char * w = "generate options";
    GenerateOptions g;
    g.maxTokens = int32_t(requireInt(o, "maxTokens", 0, 1 << 24, w));
    g.sampling.temperature = float(requireNumber(o, "temperature", 0, 100, w));
    g.sampling.topK = int32_t(requireInt(o, "topK", 0, mi.nVocab, w));
    g.sampling.topP = float(requireNumber(o, "topP", 0, 1, w));
    if (!(g.sampling.topP > 0)) throw Napi::RangeError::New(env, "generate options.topP must be in (0, 1]");
    g.sampling.minP = float(requireNumber(o, "minP", 0, 1, w));
    g.sampling.seed = uint32_t(requireInt(o, "seed", 0, 0xFFFFFFFFLL, w));
    g.ignoreEos = requireBool(o, "ignoreEos", w);
    g.jumpForward = requireBool(o, "jumpForward", w);
    g.recordSampleTimes = requireBool(o, "recordSampleTimes", w);
    g.topLogits = int32_t(requireInt(o, "topLogits", 0, 64, w));
    g.speculative = requireBool(o, "speculative", w);
    g.cancellable = requireBool(o, "cancellable", w);
    if (!o.Get("nDraft").IsUndefined()) g.nDraft = int32_t(requireInt(o, "nDraft", 0, 256, w));
    Napi::Value stops = o.Get("stopStrings");
    if (!stops.IsArray()) throw Napi::TypeError::New(env, "generate options.stopStrings must be an array of strings");
    Napi::Array a = stops.As<Napi::Array>();
    for (uint32_t i = 0; i < a.Length(); i++) {
        std::string s = requireString(a.Get(i), "generate options.stopStrings[]");
        if (s.empty()) throw Napi::TypeError::New(env, "generate options.stopStrings[] must not be empty");
        g.stopStrings.push_back(s);
    }
    g.stopTokens = requireTokens(o.Get("stopTokens"), mi.nVocab, "generate options.stopTokens");
    Napi::Value dl = o.Get("deadlineNs");
    if (dl.IsBigInt()) {
        bool lossless = true;
        g.deadlineNs = dl.As<Napi::BigInt>().Int64Value(&lossless);
        if (g.deadlineNs <= 0) g.deadlineNs = 1;  // already passed
    } else if (!dl.IsUndefined()) {
        throw Napi::TypeError::New(env, "generate options.deadlineNs must be a bigint (process.hrtime.bigint() clock)");
    }
    return g;
}

SpecOptions parseSpecOptions(const Napi::Object & o, const ContextOptions & co) {
    const char * w = "attachSpeculator options";
    SpecOptions s;
    s.type = kSpecTypes[requireChoice(o, "type", kSpecTypes, w)];
    s.nMax = int32_t(requireInt(o, "nMax", 1, 64, w));
    s.nMin = int32_t(requireInt(o, "nMin", 0, s.nMax, w));
    s.pMin = float(requireNumber(o, "pMin", 0, 1, w));
    s.ngramN = int32_t(requireInt(o, "ngramN", 1, 64, w));
    if (uint32_t(s.nMax) + 1 > co.maxOutputs) {
        throw Napi::RangeError::New(o.Env(),
                                    "attachSpeculator: nMax " + std::to_string(s.nMax) + " needs a context with maxOutputs >= " +
                                        std::to_string(s.nMax + 1) + " (it has " + std::to_string(co.maxOutputs) + ")");
    }
    return s;
}

// The draft model a speculator type needs (draft-simple, draft-mtp), checked against the target.
Model * checkDraftModel(Napi::Env env, const Napi::Value & draftObj, const SpecOptions & s, const Model & target) {
    const bool needsDraft = s.type == "draft-simple" || s.type == "draft-mtp";
    if (!needsDraft) {
        if (!draftObj.IsNull()) throw Napi::TypeError::New(env, "attachSpeculator: a draft model is only for draft-simple and draft-mtp");
        return nullptr;
    }
    if (!draftObj.IsObject() || !draftObj.As<Napi::Object>().InstanceOf(addonData(env).modelCtor.Value())) {
        throw Napi::TypeError::New(env, "attachSpeculator: type " + s.type + " needs a draft Model");
    }
    Model * draft = Model::Unwrap(draftObj.As<Napi::Object>());
    draft->require(env);
    const std::string & da = draft->info().arch;
    const std::string & ta = target.info().arch;
    if (s.type == "draft-mtp" && (da != "gemma4-assistant" || ta != "gemma4")) {
        throw Napi::TypeError::New(env, "draft-mtp needs a gemma4-assistant draft for a gemma4 target (got " + da + " for " + ta + ")");
    }
    if (s.type == "draft-simple" && da == "gemma4-assistant") {
        throw Napi::TypeError::New(env, "a gemma4-assistant model drafts only with type 'draft-mtp'");
    }
    if (draft->info().vocabOnly) throw Napi::TypeError::New(env, "the draft model was loaded with vocabOnly");
    return draft;
}

}  // namespace

// ------------------------------------------------------------------------------------------------

Napi::Function Context::Init(Napi::Env env) {
    return DefineClass(env, "Context",
                       {
                           StaticMethod<&Context::Create>("create"),
                           InstanceMethod<&Context::Info>("info"),
                           InstanceMethod<&Context::MemoryBreakdown>("memoryBreakdown"),
                           InstanceMethod<&Context::Generate>("generate"),
                           InstanceMethod<&Context::Cancel>("cancel"),
                           InstanceMethod<&Context::ClearCache>("clearCache"),
                           InstanceMethod<&Context::CachedPositions>("cachedPositions"),
                           InstanceMethod<&Context::Expect>("expect"),
                           InstanceMethod<&Context::ShapeGraphShapes>("shapeGraphShapes"),
                           InstanceMethod<&Context::Prediction>("prediction"),
                           InstanceMethod<&Context::RestMs>("restMs"),
                           InstanceMethod<&Context::TimeAccount>("timeAccount"),
                           InstanceMethod<&Context::MeasureCeiling>("measureCeiling"),
                           InstanceMethod<&Context::AttachSpeculator>("attachSpeculator"),
                           InstanceMethod<&Context::DetachSpeculator>("detachSpeculator"),
                           InstanceMethod<&Context::Dispose>("dispose"),
                       });
}

Context::Context(const Napi::CallbackInfo & info) : Napi::ObjectWrap<Context>(info) {
    Napi::Env env = info.Env();
    if (info.Length() < 2 || !info[1].IsExternal()) {
        throw Napi::TypeError::New(env, "Context cannot be constructed directly; use Context.create(model, options)");
    }
    modelRef_ = Napi::Persistent(info[0].As<Napi::Object>());
    model_ = Model::Unwrap(info[0].As<Napi::Object>());
    model_->retain();
    CreatedContext * made = info[1].As<Napi::External<CreatedContext>>().Data();
    native_ = std::move(made->native);
    opts_ = made->options;
    native_->deadlineTimer = std::make_unique<DeadlineTimer>(stop_, 2);
    if (opts_.nSeq > 1) {
        // Finished requests come back on the context's thread; this settles them on the JS thread.
        // Referenced only while requests are in flight, so an idle context keeps no process alive.
        batchDone_ = Napi::ThreadSafeFunction::New(env, Napi::Function::New(env, [](const Napi::CallbackInfo &) {}), "percept:batch", 0, 1);
        batchDone_.Unref(env);
        seqJobs_.assign(opts_.nSeq, nullptr);
        BatchOptions bo;
        bo.nSeq = int32_t(opts_.nSeq);
        bo.maxActive = int32_t(opts_.maxActive);
        bo.prefillChunk = int32_t(opts_.prefillChunk);
        bo.admitTogether = opts_.admitTogether;
        bo.admitTail = opts_.admitTail;
        bo.tailJoin = int64_t(opts_.tailJoin);
        bo.weighTail = opts_.weighTail;
        bo.joinRunning = opts_.joinRunning;
        bo.backendSampling = opts_.backendSampling;
        bo.groupWaitNs = int64_t(opts_.groupWaitMs * 1e6);
        bo.nBatch = int32_t(opts_.nBatch);
        bo.nUbatch = int32_t(opts_.nUbatch);
        bo.kvUnified = opts_.kvUnified;
        bo.stepTokens = int32_t(opts_.stepTokens);
        bo.stepRows = int32_t(opts_.stepRows);
        bo.mixSteps = opts_.mixSteps;
        native_->batch = std::make_unique<BatchScheduler>(raw(), model_, *native_->thread, bo, [this](std::unique_ptr<SeqJob> job) {
            SeqJob * raw = job.release();
            batchDone_.NonBlockingCall([this, raw](Napi::Env env, Napi::Function) { settle(env, std::unique_ptr<SeqJob>(raw)); });
        });
    }
}

ContextNative::~ContextNative() = default;

Context::~Context() { freeNative(); }

// Idle: no operation runs (busy) when the context is freed.
void Context::freeNative() {
    if (!native_) return;
    const bool batched = native_->batch != nullptr;
    native_.reset();
    if (batched) batchDone_.Release();  // after the scheduler, whose loop calls it
    draftModelRef_.Reset();
    model_->release();
    modelRef_.Reset();
}

bool Context::abortCallback(void * data) { return static_cast<Context *>(data)->stop_.load(std::memory_order_relaxed) != 0; }

void Context::resetStop(int64_t deadlineNs, bool cancellable) {
    stop_.store(0);
    deadlineNs_ = deadlineNs;
    cancellable_ = cancellable;
}

int Context::stopRequested() {
    int expected = stop_.load(std::memory_order_relaxed);
    if (expected == 0 && deadlineNs_ > 0 && monotonicNs() >= deadlineNs_) stop_.compare_exchange_strong(expected, 2);
    return stop_.load(std::memory_order_relaxed);
}

void Context::acquire(Napi::Env env) {
    if (!native_) throw codedError(env, "EDISPOSED", "Context is disposed");
    bool expected = false;
    if (!busy_.compare_exchange_strong(expected, true)) {
        throw codedError(env, "EBUSY", "Context is busy: only one operation may run at a time on a context");
    }
}

Napi::Value Context::Create(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (!info[0].IsObject() || !info[0].As<Napi::Object>().InstanceOf(addonData(env).modelCtor.Value())) {
        throw Napi::TypeError::New(env, "Context.create: expected a Model as the first argument");
    }
    Model * model = Model::Unwrap(info[0].As<Napi::Object>());
    model->require(env);
    if (model->info().vocabOnly) throw Napi::Error::New(env, "Context.create: the model was loaded with vocabOnly");
    if (model->info().arch == "gemma4-assistant") {
        throw Napi::Error::New(env, "Context.create: a gemma4-assistant model is a drafter; attach it to a context as a speculator");
    }
    ContextOptions c = parseContextOptions(requireObject(info[1], "Context.create options"));
    auto * worker = new CreateWorker(env, info[0].As<Napi::Object>(), model, c);
    Napi::Promise p = worker->promise();
    worker->Queue(worker->thread());
    return p;
}

Napi::Value Context::Info(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (!native_) throw codedError(env, "EDISPOSED", "Context is disposed");
    Napi::Object o = Napi::Object::New(env);
    o.Set("nCtx", llama_n_ctx(raw()));
    o.Set("nBatch", llama_n_batch(raw()));
    o.Set("nUbatch", llama_n_ubatch(raw()));
    o.Set("nSeq", llama_n_seq_max(raw()));
    o.Set("nCtxSeq", native_->batch ? native_->batch->nCtxSeq() : int32_t(llama_n_ctx_seq(raw())));
    o.Set("kvUnified", opts_.kvUnified);
    o.Set("maxActive", opts_.maxActive);
    o.Set("prefillChunk", opts_.prefillChunk);
    o.Set("admitTogether", opts_.admitTogether);
    o.Set("admitTail", opts_.admitTail);
    o.Set("tailJoin", opts_.tailJoin);
    o.Set("weighTail", opts_.weighTail);
    o.Set("joinRunning", opts_.joinRunning);
    o.Set("backendSampling", opts_.backendSampling);
    o.Set("groupWaitMs", opts_.groupWaitMs);
    o.Set("maxOutputs", opts_.maxOutputs);
    o.Set("stepTokens", opts_.stepTokens);
    o.Set("stepRows", opts_.stepRows);
    o.Set("graphSlots", opts_.graphSlots);
    o.Set("mixedPrefill", opts_.mixedPrefill);
    o.Set("mixSteps", opts_.mixSteps);
    // CUDA backends whose graphs are keyed per step shape (0: none, or not asked).
    o.Set("shapeGraphBackends", double(native_->shapeGraphs ? native_->shapeGraphs->backends() : 0));
    o.Set("threads", opts_.threads);
    o.Set("flashAttention",
          opts_.flashAttention == -1 ? Napi::Value(Napi::String::New(env, "auto")) : Napi::Boolean::New(env, opts_.flashAttention == 1));
    o.Set("kvType", opts_.kvType);
    return o;
}

Napi::Value Context::MemoryBreakdown(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (!native_) throw codedError(env, "EDISPOSED", "Context is disposed");
    double model = 0, context = 0, compute = 0;
    Napi::Array per = Napi::Array::New(env);
    uint32_t i = 0;
    for (const BufferBytes & b : percept::memoryBreakdown(raw())) {
        model += double(b.model);
        context += double(b.context);
        compute += double(b.compute);
        Napi::Object e = Napi::Object::New(env);
        e.Set("bufferType", b.bufferType);
        e.Set("model", double(b.model));
        e.Set("context", double(b.context));
        e.Set("compute", double(b.compute));
        per.Set(i++, e);
    }
    Napi::Object o = Napi::Object::New(env);
    o.Set("model", model);
    o.Set("context", context);
    o.Set("compute", compute);
    o.Set("byBufferType", per);
    return o;
}

Napi::Value Context::Generate(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (!native_) throw codedError(env, "EDISPOSED", "Context is disposed");
    model_->require(env);
    const ModelInfo & mi = model_->info();
    std::vector<Segment> segments = parseSegments(env, info[0], mi);
    Napi::Object o = requireObject(info[1], "generate options");
    GenerateOptions g = parseGenerateOptions(o, mi);
    GrammarInstance grammar;
    Napi::Object grammarObj;
    Napi::Value gv = o.Get("grammar");
    if (!gv.IsUndefined()) {
        if (!gv.IsObject() || !gv.As<Napi::Object>().InstanceOf(addonData(env).grammarCtor.Value())) {
            throw Napi::TypeError::New(env, "generate options.grammar must be a Grammar");
        }
        Grammar * gr = Grammar::Unwrap(gv.As<Napi::Object>());
        if (gr->model() != model_) throw Napi::Error::New(env, "generate options.grammar was built for another model");
        grammar = gr->instantiate();
        grammarObj = gv.As<Napi::Object>();
    }
    Napi::Value onTokens = info.Length() > 2 ? info[2] : env.Undefined();
    if (!onTokens.IsUndefined() && !onTokens.IsFunction()) throw Napi::TypeError::New(env, "generate: onTokens must be a function");
    if (native_->batch) {
        if (!onTokens.IsUndefined()) throw Napi::TypeError::New(env, "generate: a context of several sequences does not stream tokens");
        if (g.topLogits > 0)
            throw Napi::TypeError::New(env, "generate options.topLogits: a context of several sequences does not record logits");
        return GenerateOnSequence(info, std::move(segments), std::move(g), std::move(grammar), grammarObj);
    }
    if (!o.Get("seq").IsUndefined())
        throw Napi::TypeError::New(env, "generate options.seq needs a context of several sequences (nSeq > 1)");

    acquire(env);
    resetStop(g.deadlineNs, g.cancellable);
    auto * worker = new GenerateWorker(env, Value(), this, std::move(segments), std::move(g), std::move(grammar), grammarObj, onTokens);
    Napi::Promise p = worker->promise();
    worker->Queue(*native_->thread);
    return p;
}

// generate() on a context of several sequences: queued to the scheduler; one request per sequence.
Napi::Value Context::GenerateOnSequence(const Napi::CallbackInfo & info, std::vector<Segment> segments, GenerateOptions g,
                                        GrammarInstance grammar, Napi::Object grammarObj) {
    Napi::Env env = info.Env();
    const int32_t seq = requireSeq(info[1].As<Napi::Object>().Get("seq"), "generate options.seq");
    if (busy_.load()) throw codedError(env, "EBUSY", "Context is busy: measureCeiling runs on it");
    if (seqJobs_[size_t(seq)] != nullptr) {
        throw codedError(env, "EBUSY", "sequence " + std::to_string(seq) + " is busy: one generation at a time per sequence");
    }
    auto job = std::make_unique<JsSeqJob>(env);
    job->seq = seq;
    job->segments = std::move(segments);
    job->opts = std::move(g);
    job->grammar = std::move(grammar);
    job->self = Napi::Persistent(Value());
    if (!grammarObj.IsEmpty()) job->grammarRef = Napi::Persistent(grammarObj);
    Napi::Promise p = job->deferred.Promise();
    seqJobs_[size_t(seq)] = job.get();
    if (inFlight_++ == 0) batchDone_.Ref(env);
    native_->batch->submit(std::move(job));
    return p;
}

// On the JS thread: a finished request's promise is settled and its sequence is free again.
void Context::settle(Napi::Env env, std::unique_ptr<SeqJob> job) {
    std::unique_ptr<JsSeqJob> j(static_cast<JsSeqJob *>(job.release()));
    seqJobs_[size_t(j->seq)] = nullptr;
    if (--inFlight_ == 0) batchDone_.Unref(env);
    if (!j->error.empty()) {
        j->deferred.Reject(codedError(env, j->errorCode != nullptr ? j->errorCode : "EGENERATE", j->error).Value());
    } else {
        j->deferred.Resolve(batchResultToJs(env, *j));
    }
}

int32_t Context::requireSeq(const Napi::Value & v, const char * where) const {
    Napi::Env env = v.Env();
    if (!v.IsNumber()) throw Napi::TypeError::New(env, std::string(where) + " must be a sequence number");
    const double d = v.As<Napi::Number>().DoubleValue();
    if (!(d >= 0 && d < double(opts_.nSeq)) || d != double(int64_t(d))) {
        throw Napi::RangeError::New(env, std::string(where) + " must be an integer between 0 and " + std::to_string(opts_.nSeq - 1));
    }
    return int32_t(d);
}

// cancel(): the running generation; on a context of several sequences, cancel(seq) that sequence's
// and cancel() every one.
Napi::Value Context::Cancel(const Napi::CallbackInfo & info) {
    if (native_->batch) {
        if (info.Length() > 0 && !info[0].IsUndefined()) {
            SeqJob * j = seqJobs_[size_t(requireSeq(info[0], "cancel seq"))];
            if (j != nullptr) j->cancelled.store(true);
        } else {
            for (SeqJob * j : seqJobs_)
                if (j != nullptr) j->cancelled.store(true);
        }
        return info.Env().Undefined();
    }
    int expected = 0;
    stop_.compare_exchange_strong(expected, 1);
    return info.Env().Undefined();
}

Napi::Value Context::ClearCache(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (native_->batch) {
        if (!native_) throw codedError(env, "EDISPOSED", "Context is disposed");
        const int32_t seq = requireSeq(info[0], "clearCache seq");
        if (seqJobs_[size_t(seq)] != nullptr) throw codedError(env, "EBUSY", "sequence " + std::to_string(seq) + " is busy");
        native_->batch->clear(seq);
        return env.Undefined();
    }
    acquire(env);
    llama_memory_seq_rm(llama_get_memory(raw()), 0, -1, -1);
    if (native_->spec) native_->spec->truncate(0);
    cache_.clear();
    releaseBusy();
    return env.Undefined();
}

// Step shapes given a graph key so far: changes with every decode, so not part of info().
Napi::Value Context::ShapeGraphShapes(const Napi::CallbackInfo & info) {
    return Napi::Number::New(info.Env(), double(native_->shapeGraphs ? native_->shapeGraphs->shapesKeyed() : 0));
}

Napi::Value Context::CachedPositions(const Napi::CallbackInfo & info) {
    if (native_->batch) return Napi::Number::New(info.Env(), native_->batch->cachedPositions(requireSeq(info[0], "cachedPositions seq")));
    int32_t n = 0;
    for (const auto & c : cache_) n += c.positions();
    return Napi::Number::New(info.Env(), n);
}

// expect(seq, delta): a context of several sequences: frames on their way to `seq` (+1 reserved, -1 submitted or dropped).
void Context::Expect(const Napi::CallbackInfo & info) {
    const int32_t seq = requireSeq(info[0], "expect seq");
    const double delta = info[1].IsNumber() ? info[1].As<Napi::Number>().DoubleValue() : 0;
    if (delta != 1 && delta != -1) throw Napi::TypeError::New(info.Env(), "expect delta must be 1 or -1");
    if (native_->batch) native_->batch->expect(seq, int32_t(delta));
}

// prediction(deadlineNs?: bigint, reservedAhead?: number): a context of several sequences: what its
// admission would predict for a request with that deadline submitted now, were `reservedAhead`
// more requests waiting before it: { waitMs, ownMs } (both 0: no prediction). One sequence: always 0.
Napi::Value Context::Prediction(const Napi::CallbackInfo & info) {
    int64_t deadlineNs = 0;
    if (info.Length() > 0 && !info[0].IsUndefined()) {
        if (!info[0].IsBigInt())
            throw Napi::TypeError::New(info.Env(), "prediction deadlineNs must be a bigint (process.hrtime.bigint() clock)");
        bool lossless = true;
        deadlineNs = std::max<int64_t>(info[0].As<Napi::BigInt>().Int64Value(&lossless), 1);
    }
    int32_t reservedAhead = 0;
    if (info.Length() > 1 && !info[1].IsUndefined()) {
        const double n = info[1].IsNumber() ? info[1].As<Napi::Number>().DoubleValue() : -1;
        if (!(n >= 0 && n <= 1e6 && n == std::floor(n)))
            throw Napi::TypeError::New(info.Env(), "prediction reservedAhead must be an integer in [0, 1e6]");
        reservedAhead = int32_t(n);
    }
    BatchScheduler::Prediction p;
    if (native_->batch) p = native_->batch->predicted(deadlineNs, reservedAhead);
    Napi::Object o = Napi::Object::New(info.Env());
    o.Set("waitMs", p.waitMs);
    o.Set("ownMs", p.ownMs);
    return o;
}

// restMs(seq): a context of several sequences: when the request of `seq` ends, predicted from now (ms); -1: none known
// (none submitted, or submitted after the last step). One sequence: always -1.
Napi::Value Context::RestMs(const Napi::CallbackInfo & info) {
    const int32_t seq = requireSeq(info[0], "restMs seq");
    return Napi::Number::New(info.Env(), native_->batch ? native_->batch->restMs(seq) : -1);
}

// timeAccount(): a context of several sequences: where its scheduler's time went so far (ms), as of its last step
// ({ groups, joins, steps, stepMs, imageMs, tokenMs, sampleMs, holdMs, and the counts: see batch.h }); null with one sequence.
Napi::Value Context::TimeAccount(const Napi::CallbackInfo & info) {
    if (!native_->batch) return info.Env().Null();
    const BatchScheduler::TimeAccount t = native_->batch->timeAccount();
    Napi::Object o = Napi::Object::New(info.Env());
    o.Set("groups", double(t.groups));
    o.Set("joins", double(t.joins));
    o.Set("steps", double(t.steps));
    o.Set("stepMs", t.stepMs);
    o.Set("imageMs", t.imageMs);
    o.Set("tokenMs", t.tokenMs);
    o.Set("sampleMs", t.sampleMs);
    o.Set("holdMs", t.holdMs);
    o.Set("imageDecodes", double(t.imageDecodes));
    o.Set("imageRows", double(t.imageRows));
    o.Set("tokenDecodes", double(t.tokenDecodes));
    o.Set("tokenRows", double(t.tokenRows));
    o.Set("tokenSeqs", double(t.tokenSeqs));
    o.Set("reusedDecodes", double(t.reusedDecodes));
    o.Set("reusedMs", t.reusedMs);
    o.Set("mixedDecodes", double(t.mixedDecodes));
    o.Set("mixedTokenRows", double(t.mixedTokenRows));
    o.Set("tailJoins", double(t.tailJoins));
    o.Set("tailHolds", double(t.tailHolds));
    return o;
}

// measureCeiling({ sequences, promptTokens, steps, repeats }): times raw decodes of that shape (timeCeiling, batch.h).
// Only with no request in flight; every sequence's KV cells and prompt cache are empty afterwards.
Napi::Value Context::MeasureCeiling(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (!native_) throw codedError(env, "EDISPOSED", "Context is disposed");
    Napi::Object o = requireObject(info[0], "measureCeiling options");
    const auto nSeq = int32_t(requireInt(o, "sequences", 1, llama_n_seq_max(raw()), "measureCeiling"));
    const auto promptTokens = int32_t(requireInt(o, "promptTokens", 1, 1 << 24, "measureCeiling"));
    const auto steps = int32_t(requireInt(o, "steps", 0, 1 << 24, "measureCeiling"));
    const auto repeats = int32_t(requireInt(o, "repeats", 1, 1000, "measureCeiling"));
    const int64_t nCtxSeq = native_->batch ? native_->batch->nCtxSeq() : int64_t(llama_n_ctx_seq(raw()));
    if (int64_t(promptTokens) + steps > nCtxSeq) {
        throw Napi::RangeError::New(env,
                                    "measureCeiling: promptTokens + steps (" + std::to_string(promptTokens + steps) +
                                        ") exceed the KV positions of one sequence (" + std::to_string(nCtxSeq) + ")");
    }
    if (inFlight_ > 0) throw codedError(env, "EBUSY", "Context is busy: measureCeiling needs no request in flight");
    acquire(env);
    auto * worker = new CeilingWorker(env, this, nSeq, promptTokens, steps, repeats);
    Napi::Promise p = worker->promise();
    worker->Queue(*native_->thread);
    return p;
}

void Context::dropBackendSamplers() {
    if (native_ && native_->batch) native_->batch->dropBackendSamplers();
}

void Context::forgetCaches() {
    if (!native_) return;
    if (native_->batch) {
        for (uint32_t seq = 0; seq < opts_.nSeq; seq++) native_->batch->clear(int32_t(seq));
        return;
    }
    if (native_->spec) native_->spec->truncate(0);
    cache_.clear();
}

// attachSpeculator(draftModel | null, options): creates the draft state off the JS thread; the
// KV cache starts empty afterwards.
Napi::Value Context::AttachSpeculator(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (!native_) throw codedError(env, "EDISPOSED", "Context is disposed");
    if (native_->batch)
        throw Napi::Error::New(env, "attachSpeculator: a context of several sequences decodes them in one batch, without drafts");
    SpecOptions s = parseSpecOptions(requireObject(info[1], "attachSpeculator options"), opts_);
    Model * draft = checkDraftModel(env, info[0], s, *model_);
    if (native_->spec) throw codedError(env, "EBUSY", "the context already has a speculator; detach it first");
    acquire(env);
    auto * worker = new AttachWorker(env, this, info[0], draft, std::move(s));
    Napi::Promise p = worker->promise();
    worker->Queue(*native_->thread);
    return p;
}

// Frees the speculator; the next generation starts from an empty KV cache, as after attaching.
Napi::Value Context::DetachSpeculator(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (!native_ || !native_->spec) return env.Undefined();
    acquire(env);  // EBUSY while a generation runs
    native_->spec.reset();
    draftModelRef_.Reset();
    cache_.clear();
    llama_memory_seq_rm(llama_get_memory(raw()), 0, -1, -1);
    releaseBusy();
    return env.Undefined();
}

Napi::Value Context::Dispose(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (!native_) return env.Undefined();
    if (busy_.load() || inFlight_ > 0) {
        throw codedError(env, "EBUSY", "Context is busy; cancel and await the running operation before dispose()");
    }
    freeNative();
    return env.Undefined();
}

}  // namespace percept
