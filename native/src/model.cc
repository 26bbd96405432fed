#include "model.h"

#include "chat.h"
#include "util.h"
#include "ggml-backend.h"
#include "gguf.h"

#include <cstdio>
#include <cstring>
#include <memory>
#include <regex>
#include <sys/stat.h>

namespace percept {

namespace {

const char * const kAcceptedArchs[] = {"gemma3", "gemma4", "gemma4-assistant"};

bool acceptedArch(const std::string & arch) {
    for (const char * a : kAcceptedArchs)
        if (arch == a) return true;
    return false;
}

// Looks a special token up by its text; -1 when the vocabulary has no single token for it.
int32_t tokenByText(const llama_vocab * vocab, const char * text) {
    llama_token out[4];
    int n = llama_tokenize(vocab, text, int32_t(strlen(text)), out, 4, false, true);
    if (n != 1) return -1;
    const char * t = llama_vocab_get_text(vocab, out[0]);
    return t != nullptr && strcmp(t, text) == 0 ? out[0] : -1;
}

std::string metaString(const llama_model * model, const char * key) {
    char buf[256];
    int n = llama_model_meta_val_str(model, key, buf, sizeof(buf));
    return n < 0 ? std::string() : std::string(buf);
}

struct LoadOptions {
    std::string path;
    int32_t gpuLayers = 0;
    bool mmap = true;
    bool vocabOnly = false;
    int32_t perLayerEmbeddingsOnGpu = -1;   // 1 on, 0 off, -1 when every layer is offloaded
    std::string perLayerEmbeddingsPattern;  // the table's name, a regex (native/llama.ts PER_LAYER_EMBEDDINGS)
};

struct FileHeader {
    std::string arch;
    int64_t blockCount = -1;     // <arch>.block_count; -1 when absent
    bool perLayerTable = false;  // a tensor matches LoadOptions.perLayerEmbeddingsPattern
};

// Reads general.architecture, the layer count and the tensor names without loading tensors, so an unsupported or
// corrupt file is refused with a clear reason before llama.cpp starts allocating.
FileHeader readHeader(const std::string & path, const std::string & perLayerPattern) {
    gguf_init_params params{/*no_alloc=*/true, /*ctx=*/nullptr};
    gguf_context * g = gguf_init_from_file(path.c_str(), params);
    if (g == nullptr) throw std::runtime_error("not a valid GGUF file (bad magic, version or truncated header)");
    FileHeader h;
    int64_t k = gguf_find_key(g, "general.architecture");
    if (k >= 0 && gguf_get_kv_type(g, k) == GGUF_TYPE_STRING) h.arch = gguf_get_val_str(g, k);
    int64_t b = h.arch.empty() ? -1 : gguf_find_key(g, (h.arch + ".block_count").c_str());
    if (b >= 0 && gguf_get_kv_type(g, b) == GGUF_TYPE_UINT32) h.blockCount = gguf_get_val_u32(g, b);
    // Matched as llama.cpp matches tensor overrides (std::regex_search).
    const std::regex table(perLayerPattern);
    for (int64_t i = 0; i < gguf_get_n_tensors(g) && !h.perLayerTable; i++)
        h.perLayerTable = std::regex_search(gguf_get_tensor_name(g, i), table);
    gguf_free(g);
    if (h.arch.empty()) throw std::runtime_error("GGUF has no general.architecture");
    return h;
}

// Where layer 0 goes by default: the first GPU, or an integrated one (Jetson).
ggml_backend_buffer_type_t firstGpuBufferType() {
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_GPU);
    if (dev == nullptr) dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_IGPU);
    return dev == nullptr ? nullptr : ggml_backend_dev_buffer_type(dev);
}

