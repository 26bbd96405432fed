// Model: one llama_model. Loaded off the JS thread; disposed explicitly (idempotent) or by GC.
#pragma once

#include <napi.h>

#include "grammar-index.h"
#include "llama-cpp.h"

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

namespace percept {

struct ModelInfo {
    std::string arch;
    int32_t nEmbd = 0;      // llama_model_n_embd_inp: the row width of image embeddings
    int32_t nEmbdText = 0;  // llama_model_n_embd
    int32_t nEmbdOut = 0;
    int32_t nVocab = 0;
    int32_t nLayer = 0;
    int32_t nCtxTrain = 0;
    uint64_t sizeBytes = 0;
    uint64_t nParams = 0;
    std::string chatTemplate;  // empty: none
    int32_t imageStartToken = -1;
    int32_t imageEndToken = -1;
    std::string imageAttention;  // 'causal' | 'bidirectional' | 'bidirectional-swa'
    int32_t bos = -1;
    int32_t eos = -1;
    bool vocabOnly = false;
    bool perLayerEmbeddingsOnGpu = false;  // per_layer_token_embd loaded on the GPU (LoadOptions)
};

// How image embeddings attend to each other, mirroring mtmd_decode_use_non_causal() (mtmd.cpp):
// Gemma 3 bidirectional; Gemma 4 E2B/E4B (text width 1536/2560) causal; other Gemma 4
// bidirectional on sliding-window layers only (llama_set_causal_attn(false) gives SWA-only there).
std::string imageAttentionRule(const std::string & arch, int32_t nEmbdInp);

class Model : public Napi::ObjectWrap<Model> {
public:
    static Napi::Function Init(Napi::Env env);
    explicit Model(const Napi::CallbackInfo & info);
    ~Model() override;

    // Throws EDISPOSED when the model was disposed.
    llama_model * require(Napi::Env env) const;
    llama_model * raw() const { return model_.get(); }
    const llama_vocab * vocab() const { return llama_model_get_vocab(model_.get()); }
    const ModelInfo & info() const { return info_; }

    // Tokens grouped by the first byte of their piece (as the grammar sees pieces), built once;
    // entry 256 lists the end-of-generation tokens.
    const std::vector<std::vector<llama_token>> & tokensByFirstByte();

    // The vocabulary trie and the grammar indexes built on it (thread-safe; built off the JS thread).
    GrammarIndexCache & grammarIndexCache() { return grammarIndexCache_; }

    void retain() { users_++; }
    void release() { users_--; }

private:
    static Napi::Value Load(const Napi::CallbackInfo & info);
    Napi::Value Info(const Napi::CallbackInfo & info);
    Napi::Value Tokenize(const Napi::CallbackInfo & info);
    Napi::Value Detokenize(const Napi::CallbackInfo & info);
    Napi::Value TokenText(const Napi::CallbackInfo & info);
    Napi::Value ApplyChatTemplate(const Napi::CallbackInfo & info);
    Napi::Value Dispose(const Napi::CallbackInfo & info);

    llama_model_ptr model_;  // null once disposed
    ModelInfo info_;
    std::atomic<int> users_{0};  // contexts and speculators using this model
    std::once_flag byFirstByteOnce_;
    std::vector<std::vector<llama_token>> byFirstByte_;
    GrammarIndexCache grammarIndexCache_;
};

}  // namespace percept
