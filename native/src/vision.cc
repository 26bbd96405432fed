#include "vision.h"

#include "ggml-backend.h"
#include "llama-internal.h"
#include "util.h"
#include "vision-workers.h"

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace percept {

Napi::Function Vision::Init(Napi::Env env) {
    // clip logs through its own sink (stderr by default): route it to the addon's logger, so it is quiet
    // unless forwarded and LogCapture sees clip's error lines too.
    installClipLog();
    return DefineClass(env, "Vision",
                       {
                           StaticMethod<&Vision::Load>("load"),
                           InstanceMethod<&Vision::Info>("info"),
                           InstanceMethod<&Vision::Encode>("encode"),
                           InstanceMethod<&Vision::EncodeBatch>("encodeBatch"),
                           InstanceMethod<&Vision::EncodeJpeg>("encodeJpeg"),
                           InstanceMethod<&Vision::EncodeJpegBatch>("encodeJpegBatch"),
                           InstanceMethod<&Vision::JpegPixels>("jpegPixels"),
                           InstanceMethod<&Vision::AllocatePixels>("allocatePixels"),
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
    if (info.Length() > 4 && info[2].IsExternal() && info[3].IsExternal() && info[4].IsExternal()) {
        report_ = *info[2].As<Napi::External<VisionLoadReport>>().Data();
        // Ownership of both moves here (either may be null).
        profile_.reset(info[3].As<Napi::External<VisionProfile>>().Data());
        graph_.reset(info[4].As<Napi::External<VisionGraph>>().Data());
    }
    nEmbd_ = clipEmbdWidth(ctx_);
    thread_ = std::make_unique<SerialThread>("percept-vision");
}

Vision::~Vision() {
    // GC without dispose(): a running encode holds a reference to this object, so none is running here.
    graph_.reset();
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
    opts.profile = requireBool(o, "profile", w);
    opts.perceptGraph = requireChoice(o, "graph", {"percept", "clip"}, w) == 0;
    const FlashAttention faModes[] = {FlashAttention::Auto, FlashAttention::On, FlashAttention::Off, FlashAttention::Padded,
                                      FlashAttention::Percept};
    opts.flashAttention = faModes[requireChoice(o, "flashAttention", {"auto", "on", "off", "padded", "percept"}, w)];
    return startLoad(env, info.This().As<Napi::Function>(), std::move(opts));
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
    o.Set("graph", graph_ ? "percept" : "clip");
    o.Set("graphFallback", report_.graphFallback.empty() ? env.Null() : Napi::String::New(env, report_.graphFallback));
    o.Set("flashAttention", report_.flashAttention < 0 ? env.Null() : Napi::Boolean::New(env, report_.flashAttention == 1));
    o.Set("flashAttentionHead", report_.flashAttentionHead > 0 ? Napi::Number::New(env, report_.flashAttentionHead) : env.Null());
    o.Set("attentionKernel", report_.attentionKernel.empty() ? env.Null() : Napi::String::New(env, report_.attentionKernel));
    o.Set("graphSplits", report_.graphSplits);
    o.Set("graphNodes", report_.graphNodes);
    o.Set("copiedWeightBytes", double(report_.copiedWeightBytes));
    Napi::Array buffers = Napi::Array::New(env, report_.computeBuffersMiB.size());
    for (size_t b = 0; b < report_.computeBuffersMiB.size(); b++) {
        Napi::Object d = Napi::Object::New(env);
        d.Set("name", report_.computeBuffersMiB[b].first);
        d.Set("bytes", report_.computeBuffersMiB[b].second * 1024.0 * 1024.0);
        buffers.Set(uint32_t(b), d);
    }
    o.Set("computeBuffers", buffers);
    Napi::Array unsupported = Napi::Array::New(env, report_.unsupportedOps.size());
    for (size_t u = 0; u < report_.unsupportedOps.size(); u++) unsupported.Set(uint32_t(u), report_.unsupportedOps[u]);
    o.Set("unsupportedOps", unsupported);
    o.Set("batchable", graph_ != nullptr || clipSupportsBatch(ctx_));
    o.Set("decodesJpeg", decodesJpeg());
    o.Set("profile", profile_ != nullptr);
    return o;
}

Napi::Value Vision::Encode(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (ctx_ == nullptr) throw codedError(env, "EDISPOSED", "Vision is disposed");
    if (!info[0].IsTypedArray() || info[0].As<Napi::TypedArray>().TypedArrayType() != napi_float32_array) {
        throw Napi::TypeError::New(env, "Vision.encode: pixels must be a Float32Array");
    }
    return Queue(info, {info[0].As<Napi::Float32Array>()}, requireObject(info[1], "Vision.encode options"), true);
}

// A Float32Array of `length` values in the graph device's host buffer type (pinned memory on CUDA),
// so encode() uploads it by DMA instead of through CUDA's pageable staging (E4B's 7.7 MB of
// pixel_values: 1.2 ms on the H200). Undefined where the device has no such memory (the CPU) or
// clip's own encode runs: the caller allocates an ordinary array. The memory is freed with the
// array (it does not depend on this Vision staying loaded).
Napi::Value Vision::AllocatePixels(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (ctx_ == nullptr) throw codedError(env, "EDISPOSED", "Vision is disposed");
    const double value = info[0].IsNumber() ? info[0].As<Napi::Number>().DoubleValue() : -1;
    if (!(value >= 1 && value <= double(int64_t(1) << 31) && std::floor(value) == value))
        throw Napi::RangeError::New(env, "Vision.allocatePixels: length must be an integer in 1..2^31");
    const int64_t length = int64_t(value);
    ggml_backend_buffer_type_t buft = graph_ != nullptr ? graph_->hostBufferType() : nullptr;
    if (buft == nullptr) return env.Undefined();
    const size_t bytes = size_t(length) * sizeof(float);
    ggml_backend_buffer_t buf = ggml_backend_buft_alloc_buffer(buft, bytes);
    if (buf == nullptr)
        throw Napi::Error::New(env, "Vision.allocatePixels: cannot allocate " + std::to_string(bytes) + " bytes of host memory");
    Napi::ArrayBuffer ab = Napi::ArrayBuffer::New(
        env, ggml_backend_buffer_get_base(buf), bytes, [](Napi::Env, void *, ggml_backend_buffer_t b) { ggml_backend_buffer_free(b); },
        buf);
    return Napi::Float32Array::New(env, size_t(length), ab, 0);
}

Napi::Value Vision::EncodeBatch(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (ctx_ == nullptr) throw codedError(env, "EDISPOSED", "Vision is disposed");
    if (!info[0].IsArray()) throw Napi::TypeError::New(env, "Vision.encodeBatch: images must be an array of Float32Array");
    Napi::Array list = info[0].As<Napi::Array>();
    if (list.Length() == 0 || list.Length() > 64)
        throw Napi::RangeError::New(env, "Vision.encodeBatch: 1 to 64 images, got " + std::to_string(list.Length()));
    std::vector<Napi::Float32Array> images;
    for (uint32_t i = 0; i < list.Length(); i++) {
        Napi::Value v = list.Get(i);
        if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != napi_float32_array) {
            throw Napi::TypeError::New(env, "Vision.encodeBatch: images[" + std::to_string(i) + "] must be a Float32Array");
        }
        images.push_back(v.As<Napi::Float32Array>());
    }
    return Queue(info, std::move(images), requireObject(info[1], "Vision.encodeBatch options"), false);
}

struct Vision::EncodeShape {
    PixelLayout layout;
    int32_t width, height;
    VisionProfile::Mode profile;
};

// The layout, size and profile mode of an encode, refused here wherever clip would otherwise
// GGML_ASSERT/ABORT on them.
Vision::EncodeShape Vision::checkEncodeShape(Napi::Env env, const Napi::Object & o, const char * fn) const {
    const std::string opts = std::string(fn) + " options";
    const char * w = opts.c_str();
    const PixelLayout layout = requireChoice(o, "layout", {"chw", "patches"}, w) == 0 ? PixelLayout::Chw : PixelLayout::Patches;
    const int64_t width = requireInt(o, "width", 1, 46000, w);
    const int64_t height = requireInt(o, "height", 1, 46000, w);
    const VisionProfile::Mode profileModes[] = {VisionProfile::Mode::Off, VisionProfile::Mode::Phases, VisionProfile::Mode::Ops};
    const VisionProfile::Mode profile = profileModes[requireChoice(o, "profile", {"off", "phases", "ops"}, w)];
    if (profile != VisionProfile::Mode::Off && profile_ == nullptr)
        throw Napi::Error::New(env, std::string(fn) + ": profiling needs Vision.load(path, { profile: true })");

    const int64_t p = meta_.patchSize;
    const std::string where = std::string(fn) + " (" + meta_.projector + "): ";
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
    return {layout, int32_t(width), int32_t(height), profile};
}

void Vision::takeBusy(Napi::Env env) {
    bool expected = false;
    if (!busy_.compare_exchange_strong(expected, true)) {
        throw codedError(env, "EBUSY", "Vision is busy: one encode at a time per context; await the running one");
    }
}

Napi::Value Vision::Queue(const Napi::CallbackInfo & info, std::vector<Napi::Float32Array> images, const Napi::Object & o, bool single) {
    Napi::Env env = info.Env();
    const char * fn = single ? "Vision.encode" : "Vision.encodeBatch";
    const EncodeShape shape = checkEncodeShape(env, o, fn);
    const char * layoutName = shape.layout == PixelLayout::Chw ? "chw" : "patches";
    const std::string where = std::string(fn) + " (" + meta_.projector + "): ";
    const size_t need = size_t(shape.width) * size_t(shape.height) * 3;
    for (size_t i = 0; i < images.size(); i++) {
        const size_t got = images[i].ElementLength();
        if (shape.layout == PixelLayout::Chw ? got != need : got < need) {
            const std::string which = single ? std::string("pixels") : "images[" + std::to_string(i) + "]";
            throw Napi::RangeError::New(env,
                                        where + which + " has " + std::to_string(got) + " values, " +
                                            (shape.layout == PixelLayout::Chw ? "expected " : "need at least ") + std::to_string(need) +
                                            " for " + layoutName + " " + std::to_string(shape.width) + "x" + std::to_string(shape.height));
        }
    }
    takeBusy(env);
    return startEncode(env, info.This().As<Napi::Object>(), this, images, shape.layout, shape.width, shape.height, shape.profile, single);
}

// The JPEG frames and how to lay them out, from (frames, options) of encodeJpeg, encodeJpegBatch and
// jpegPixels: each frame's bytes, the stored size its header was read as and its EXIF orientation;
// the encode's layout, width, height (the encoder's input, display-oriented) and profile, the
// resampling kernel and the normalization (v/255 − offset)/scale. Refuses where the GPU path cannot
// run (ENOTSUP).
struct Vision::JpegRequest {
    std::vector<Napi::Uint8Array> arrays;
    std::vector<JpegFrame> frames;
    EncodeShape shape;
    DeviceJpegPlan plan;
};

Vision::JpegRequest Vision::checkJpegRequest(const Napi::CallbackInfo & info, const char * fn, size_t maxFrames) const {
    Napi::Env env = info.Env();
    if (ctx_ == nullptr) throw codedError(env, "EDISPOSED", "Vision is disposed");
    if (!info[0].IsArray()) throw Napi::TypeError::New(env, std::string(fn) + ": frames must be an array of JPEG frames");
    Napi::Array list = info[0].As<Napi::Array>();
    if (list.Length() == 0 || list.Length() > maxFrames)
        throw Napi::RangeError::New(
            env, std::string(fn) + ": 1 to " + std::to_string(maxFrames) + " frames, got " + std::to_string(list.Length()));
    JpegRequest r;
    for (uint32_t i = 0; i < list.Length(); i++) {
        const std::string where = std::string(fn) + " frames[" + std::to_string(i) + "]";
        const Napi::Object f = requireObject(list.Get(i), where.c_str());
        Napi::Value data = f.Get("data");
        if (!data.IsTypedArray() || data.As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array)
            throw Napi::TypeError::New(env, where + ".data must be a Uint8Array");
        Napi::Uint8Array bytes = data.As<Napi::Uint8Array>();
        if (bytes.ByteLength() == 0) throw Napi::RangeError::New(env, where + ".data is empty");
        JpegFrame frame;
        frame.data = bytes.Data();
        frame.bytes = bytes.ByteLength();
        frame.storedWidth = int32_t(requireInt(f, "storedWidth", 1, 65535, where.c_str()));
        frame.storedHeight = int32_t(requireInt(f, "storedHeight", 1, 65535, where.c_str()));
        frame.orientation = int32_t(requireInt(f, "orientation", 1, 8, where.c_str()));
        r.arrays.push_back(bytes);
        r.frames.push_back(frame);
    }
    const std::string opts = std::string(fn) + " options";
    const char * w = opts.c_str();
    const Napi::Object o = requireObject(info[1], w);
    r.shape = checkEncodeShape(env, o, fn);
    r.plan.width = r.shape.width;
    r.plan.height = r.shape.height;
    r.plan.patches = r.shape.layout == PixelLayout::Patches;
    r.plan.patch = meta_.patchSize;
    r.plan.cubic = requireChoice(o, "kernel", {"linear", "cubic"}, w) == 1;
    r.plan.scale = float(requireNumber(o, "scale", -FLT_MAX, FLT_MAX, w));
    r.plan.offset = float(requireNumber(o, "offset", -FLT_MAX, FLT_MAX, w));
    if (r.plan.scale == 0) throw Napi::RangeError::New(env, std::string(fn) + ": options.scale must not be 0");
    if (!decodesJpeg()) {
        throw codedError(env, "ENOTSUP",
                         std::string(fn) + ": " +
                             (!DeviceJpeg::built()    ? "this build has no GPU JPEG decoder (CUDA with nvJPEG)"
                                  : graph_ == nullptr ? "clip's own encode runs (percept's graph decodes JPEG on the GPU)"
                                                      : "the encoder does not run on a CUDA device"));
    }
    return r;
}

Napi::Value Vision::QueueJpeg(const Napi::CallbackInfo & info, const char * fn, bool single) {
    Napi::Env env = info.Env();
    JpegRequest r = checkJpegRequest(info, fn, single ? 1 : 64);
    takeBusy(env);
    return startEncodeJpeg(env, info.This().As<Napi::Object>(), this, r.arrays, std::move(r.frames), r.plan, r.shape.profile, single);
}

// encodeJpeg([frame], options): one JPEG frame decoded by nvJPEG and resampled on the graph's GPU
// into the graph's input (no pixels on the host).
Napi::Value Vision::EncodeJpeg(const Napi::CallbackInfo & info) { return QueueJpeg(info, "Vision.encodeJpeg", true); }

// encodeJpegBatch(frames, options): up to 64 same-size frames (cameras of a rig) in one graph.
Napi::Value Vision::EncodeJpegBatch(const Napi::CallbackInfo & info) { return QueueJpeg(info, "Vision.encodeJpegBatch", false); }

// jpegPixels([frame], options): the input encodeJpeg would make, as a Float32Array.
Napi::Value Vision::JpegPixels(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    const JpegRequest r = checkJpegRequest(info, "Vision.jpegPixels", 1);
    takeBusy(env);
    return startJpegPixels(env, info.This().As<Napi::Object>(), this, r.arrays[0], r.frames[0], r.plan);
}

DeviceJpeg & Vision::deviceJpeg() {
    if (!jpeg_) jpeg_ = std::make_unique<DeviceJpeg>(graph_->cudaDevice());
    return *jpeg_;
}

Napi::Value Vision::Dispose(const Napi::CallbackInfo & info) {
    Napi::Env env = info.Env();
    if (ctx_ == nullptr) return env.Undefined();
    if (busy_.load()) throw codedError(env, "EBUSY", "Vision is busy; await the running encode before dispose()");
    jpeg_.reset();
    graph_.reset();
    clipFree(ctx_);
    ctx_ = nullptr;
    scratch_.hwc = {};
    scratch_.images.clear();
    thread_.reset();  // idle: no encode runs (busy)
    return env.Undefined();
}

}  // namespace percept