class LoadWorker : public PromiseWorker {
public:
    LoadWorker(Napi::Env env, LoadOptions opts) : PromiseWorker(env, "percept:Model.load", "EMODEL"), opts_(std::move(opts)) {}

protected:
    void Execute() override {
        try {
            struct stat st {};
            if (stat(opts_.path.c_str(), &st) != 0) {
                SetCodedError("ENOENT", "ENOENT: model file not found: " + opts_.path);
                return;
            }
            FileHeader header = readHeader(opts_.path, opts_.perLayerEmbeddingsPattern);
            const std::string & arch = header.arch;
            if (!acceptedArch(arch)) {
                SetError("unsupported architecture '" + arch + "' in " + opts_.path +
                         " (percept accepts gemma3 and gemma4 targets and gemma4-assistant drafts)");
                return;
            }
            LogCapture capture;
            llama_model_params mp = llama_model_default_params();
            mp.n_gpu_layers = opts_.gpuLayers;
            mp.load_mode = opts_.mmap ? LLAMA_LOAD_MODE_AUTO : LLAMA_LOAD_MODE_NONE;
            mp.vocab_only = opts_.vocabOnly;
            const bool everyLayer = opts_.gpuLayers < 0 || (header.blockCount >= 0 && opts_.gpuLayers > header.blockCount);
            ggml_backend_buffer_type_t gpu = opts_.vocabOnly ? nullptr : firstGpuBufferType();
            const bool wanted = opts_.perLayerEmbeddingsOnGpu == 1 || (opts_.perLayerEmbeddingsOnGpu < 0 && everyLayer);
            if (gpu != nullptr && header.perLayerTable && wanted) {
                // llama.cpp keeps input-layer tensors in host memory: each decode gathers its rows of Gemma 4's
                // per-layer table on the CPU and copies them over. On the GPU that part of the decode stays there.
                overrides_[0] = {opts_.perLayerEmbeddingsPattern.c_str(), gpu};
                mp.tensor_buft_overrides = overrides_;
                // A lazily read table (over 4 GiB) would stay in host memory whatever the override says.
                mp.lazy_mode = LLAMA_LAZY_MODE_OFF;
                perLayerEmbeddingsOnGpu_ = true;
            }
            model_.reset(llama_model_load_from_file(opts_.path.c_str(), mp));
            if (!model_) {
                std::string why = capture.text();
                SetError("failed to load model " + opts_.path + (why.empty() ? std::string() : ": " + why));
            }
        } catch (const std::exception & e) {
            SetError(std::string("failed to load model ") + opts_.path + ": " + e.what());
        }
    }
    void OnOK() override {
        Napi::Env env = Env();
        // Ownership moves to the JS object: a load that never resolves frees the model with the worker.
        Napi::Object obj =
            addonData(env).modelCtor.New({Napi::External<llama_model>::New(env, model_.release()), Napi::Boolean::New(env, opts_.vocabOnly),
                                          Napi::Boolean::New(env, perLayerEmbeddingsOnGpu_)});
        deferred_.Resolve(obj);
    }

private:
    LoadOptions opts_;
    llama_model_ptr model_;
    llama_model_tensor_buft_override overrides_[2] = {{nullptr, nullptr}, {nullptr, nullptr}};
    bool perLayerEmbeddingsOnGpu_ = false;
};

}  // namespace

std::string imageAttentionRule(const std::string & arch, int32_t nEmbdInp) {
    if (arch == "gemma3") return "bidirectional";
    if (arch == "gemma4") return (nEmbdInp == 1536 || nEmbdInp == 2560) ? "causal" : "bidirectional-swa";
    return "causal";
}

Napi::Function Model::Init(Napi::Env env) {
    return DefineClass(env, "Model",
                       {
                           StaticMethod<&Model::Load>("load"),
                           InstanceMethod<&Model::Info>("info"),
                           InstanceMethod<&Model::Tokenize>("tokenize"),
                           InstanceMethod<&Model::Detokenize>("detokenize"),
                           InstanceMethod<&Model::TokenText>("tokenText"),
                           InstanceMethod<&Model::ApplyChatTemplate>("applyChatTemplate"),
                           InstanceMethod<&Model::Dispose>("dispose"),
                       });
}

