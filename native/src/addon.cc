// percept native addon: entry point. Registers Model, Context, Grammar, Vision and a few
// free functions (JSON Schema → GBNF, logging, system info, preprocessing's pixel layout).
#include <napi.h>

#include "context.h"
#include "device-jpeg.h"
#include "grammar.h"
#include "json-schema-to-grammar.h"
#include "llama.h"
#include "model.h"
#include "pixels.h"
#include "util.h"
#include "vision-attention.h"
#include "vision.h"

namespace percept {
namespace {

Napi::Value JsonSchemaToGrammar(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    std::string text = requireString(info[0], "jsonSchemaToGrammar schema (JSON text)");
    try {
        return Napi::String::New(env, json_schema_to_grammar(common_json::parse(text)));
    } catch (const std::exception & e) {
        throw Napi::Error::New(env, std::string("jsonSchemaToGrammar: ") + e.what());
    }
}

Napi::Value SetLogger(const Napi::CallbackInfo & info) {
    setLogForwarder(info.Env(), info[0]);
    return info.Env().Undefined();
}

Napi::Value SystemInfo(const Napi::CallbackInfo & info) { return Napi::String::New(info.Env(), llama_print_system_info()); }

Napi::Value ImageAttentionRule(const Napi::CallbackInfo & info) {
    std::string arch = requireString(info[0], "imageAttentionRule arch");
    if (!info[1].IsNumber()) throw Napi::TypeError::New(info.Env(), "imageAttentionRule: nEmbd must be a number");
    return Napi::String::New(info.Env(), imageAttentionRule(arch, info[1].As<Napi::Number>().Int32Value()));
}

}  // namespace
}  // namespace percept

static Napi::Object InitAddon(Napi::Env env, Napi::Object exports) {
    using namespace percept;
    auto * data = new AddonData();
    env.SetInstanceData<AddonData>(data);
    installLogger(env, *data);
    llama_backend_init();
    ggml_backend_load_all();

    Napi::Function model = Model::Init(env);
    Napi::Function context = Context::Init(env);
    Napi::Function grammar = Grammar::Init(env);
    data->modelCtor = Napi::Persistent(model);
    data->contextCtor = Napi::Persistent(context);
    data->grammarCtor = Napi::Persistent(grammar);

    exports.Set("Model", model);
    exports.Set("Context", context);
    exports.Set("Grammar", grammar);
    exports.Set("Vision", Vision::Init(env));  // clip (tools/mtmd) vision encoder, native/src/vision.cc
    exports.Set("jsonSchemaToGrammar", Napi::Function::New<JsonSchemaToGrammar>(env, "jsonSchemaToGrammar"));
    exports.Set("setLogger", Napi::Function::New<SetLogger>(env, "setLogger"));
    exports.Set("systemInfo", Napi::Function::New<SystemInfo>(env, "systemInfo"));
    exports.Set("imageAttentionRule", Napi::Function::New<ImageAttentionRule>(env, "imageAttentionRule"));
    exports.Set("layoutPixels", Napi::Function::New<LayoutPixels>(env, "layoutPixels"));  // preprocessing, native/src/pixels.cc
    exports.Set("llamaVersion", Napi::String::New(env, "0.5.0"));
    // percept's own GPU code in this build (CUDA builds; nvJPEG where the toolkit has it)
    Napi::Object gpu = Napi::Object::New(env);
    gpu.Set("visionAttention", VisionAttention::built());
    gpu.Set("jpegDecoder", DeviceJpeg::built());
    exports.Set("gpuKernels", gpu);
    return exports;
}

NODE_API_MODULE(percept_native, InitAddon)
