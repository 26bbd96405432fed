// Speculator: speculative decoding for one Context through llama.cpp's common/speculative
// (draft model, Gemma 4 MTP assistant, or n-gram lookup). It owns the draft llama_context and
// the common_speculative state; the Context's generation loop drives it.
#pragma once

#include <napi.h>

#include "llama.h"

#include <string>

struct common_speculative;

namespace percept {

class Context;
class Model;

class Speculator : public Napi::ObjectWrap<Speculator> {
public:
    static Napi::Function Init(Napi::Env env);
    explicit Speculator(const Napi::CallbackInfo & info);
    ~Speculator() override;

    common_speculative * spec() const { return spec_; }
    llama_context * draftContext() const { return ctxDft_; }
    const std::string & type() const { return type_; }
    int32_t nMax() const { return nMax_; }
    // draft-simple keeps its own KV, which must mirror the target's positions.
    bool ownsMemory() const { return type_ == "draft-simple"; }

    // Called by Context::Dispose / the destructor path.
    void freeNative();

private:
    static Napi::Value Create(const Napi::CallbackInfo & info);
    Napi::Value Info(const Napi::CallbackInfo & info);
    Napi::Value Dispose(const Napi::CallbackInfo & info);

    Napi::ObjectReference contextRef_;
    Napi::ObjectReference draftModelRef_;
    Context * context_ = nullptr;
    Model * draftModel_ = nullptr;
    llama_context * ctxDft_ = nullptr;
    common_speculative * spec_ = nullptr;
    std::string type_;
    int32_t nMax_ = 0;
};

}  // namespace percept