Model::Model(const Napi::CallbackInfo & info) : Napi::ObjectWrap<Model>(info) {
    Napi::Env env = info.Env();
    if (info.Length() < 2 || !info[0].IsExternal()) {
        throw Napi::TypeError::New(env, "Model cannot be constructed directly; use Model.load(path, options)");
    }
    model_.reset(info[0].As<Napi::External<llama_model>>().Data());
    const llama_vocab * v = vocab();
    info_.arch = metaString(model_.get(), "general.architecture");
    info_.nEmbd = llama_model_n_embd_inp(model_.get());
    info_.nEmbdText = llama_model_n_embd(model_.get());
    info_.nEmbdOut = llama_model_n_embd_out(model_.get());
    info_.nVocab = llama_vocab_n_tokens(v);
    info_.nLayer = llama_model_n_layer(model_.get());
    info_.nCtxTrain = llama_model_n_ctx_train(model_.get());
    info_.sizeBytes = llama_model_size(model_.get());
    info_.nParams = llama_model_n_params(model_.get());
    const char * tmpl = llama_model_chat_template(model_.get(), nullptr);
    info_.chatTemplate = tmpl ? tmpl : "";
    if (info_.arch == "gemma3") {
        info_.imageStartToken = tokenByText(v, "<start_of_image>");
        info_.imageEndToken = tokenByText(v, "<end_of_image>");
    }
    if (info_.imageStartToken < 0 || info_.imageEndToken < 0) {
        info_.imageStartToken = tokenByText(v, "<|image>");
        info_.imageEndToken = tokenByText(v, "<image|>");
    }
    info_.imageAttention = imageAttentionRule(info_.arch, info_.nEmbd);
    info_.bos = llama_vocab_bos(v);
    info_.eos = llama_vocab_eos(v);
    info_.vocabOnly = info[1].ToBoolean().Value();
    info_.perLayerEmbeddingsOnGpu = info.Length() > 2 && info[2].ToBoolean().Value();
}

// GC without dispose(): contexts hold a reference to this object, so none is alive here.
Model::~Model() = default;

llama_model * Model::require(Napi::Env env) const {
    if (!model_) throw codedError(env, "EDISPOSED", "Model is disposed");
    return model_.get();
}

const std::vector<std::vector<llama_token>> & Model::tokensByFirstByte() {
    std::call_once(byFirstByteOnce_, [this]() {
        byFirstByte_.assign(257, {});
        const llama_vocab * v = vocab();
        std::string piece(64, '\0');
        for (llama_token id = 0; id < info_.nVocab; id++) {
            if (llama_vocab_is_eog(v, id)) {
                byFirstByte_[256].push_back(id);
                continue;
            }
            // The piece with special tokens rendered: what the grammar matches a token against.
            int32_t n = llama_token_to_piece(v, id, piece.data(), int32_t(piece.size()), 0, true);
            if (n < 0) {
                piece.resize(size_t(-n));
                n = llama_token_to_piece(v, id, piece.data(), int32_t(piece.size()), 0, true);
            }
            if (n <= 0 || piece[0] == 0) continue;
            byFirstByte_[uint8_t(piece[0])].push_back(id);
        }
    });
    return byFirstByte_;
}

Napi::Value Model::Load(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    LoadOptions opts;
    opts.path = requireString(info[0], "Model.load path");
    if (opts.path.empty()) throw Napi::TypeError::New(env, "Model.load: path is empty");
    const char * w = "Model.load options";
    Napi::Object o = requireObject(info[1], w);
    opts.gpuLayers = int32_t(requireInt(o, "gpuLayers", -1, 100000, w));
    opts.mmap = requireBool(o, "mmap", w);
    opts.vocabOnly = requireBool(o, "vocabOnly", w);
    Napi::Value e = o.Get("perLayerEmbeddingsOnGpu");
    opts.perLayerEmbeddingsOnGpu = e.IsUndefined() || e.IsNull() ? -1 : (requireBool(o, "perLayerEmbeddingsOnGpu", w) ? 1 : 0);
    opts.perLayerEmbeddingsPattern = requireString(o, "perLayerEmbeddingsPattern", w);
    auto * worker = new LoadWorker(env, std::move(opts));
    Napi::Promise p = worker->promise();
    worker->Queue();
    return p;
}

Napi::Value Model::Info(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    require(env);
    Napi::Object o = Napi::Object::New(env);
    o.Set("arch", info_.arch);
    o.Set("nEmbd", info_.nEmbd);
    o.Set("nEmbdText", info_.nEmbdText);
    o.Set("nEmbdOut", info_.nEmbdOut);
    o.Set("nVocab", info_.nVocab);
    o.Set("nLayer", info_.nLayer);
    o.Set("nCtxTrain", info_.nCtxTrain);
    o.Set("sizeBytes", double(info_.sizeBytes));
    o.Set("nParams", double(info_.nParams));
    o.Set("chatTemplate", info_.chatTemplate.empty() ? env.Null() : Napi::String::New(env, info_.chatTemplate));
    o.Set("imageStartToken", info_.imageStartToken < 0 ? env.Null() : Napi::Number::New(env, info_.imageStartToken));
    o.Set("imageEndToken", info_.imageEndToken < 0 ? env.Null() : Napi::Number::New(env, info_.imageEndToken));
    o.Set("imageAttention", info_.imageAttention);
    o.Set("bos", info_.bos);
    o.Set("eos", info_.eos);
    o.Set("vocabOnly", info_.vocabOnly);
    o.Set("perLayerEmbeddingsOnGpu", info_.perLayerEmbeddingsOnGpu);
    return o;
}

