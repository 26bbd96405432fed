#include "speculator.h"

#include "context.h"
#include "model.h"
#include "util.h"

#include "speculative.h"

namespace percept {

namespace {

struct SpecOptions {
    std::string type;
    int32_t nMax = 4;
    int32_t nMin = 0;
    float pMin = 0.0f;
    int32_t ngramN = 3;
};

struct SpecParts {
    llama_context * ctxDft = nullptr;
    common_speculative * spec = nullptr;
    std::string type;
    int32_t nMax = 0;
};

class SpecCreateWorker : public PromiseWorker {
public:
    SpecCreateWorker(Napi::Env env, Napi::Object ctxObj, Context * ctx, Napi::Value draftObj, Model * draft, SpecOptions opts)
        : PromiseWorker(env, "percept:Speculator.create", "ESPECULATOR"), ctx_(ctx), draft_(draft), opts_(std::move(opts)) {
        ctxRef_ = Napi::Persistent(ctxObj);
        if (draft_ != nullptr) {
            draftRef_ = Napi::Persistent(draftObj.As<Napi::Object>());
            draft_->retain();
        }
    }
    ~SpecCreateWorker() override {
        if (parts_.spec != nullptr) common_speculative_free(parts_.spec);
        if (parts_.ctxDft != nullptr) llama_free(parts_.ctxDft);
        if (draft_ != nullptr) draft_->release();
    }

protected:
    void Execute() override {
        try {
            llama_context * tgt = ctx_->raw();
            common_params_speculative params;
            params.types = {common_speculative_type_from_name(opts_.type)};
            params.draft.n_max = opts_.nMax;
            params.draft.n_min = opts_.nMin;
            params.draft.p_min = opts_.pMin;
            params.draft.backend_sampling = false;  // draft sampling on the CPU sampler: same on every backend
            params.draft.ctx_tgt = tgt;
            params.ngram_simple.size_n = uint16_t(opts_.ngramN);
            params.ngram_simple.size_m = uint16_t(opts_.nMax);
            params.ngram_map_k.size_n = uint16_t(opts_.ngramN);
            params.ngram_map_k.size_m = uint16_t(opts_.nMax);
            params.ngram_map_k4v.size_n = uint16_t(opts_.ngramN);
            params.ngram_map_k4v.size_m = uint16_t(opts_.nMax);

            if (draft_ != nullptr) {
                const ContextOptions & to = ctx_->options();
                llama_context_params cp = llama_context_default_params();
                cp.n_ctx = llama_n_ctx(tgt);
                cp.n_batch = to.nBatch;
                cp.n_ubatch = to.nUbatch;
                cp.n_seq_max = 1;
                cp.n_outputs_max = 1;
                cp.n_threads = to.threads;
                cp.n_threads_batch = to.threads;
                cp.flash_attn_type = llama_flash_attn_type(to.flashAttention);
                cp.swa_full = true;
                cp.no_perf = true;
                if (opts_.type == "draft-mtp") {
                    cp.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
                    cp.ctx_other = tgt;  // the assistant reads the target's KV and token embeddings
                }
                LogCapture capture;
                parts_.ctxDft = llama_init_from_model(draft_->raw(), cp);
                if (parts_.ctxDft == nullptr) {
                    std::string why = capture.text();
                    SetError("failed to create the draft context" + (why.empty() ? std::string() : ": " + why));
                    return;
                }
                if (to.threadpool != nullptr) llama_attach_threadpool(parts_.ctxDft, to.threadpool, nullptr);
                params.draft.ctx_dft = parts_.ctxDft;
            }
            parts_.spec = common_speculative_init(params, 1);
            if (parts_.spec == nullptr) {
                SetError("common_speculative_init returned no implementation for '" + opts_.type + "'");
                return;
            }
            parts_.type = opts_.type;
            parts_.nMax = common_speculative_n_max(parts_.spec);
            if (parts_.nMax <= 0) parts_.nMax = opts_.nMax;
            parts_.nMax = std::min(parts_.nMax, opts_.nMax);
            // The draft state must see every target batch from now on: start from an empty cache.
            llama_memory_seq_rm(llama_get_memory(tgt), 0, -1, -1);
            if (parts_.ctxDft != nullptr) {
                llama_memory_t m = llama_get_memory(parts_.ctxDft);
                if (m != nullptr) llama_memory_seq_rm(m, 0, -1, -1);
            }
        } catch (const std::exception & e) {
            SetError(std::string("failed to create speculator: ") + e.what());
        }
    }
    void OnOK() override {
        Napi::Env env = Env();
        ctx_->cache().clear();
        ctx_->releaseBusy();
        auto * parts = new SpecParts(parts_);
        parts_ = SpecParts{};
        Napi::Object obj =
            addonData(env).speculatorCtor.New({ctxRef_.Value(), draft_ != nullptr ? draftRef_.Value() : env.Null(),
                                               Napi::External<SpecParts>::New(env, parts, [](Napi::Env, SpecParts * p) { delete p; })});
        deferred_.Resolve(obj);
    }
    void OnError(const Napi::Error & e) override {
        ctx_->releaseBusy();
        PromiseWorker::OnError(e);
    }

private:
    Napi::ObjectReference ctxRef_;
    Napi::ObjectReference draftRef_;
    Context * ctx_;
    Model * draft_;
    SpecOptions opts_;
    SpecParts parts_;
};

}  // namespace

Napi::Function Speculator::Init(Napi::Env env) {
    return DefineClass(env, "Speculator",
                       {
                           StaticMethod<&Speculator::Create>("create"),
                           InstanceMethod<&Speculator::Info>("info"),
                           InstanceMethod<&Speculator::Dispose>("dispose"),
                       });
}

Speculator::Speculator(const Napi::CallbackInfo & info) : Napi::ObjectWrap<Speculator>(info) {
    Napi::Env env = info.Env();
    if (info.Length() < 3 || !info[2].IsExternal()) {
        throw Napi::TypeError::New(env, "Speculator cannot be constructed directly; use Speculator.create(context, options)");
    }
    contextRef_ = Napi::Persistent(info[0].As<Napi::Object>());
    context_ = Context::Unwrap(info[0].As<Napi::Object>());
    if (info[1].IsObject()) {
        draftModelRef_ = Napi::Persistent(info[1].As<Napi::Object>());
        draftModel_ = Model::Unwrap(info[1].As<Napi::Object>());
        draftModel_->retain();
    }
    SpecParts * p = info[2].As<Napi::External<SpecParts>>().Data();
    ctxDft_ = p->ctxDft;
    spec_ = p->spec;
    type_ = p->type;
    nMax_ = p->nMax;
    *p = SpecParts{};
    context_->attach(this);
}

Speculator::~Speculator() { freeNative(); }

void Speculator::freeNative() {
    if (context_ == nullptr) return;
    context_->detach(this);
    if (spec_ != nullptr) common_speculative_free(spec_);
    spec_ = nullptr;
    if (ctxDft_ != nullptr) llama_free(ctxDft_);
    ctxDft_ = nullptr;
    if (draftModel_ != nullptr) draftModel_->release();
    draftModel_ = nullptr;
    context_ = nullptr;
    // References are dropped lazily (Reset needs the JS thread; we are on it in every caller).
    draftModelRef_.Reset();
    contextRef_.Reset();
}

Napi::Value Speculator::Create(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    AddonData & ad = addonData(env);
    if (!info[0].IsObject() || !info[0].As<Napi::Object>().InstanceOf(ad.contextCtor.Value())) {
        throw Napi::TypeError::New(env, "Speculator.create: expected a Context as the first argument");
    }
    Context * ctx = Context::Unwrap(info[0].As<Napi::Object>());
    Napi::Object o = requireObject(info[1], "Speculator.create options");
    const char * w = "Speculator.create options";
    SpecOptions s;
    s.type = optString(o, "type", "", w);
    static const char * const kTypes[] = {"draft-simple", "draft-mtp", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod"};
    bool known = false;
    for (const char * t : kTypes) known = known || s.type == t;
    if (!known) {
        throw Napi::TypeError::New(env,
                                   "Speculator.create options.type must be one of draft-simple, draft-mtp, ngram-simple, "
                                   "ngram-map-k, ngram-map-k4v, ngram-mod (got '" +
                                       s.type + "')");
    }
    s.nMax = int32_t(optInt(o, "nMax", 4, 1, 64, w));
    s.nMin = int32_t(optInt(o, "nMin", 0, 0, s.nMax, w));
    s.pMin = float(optNumber(o, "pMin", 0.0, w));
    s.ngramN = int32_t(optInt(o, "ngramN", 3, 1, 64, w));
    if (uint32_t(s.nMax) + 1 > ctx->options().maxOutputs) {
        throw Napi::RangeError::New(env,
                                    "Speculator.create: nMax " + std::to_string(s.nMax) + " needs a context with maxOutputs >= " +
                                        std::to_string(s.nMax + 1) + " (it has " + std::to_string(ctx->options().maxOutputs) + ")");
    }
    Model * draft = nullptr;
    Napi::Value draftObj = o.Get("draftModel");
    const bool needsDraft = s.type == "draft-simple" || s.type == "draft-mtp";
    if (needsDraft) {
        if (!draftObj.IsObject() || !draftObj.As<Napi::Object>().InstanceOf(ad.modelCtor.Value())) {
            throw Napi::TypeError::New(env, "Speculator.create options.draftModel must be a Model for type " + s.type);
        }
        draft = Model::Unwrap(draftObj.As<Napi::Object>());
        draft->require(env);
        const std::string & da = draft->info().arch;
        const std::string & ta = ctx->model()->info().arch;
        if (s.type == "draft-mtp" && (da != "gemma4-assistant" || ta != "gemma4")) {
            throw Napi::TypeError::New(env, "draft-mtp needs a gemma4-assistant draft for a gemma4 target (got " + da + " for " + ta + ")");
        }
        if (s.type == "draft-simple" && da == "gemma4-assistant") {
            throw Napi::TypeError::New(env, "a gemma4-assistant model drafts only with type 'draft-mtp'");
        }
        if (draft->info().vocabOnly) throw Napi::TypeError::New(env, "the draft model was loaded with vocabOnly");
    } else if (!draftObj.IsUndefined()) {
        throw Napi::TypeError::New(env, "Speculator.create options.draftModel is only for draft-simple and draft-mtp");
    }
    if (ctx->speculator() != nullptr) {
        throw codedError(env, "EBUSY", "the context already has a speculator; dispose it first");
    }
    ctx->acquire(env);
    auto * worker = new SpecCreateWorker(env, info[0].As<Napi::Object>(), ctx, draftObj, draft, s);
    Napi::Promise p = worker->promise();
    worker->Queue();
    return p;
}

Napi::Value Speculator::Info(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    Napi::Object o = Napi::Object::New(env);
    o.Set("type", type_);
    o.Set("nMax", nMax_);
    o.Set("disposed", context_ == nullptr);
    return o;
}

Napi::Value Speculator::Dispose(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (context_ == nullptr) return env.Undefined();
    context_->acquire(env);  // EBUSY while a generation runs
    Context * c = context_;
    freeNative();
    // The target cache stays valid (its KV is untouched), but drop it anyway for symmetry with
    // create(): the next generation starts clean.
    c->cache().clear();
    llama_memory_seq_rm(llama_get_memory(c->raw()), 0, -1, -1);
    c->releaseBusy();
    return env.Undefined();
}

}  // namespace percept
