#include "vision.h"

#include "ggml-backend.h"
#include "gguf.h"
#include "llama-internal.h"
#include "llama.h"
#include "mtmd.h"
#include "util.h"

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <sys/stat.h>
#include <vector>

namespace percept {

namespace {

// ------------------------------------------------------------------------------------------------
// GGUF pre-check

struct GgufCloser {
    void operator()(gguf_context * g) const { gguf_free(g); }
};
struct GgmlCloser {
    void operator()(ggml_context * c) const { ggml_free(c); }
};

const char * typeName(gguf_type t) { return gguf_type_name(t); }

int64_t findKey(gguf_context * g, const std::string & key, gguf_type want, bool required) {
    int64_t k = gguf_find_key(g, key.c_str());
    if (k < 0) {
        if (required) throw std::runtime_error("missing key '" + key + "'");
        return -1;
    }
    gguf_type t = gguf_get_kv_type(g, k);
    if (t != want) throw std::runtime_error("key '" + key + "' is " + typeName(t) + ", expected " + typeName(want));
    return k;
}

int32_t readU32(gguf_context * g, const std::string & key, bool required, int32_t def = 0) {
    int64_t k = findKey(g, key, GGUF_TYPE_UINT32, required);
    if (k < 0) return def;
    uint32_t v = gguf_get_val_u32(g, k);
    if (v > uint32_t(INT32_MAX)) throw std::runtime_error("key '" + key + "' = " + std::to_string(v) + " is too large");
    return int32_t(v);
}

void checkF32Array(gguf_context * g, const std::string & key) {
    int64_t k = findKey(g, key, GGUF_TYPE_ARRAY, true);
    if (gguf_get_arr_type(g, k) != GGUF_TYPE_FLOAT32 || gguf_get_arr_n(g, k) < 3) {
        throw std::runtime_error("key '" + key + "' must be an f32 array of 3 values");
    }
}

// Reads and checks what clip_init would otherwise assert on; also the geometry encode() validates against.
VisionMeta readVisionMeta(const std::string & path) {
    ggml_context * metaCtx = nullptr;
    gguf_init_params params{/*no_alloc=*/true, /*ctx=*/&metaCtx};
    std::unique_ptr<gguf_context, GgufCloser> g(gguf_init_from_file(path.c_str(), params));
    std::unique_ptr<ggml_context, GgmlCloser> meta(metaCtx);
    if (!g) throw std::runtime_error("not a valid GGUF file (bad magic, version or truncated header)");
    int64_t arch = gguf_find_key(g.get(), "general.architecture");
    if (arch >= 0 && gguf_get_kv_type(g.get(), arch) == GGUF_TYPE_STRING) {
        std::string a = gguf_get_val_str(g.get(), arch);
        if (a != "clip")
            throw std::runtime_error("general.architecture is '" + a + "', not 'clip': this is not an mmproj file (a decoder GGUF?)");
    }
    int64_t hv = findKey(g.get(), "clip.has_vision_encoder", GGUF_TYPE_BOOL, false);
    if (hv < 0 || !gguf_get_val_bool(g.get(), hv))
        throw std::runtime_error("the file has no vision encoder (clip.has_vision_encoder is not true)");

    VisionMeta m;
    m.path = path;
    int64_t pk = findKey(g.get(), "clip.projector_type", GGUF_TYPE_STRING, false);
    if (pk < 0) pk = findKey(g.get(), "clip.vision.projector_type", GGUF_TYPE_STRING, false);
    if (pk < 0) throw std::runtime_error("missing key 'clip.projector_type' (or 'clip.vision.projector_type')");
    m.projector = gguf_get_val_str(g.get(), pk);
    if (m.projector != "gemma3" && m.projector != "gemma4v") {
        throw std::runtime_error("projector type '" + m.projector + "' is not supported (percept accepts gemma3 and gemma4v)");
    }
    m.hidden = readU32(g.get(), "clip.vision.embedding_length", true);
    m.ffn = readU32(g.get(), "clip.vision.feed_forward_length", true);
    m.layers = readU32(g.get(), "clip.vision.block_count", true);
    m.heads = readU32(g.get(), "clip.vision.attention.head_count", true);
    m.projectionDim = readU32(g.get(), "clip.vision.projection_dim", true);
    m.imageSize = readU32(g.get(), "clip.vision.image_size", true);
    m.patchSize = readU32(g.get(), "clip.vision.patch_size", true);
    readU32(g.get(), "clip.vision.attention.head_count_kv", false);
    readU32(g.get(), "clip.vision.attention.head_dim", false);
    findKey(g.get(), "clip.vision.attention.layer_norm_epsilon", GGUF_TYPE_FLOAT32, true);
    findKey(g.get(), "clip.use_gelu", GGUF_TYPE_BOOL, false);
    findKey(g.get(), "clip.use_silu", GGUF_TYPE_BOOL, false);
    checkF32Array(g.get(), "clip.vision.image_mean");
    checkF32Array(g.get(), "clip.vision.image_std");
    m.merge = readU32(g.get(), "clip.vision.projector.scale_factor", false, m.projector == "gemma3" ? 4 : 3);
    if (m.patchSize <= 0 || m.hidden <= 0 || m.heads <= 0 || m.merge <= 0)
        throw std::runtime_error("patch size, width, heads and pooling must be positive");
    if (m.projector == "gemma4v") {
        ggml_tensor * pos = meta ? ggml_get_tensor(meta.get(), "v.position_embd.weight") : nullptr;
        if (pos == nullptr || pos->ne[0] != m.hidden || pos->ne[2] != 2) {
            throw std::runtime_error("gemma4v needs tensor v.position_embd.weight of shape [" + std::to_string(m.hidden) + ", N, 2]");
        }
        m.positionTable = int32_t(pos->ne[1]);
    }
    return m;
}

// ------------------------------------------------------------------------------------------------
// Load

// Every field is required from JS (native/vision.ts owns the defaults).
struct LoadOptions {
    std::string path;
    bool useGpu = false;
    int32_t threads = 0;
    int32_t flashAttention = -1;  // -1 auto, 0 off, 1 on
    bool warmup = false;
};

class LoadWorker : public PromiseWorker {
public:
    LoadWorker(Napi::Env env, Napi::Function ctor, LoadOptions opts)
        : PromiseWorker(env, "percept:Vision.load", "EMODEL"), ctor_(Napi::Persistent(ctor)), opts_(std::move(opts)) {}
    ~LoadWorker() override {
        if (ctx_ != nullptr) clipFree(ctx_);
    }

protected:
    void Execute() override {
        try {
            struct stat st {};
            if (stat(opts_.path.c_str(), &st) != 0) {
                SetCodedError("ENOENT", "ENOENT: mmproj file not found: " + opts_.path);
                return;
            }
            meta_ = readVisionMeta(opts_.path);
            meta_.useGpu = opts_.useGpu;
            meta_.threads = opts_.threads;
            LogCapture capture;
            ctx_ = clipLoad(opts_.path, ClipOptions{opts_.useGpu, opts_.flashAttention, opts_.warmup});
            if (ctx_ == nullptr) {
                std::string why = capture.text();
                SetError("failed to load mmproj " + opts_.path + (why.empty() ? std::string() : ": " + why));
            }
        } catch (const std::exception & e) {
            SetError("failed to load mmproj " + opts_.path + ": " + e.what());
        }
    }
    void OnOK() override {
        Napi::Env env = Env();
        clip_ctx * c = ctx_;
        ctx_ = nullptr;  // ownership moves to the JS object
        Napi::Object obj = ctor_.New({Napi::External<clip_ctx>::New(env, c), Napi::External<VisionMeta>::New(env, &meta_)});
        deferred_.Resolve(obj);
    }

private:
    Napi::FunctionReference ctor_;
    LoadOptions opts_;
    VisionMeta meta_;
    clip_ctx * ctx_ = nullptr;
};

// ------------------------------------------------------------------------------------------------
// Encode

enum class Layout { Chw, Patches };

class EncodeWorker : public PromiseWorker {
public:
    EncodeWorker(Napi::Env env, Napi::Object self, Vision * vision, Napi::Float32Array pixels, Layout layout, int32_t width, int32_t height)
        : PromiseWorker(env, "percept:Vision.encode", "EENCODE"), self_(Napi::Persistent(self)),
          pixelsRef_(Napi::Persistent(pixels.As<Napi::Object>())), vision_(vision), src_(pixels.Data()), layout_(layout), width_(width),
          height_(height) {}

protected:
    void Execute() override {
        try {
            const int64_t t0 = monotonicNs();
            const size_t w = size_t(width_), h = size_t(height_), n = w * h;
            // clip takes interleaved RGB rows (HWC); it makes them planar again for the conv.
            std::vector<float> hwc(n * 3);
            if (layout_ == Layout::Chw) {
                for (size_t i = 0; i < n; i++) {
                    hwc[3 * i] = src_[i];
                    hwc[3 * i + 1] = src_[n + i];
                    hwc[3 * i + 2] = src_[2 * n + i];
                }
            } else {
                const size_t p = size_t(vision_->meta().patchSize);
                const size_t cols = w / p;
                const size_t patchValues = p * p * 3;
                for (size_t y = 0; y < h; y++) {
                    const float * patchRow = src_ + (y / p) * cols * patchValues + (y % p) * p * 3;
                    float * out = hwc.data() + y * w * 3;
                    for (size_t px = 0; px < cols; px++)
                        std::copy(patchRow + px * patchValues, patchRow + px * patchValues + p * 3, out + px * p * 3);
                }
            }
            const int64_t t1 = monotonicNs();
            LogCapture capture;
            nEmbd_ = clipEmbdWidth(vision_->raw());
            nTokens_ = clipEncode(vision_->raw(), vision_->meta().threads, width_, height_, std::move(hwc), out_);
            if (nTokens_ < 0) {
                std::string why = capture.text();
                SetError("clip_image_encode failed" + (why.empty() ? std::string() : ": " + why));
                return;
            }
            const int64_t t2 = monotonicNs();
            prepareMs_ = double(t1 - t0) / 1e6;
            encodeMs_ = double(t2 - t1) / 1e6;
        } catch (const std::exception & e) {
            SetError(std::string("encode failed: ") + e.what());
        }
    }
    void OnOK() override {
        Napi::Env env = Env();
        vision_->releaseBusy();
        Napi::Float32Array data = Napi::Float32Array::New(env, out_.size());
        std::copy(out_.begin(), out_.end(), data.Data());
        Napi::Object o = Napi::Object::New(env);
        o.Set("data", data);
        o.Set("nTokens", nTokens_);
        o.Set("nEmbd", nEmbd_);
        o.Set("prepareMs", prepareMs_);
        o.Set("encodeMs", encodeMs_);
        deferred_.Resolve(o);
    }
    void OnError(const Napi::Error & e) override {
        vision_->releaseBusy();
        PromiseWorker::OnError(e);
    }

private:
    Napi::ObjectReference self_;       // keeps the Vision alive (no GC) during the run
    Napi::ObjectReference pixelsRef_;  // keeps the input array alive; read off-thread
    Vision * vision_;
    const float * src_;
    Layout layout_;
    int32_t width_, height_;
    std::vector<float> out_;
    int32_t nTokens_ = 0, nEmbd_ = 0;
    double prepareMs_ = 0, encodeMs_ = 0;
};

}  // namespace

// ------------------------------------------------------------------------------------------------

Napi::Function Vision::Init(Napi::Env env) {
    // clip logs through its own sink (stderr by default): route it to the addon's logger, so it is quiet
    // unless forwarded and LogCapture sees clip's error lines too.
    ggml_log_callback cb = nullptr;
    void * ud = nullptr;
    llama_log_get(&cb, &ud);
    if (cb != nullptr) mtmd_log_set(cb, ud);
    return DefineClass(env, "Vision",
                       {
                           StaticMethod<&Vision::Load>("load"),
                           InstanceMethod<&Vision::Info>("info"),
                           InstanceMethod<&Vision::Encode>("encode"),
                           InstanceMethod<&Vision::Dispose>("dispose"),
                       });
}

Vision::Vision(const Napi::CallbackInfo & info) : Napi::ObjectWrap<Vision>(info) {
    Napi::Env env = info.Env();
    if (info.Length() < 2 || !info[0].IsExternal() || !info[1].IsExternal()) {
        throw Napi::TypeError::New(env, "Vision cannot be constructed directly; use Vision.load(path, options)");
    }
    ctx_ = info[0].As<Napi::External<clip_ctx>>().Data();
    meta_ = *info[1].As<Napi::External<VisionMeta>>().Data();
    nEmbd_ = clipEmbdWidth(ctx_);
}

Vision::~Vision() {
    // GC without dispose(): a running encode holds a reference to this object, so none is running here.
    if (ctx_ != nullptr) clipFree(ctx_);
}

Napi::Value Vision::Load(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (!info.This().IsFunction()) throw Napi::TypeError::New(env, "Vision.load must be called as Vision.load(path, options)");
    LoadOptions opts;
    opts.path = requireString(info[0], "Vision.load path");
    if (opts.path.empty()) throw Napi::TypeError::New(env, "Vision.load: path is empty");
    const char * w = "Vision.load options";
    Napi::Object o = requireObject(info[1], w);
    opts.useGpu = requireBool(o, "useGpu", w);
    opts.threads = int32_t(requireInt(o, "threads", 1, 1024, w));
    opts.warmup = requireBool(o, "warmup", w);
    const int32_t faModes[] = {-1, 1, 0};
    opts.flashAttention = faModes[requireChoice(o, "flashAttention", {"auto", "on", "off"}, w)];
    auto * worker = new LoadWorker(env, info.This().As<Napi::Function>(), std::move(opts));
    Napi::Promise p = worker->promise();
    worker->Queue();
    return p;
}

Napi::Value Vision::Info(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (ctx_ == nullptr) throw codedError(env, "EDISPOSED", "Vision is disposed");
    Napi::Object o = Napi::Object::New(env);
    o.Set("projector", meta_.projector);
    o.Set("contract", meta_.projector == "gemma3" ? "gemma3" : "gemma4");
    o.Set("nEmbd", nEmbd_);
    o.Set("hidden", meta_.hidden);
    o.Set("layers", meta_.layers);
    o.Set("heads", meta_.heads);
    o.Set("ffn", meta_.ffn);
    o.Set("patchSize", meta_.patchSize);
    o.Set("imageSize", meta_.imageSize);
    o.Set("merge", meta_.merge);
    o.Set("positionTable", meta_.positionTable);
    o.Set("threads", meta_.threads);
    o.Set("useGpu", meta_.useGpu);
    Napi::Array devices = Napi::Array::New(env);
    uint32_t i = 0;
    for (const DeviceBytes & db : clipMemoryUsage(ctx_)) {
        Napi::Object d = Napi::Object::New(env);
        d.Set("name", db.device);
        d.Set("bytes", double(db.bytes));
        devices.Set(i++, d);
    }
    o.Set("devices", devices);
    return o;
}

Napi::Value Vision::Encode(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (ctx_ == nullptr) throw codedError(env, "EDISPOSED", "Vision is disposed");
    if (!info[0].IsTypedArray() || info[0].As<Napi::TypedArray>().TypedArrayType() != napi_float32_array) {
        throw Napi::TypeError::New(env, "Vision.encode: pixels must be a Float32Array");
    }
    Napi::Float32Array pixels = info[0].As<Napi::Float32Array>();
    Napi::Object o = requireObject(info[1], "Vision.encode options");
    const char * w = "Vision.encode options";
    const Layout layout = requireChoice(o, "layout", {"chw", "patches"}, w) == 0 ? Layout::Chw : Layout::Patches;
    const int64_t width = requireInt(o, "width", 1, 46000, w);
    const int64_t height = requireInt(o, "height", 1, 46000, w);

    // Every condition clip would otherwise GGML_ASSERT/ABORT on is refused here with a message.
    const int64_t p = meta_.patchSize;
    const std::string where = "Vision.encode (" + meta_.projector + "): ";
    if (width % p != 0 || height % p != 0) {
        throw Napi::RangeError::New(env,
                                    where + std::to_string(width) + "x" + std::to_string(height) + " is not a multiple of the patch size " +
                                        std::to_string(p));
    }
    const int64_t cols = width / p, rows = height / p;
    if (meta_.projector == "gemma3") {
        if (width != meta_.imageSize || height != meta_.imageSize) {
            throw Napi::RangeError::New(env,
                                        where + "the image must be " + std::to_string(meta_.imageSize) + "x" +
                                            std::to_string(meta_.imageSize) + " (its position table is fixed), got " +
                                            std::to_string(width) + "x" + std::to_string(height));
        }
        if (cols % meta_.merge != 0)
            throw Napi::RangeError::New(
                env, where + "patch grid " + std::to_string(cols) + " is not divisible by the pooling " + std::to_string(meta_.merge));
    } else {
        if (cols % meta_.merge != 0 || rows % meta_.merge != 0) {
            throw Napi::RangeError::New(env,
                                        where + "patch grid " + std::to_string(cols) + "x" + std::to_string(rows) +
                                            " is not divisible by the pooling " + std::to_string(meta_.merge));
        }
        if (cols > meta_.positionTable || rows > meta_.positionTable) {
            throw Napi::RangeError::New(env,
                                        where + "patch grid " + std::to_string(cols) + "x" + std::to_string(rows) +
                                            " exceeds the position table (" + std::to_string(meta_.positionTable) + ")");
        }
    }
    const size_t need = size_t(width) * size_t(height) * 3;
    if (layout == Layout::Chw ? pixels.ElementLength() != need : pixels.ElementLength() < need) {
        throw Napi::RangeError::New(env,
                                    where + "pixels has " + std::to_string(pixels.ElementLength()) + " values, " +
                                        (layout == Layout::Chw ? "expected " : "need at least ") + std::to_string(need) + " for " +
                                        (layout == Layout::Chw ? "chw " : "patches ") + std::to_string(width) + "x" +
                                        std::to_string(height));
    }
    bool expected = false;
    if (!busy_.compare_exchange_strong(expected, true)) {
        throw codedError(env, "EBUSY", "Vision is busy: one encode at a time per context; await the running one");
    }
    auto * worker = new EncodeWorker(env, info.This().As<Napi::Object>(), this, pixels, layout, int32_t(width), int32_t(height));
    Napi::Promise promise = worker->promise();
    worker->Queue();
    return promise;
}

Napi::Value Vision::Dispose(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (ctx_ == nullptr) return env.Undefined();
    if (busy_.load()) throw codedError(env, "EBUSY", "Vision is busy; await the running encode before dispose()");
    clipFree(ctx_);
    ctx_ = nullptr;
    return env.Undefined();
}

}  // namespace percept