Napi::Value Model::Tokenize(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    require(env);
    std::string text = requireString(info[0], "tokenize text");
    bool addSpecial = info[1].ToBoolean().Value();
    bool parseSpecial = info[2].ToBoolean().Value();
    int32_t cap = int32_t(text.size()) + 8;
    std::vector<llama_token> out(cap);
    int32_t n = llama_tokenize(vocab(), text.data(), int32_t(text.size()), out.data(), cap, addSpecial, parseSpecial);
    if (n < 0) {
        out.resize(-n);
        n = llama_tokenize(vocab(), text.data(), int32_t(text.size()), out.data(), -n, addSpecial, parseSpecial);
    }
    if (n < 0) throw Napi::Error::New(env, "tokenize failed");
    Napi::Int32Array arr = Napi::Int32Array::New(env, n);
    std::copy(out.begin(), out.begin() + n, arr.Data());
    return arr;
}

Napi::Value Model::Detokenize(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    require(env);
    std::vector<int32_t> tokens = requireTokens(info[0], info_.nVocab, "detokenize tokens");
    bool special = info[1].ToBoolean().Value();
    std::string out(tokens.size() * 8 + 16, '\0');
    int32_t n = llama_detokenize(vocab(), tokens.data(), int32_t(tokens.size()), out.data(), int32_t(out.size()), false, special);
    if (n < 0) {
        out.resize(-n);
        n = llama_detokenize(vocab(), tokens.data(), int32_t(tokens.size()), out.data(), int32_t(out.size()), false, special);
    }
    if (n < 0) throw Napi::Error::New(env, "detokenize failed");
    out.resize(n);
    return Napi::String::New(env, out);
}

Napi::Value Model::TokenText(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    require(env);
    double d = info[0].IsNumber() ? info[0].As<Napi::Number>().DoubleValue() : -1;
    if (d < 0 || d >= info_.nVocab || d != double(int32_t(d))) {
        throw Napi::RangeError::New(env, "tokenText: token id out of range [0, " + std::to_string(info_.nVocab) + ")");
    }
    const char * text = llama_vocab_get_text(vocab(), int32_t(d));
    return Napi::String::New(env, text ? text : "");
}

Napi::Value Model::ApplyChatTemplate(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    require(env);
    if (!info[0].IsArray()) throw Napi::TypeError::New(env, "applyChatTemplate: expected an array of {role, content}");
    Napi::Array arr = info[0].As<Napi::Array>();
    bool addGenerationPrompt = info[1].ToBoolean().Value();
    common_chat_templates_inputs inputs;
    inputs.add_generation_prompt = addGenerationPrompt;
    inputs.use_jinja = true;
    inputs.enable_thinking = false;
    for (uint32_t i = 0; i < arr.Length(); i++) {
        std::string where = "applyChatTemplate messages[" + std::to_string(i) + "]";
        Napi::Object m = requireObject(arr.Get(i), where.c_str());
        common_chat_msg msg;
        msg.role = requireString(m.Get("role"), (where + ".role").c_str());
        msg.content = requireString(m.Get("content"), (where + ".content").c_str());
        inputs.messages.push_back(std::move(msg));
    }
    try {
        common_chat_templates_ptr tmpls = common_chat_templates_init(model_.get(), "");
        common_chat_params params = common_chat_templates_apply(tmpls.get(), inputs);
        return Napi::String::New(env, params.prompt);
    } catch (const std::exception & e) {
        throw Napi::Error::New(env, std::string("applyChatTemplate: the model's chat template failed: ") + e.what());
    }
}

Napi::Value Model::Dispose(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (!model_) return env.Undefined();
    if (users_.load() > 0) {
        throw codedError(env, "EBUSY",
                         "Model is used by " + std::to_string(users_.load()) +
                             " open context(s) (as their model or draft model); dispose them first");
    }
    model_.reset();
    return env.Undefined();
}

}  // namespace percept
