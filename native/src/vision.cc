#include "vision.h"

#include "ggml-backend.h"
#include "gguf.h"
#include "llama-internal.h"
#include "llama.h"
#include "mtmd.h"
#include "util.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
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
// clip's load log: clip says only in its log whether flash attention ended up on, how the graph split
// across backends and which ops the GPU cannot run. Its lines go to the addon's logger as before;
// a load also keeps the lines of its own thread and parses them.

ggml_log_callback gForwardLog = nullptr;
void * gForwardLogData = nullptr;
thread_local std::string * tlsClipLog = nullptr;

void clipLog(ggml_log_level level, const char * text, void * /*user*/) {
    if (tlsClipLog != nullptr) tlsClipLog->append(text);
    if (gForwardLog != nullptr) gForwardLog(level, text, gForwardLogData);
}

void installClipLog() {
    llama_log_get(&gForwardLog, &gForwardLogData);
    mtmd_log_set(clipLog, nullptr);
}

struct ClipLogRecorder {
    std::string text;
    ClipLogRecorder() { tlsClipLog = &text; }
    ~ClipLogRecorder() { tlsClipLog = nullptr; }
};

VisionLoadReport parseLoadReport(const std::string & log) {
    VisionLoadReport r;
    size_t start = 0;
    bool inUnsupported = false;
    std::vector<std::string> unsupported;
    while (start < log.size()) {
        size_t end = log.find('\n', start);
        if (end == std::string::npos) end = log.size();
        const std::string line = log.substr(start, end - start);
        start = end + 1;
        int a = 0, b = 0;
        char name[64] = {0};
        double mib = 0;
        if (const char * p = std::strstr(line.c_str(), "flash attention is ")) {
            r.flashAttention = std::strncmp(p + 19, "enabled", 7) == 0 ? 1 : 0;
            inUnsupported = false;
        } else if (const char * g = std::strstr(line.c_str(), "graph splits = ");
                   g && std::sscanf(g, "graph splits = %d, nodes = %d", &a, &b) == 2) {
            r.graphSplits = a;
            r.graphNodes = b;
        } else if (const char * c = std::strstr(line.c_str(), ": "); c && std::strstr(line.c_str(), "compute buffer size") &&
                   std::sscanf(c + 2, "%63s compute buffer size = %lf MiB", name, &mib) == 2) {
            // A retried reservation (flash attention unsupported) reports its buffers again.
            auto it = std::find_if(r.computeBuffersMiB.begin(), r.computeBuffersMiB.end(), [&](const auto & e) { return e.first == name; });
            if (it != r.computeBuffersMiB.end()) it->second = mib;
            else r.computeBuffersMiB.emplace_back(name, mib);
        } else if (std::strstr(line.c_str(), "list of unsupported ops")) {
            inUnsupported = true;
            unsupported.clear();
        } else if (inUnsupported && std::strstr(line.c_str(), ": type = ")) {
            const char * colon = std::strstr(line.c_str(), ": ");
            if (colon != nullptr && std::sscanf(colon + 2, "%63[^:]", name) == 1) {
                std::string op(name);
                op.erase(0, op.find_first_not_of(' '));
                if (std::find(unsupported.begin(), unsupported.end(), op) == unsupported.end()) unsupported.push_back(op);
            }
        }
    }
    r.unsupportedOps = unsupported;
    return r;
}

// ------------------------------------------------------------------------------------------------
// Profiling through clip's graph-evaluation callback (ggml_backend_sched asks per node whether to
// observe it; an observed node ends a compute chunk and the backend is synchronized after it).

bool profileCallback(ggml_tensor * t, bool ask, void * user) {
    auto * p = static_cast<VisionProfile *>(user);
    if (p->mode == VisionProfile::Mode::Off) return !ask;
    if (ask) return p->mode == VisionProfile::Mode::Ops || ++p->asked == 1;
    const int64_t now = monotonicNs();
    if (p->firstNodeNs == 0) {
        p->firstNodeNs = now;
    } else {
        auto & op = p->ops[ggml_op_desc(t)];
        op.ms += double(now - p->lastNs) / 1e6;
        op.count++;
        if (t->buffer != nullptr && ggml_backend_buffer_is_host(t->buffer)) op.onHost++;
    }
    p->lastNs = now;
    return true;
}

// ------------------------------------------------------------------------------------------------
// Load

// Every field is required from JS (native/vision.ts owns the defaults).
struct LoadOptions {
    std::string path;
    bool useGpu = false;
    int32_t threads = 0;
    FlashAttention flashAttention = FlashAttention::Auto;
    bool warmup = false;
    bool profile = false;
    bool perceptGraph = true;  // percept's persistent graph where it mirrors the tower, else clip's encode
};

// clip's warm-up image for each projector (clip.cpp): gemma3's one size, gemma4v's 256 tokens.
void reserveWarmupShape(VisionGraph & graph, const VisionMeta & m) {
    if (m.projector == "gemma3") {
        graph.reserve(PixelLayout::Chw, m.imageSize, m.imageSize, 1);
    } else {
        const int32_t side = 16 * m.merge * m.patchSize;
        graph.reserve(PixelLayout::Patches, side, side, 1);
    }
}

// clip's flash attention (-1 where the backend runs it, 0 off, 1 on) for the asked mode. clip cannot
// pad heads: on CUDA, 'auto' turns it off for a head size without a tensor-core kernel (slower than
// none, see tensorCoreFlashHead), and 'padded' means on at the tower's own head size.
int32_t clipFlashAttention(FlashAttention asked, bool useGpu, const VisionMeta & m) {
    switch (asked) {
    case FlashAttention::On:
    case FlashAttention::Padded:
        return 1;
    case FlashAttention::Off:
        return 0;
    case FlashAttention::Auto:
    case FlashAttention::Percept:  // percept's graph then runs its own kernel; clip as for auto
        break;
    }
    if (!useGpu || m.heads <= 0) return -1;
    const int32_t headDim = m.hidden / m.heads;
    const bool cuda = ggml_backend_reg_by_name("CUDA") != nullptr;
    return cuda && tensorCoreFlashHead(headDim) != headDim ? 0 : -1;
}

class LoadWorker : public PromiseWorker {
public:
    LoadWorker(Napi::Env env, Napi::Function ctor, LoadOptions opts)
        : PromiseWorker(env, "percept:Vision.load", "EMODEL"), ctor_(Napi::Persistent(ctor)), opts_(std::move(opts)) {}
    ~LoadWorker() override {
        graph_.reset();
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
            ClipLogRecorder clipLog;
            std::string fallback;
            if (opts_.profile) profile_ = std::make_unique<VisionProfile>();
            ClipOptions co;
            co.useGpu = opts_.useGpu;
            co.flashAttention = clipFlashAttention(opts_.flashAttention, opts_.useGpu, meta_);
            // With percept's graph, clip only loads the weights: its compute buffers would go unused.
            co.warmup = opts_.warmup && !opts_.perceptGraph;
            co.evalCallback = profile_ ? profileCallback : nullptr;
            co.evalCallbackData = profile_.get();
            ctx_ = clipLoad(opts_.path, co);
            if (ctx_ != nullptr && opts_.perceptGraph) {
                try {
                    graph_ = std::make_unique<VisionGraph>(ctx_, VisionGraphOptions{opts_.threads, opts_.flashAttention});
                    if (opts_.warmup) reserveWarmupShape(*graph_, meta_);
                } catch (const std::exception & e) {
                    // Visible in info().graphFallback; clip loads again, warmed up as if asked for.
                    graph_.reset();
                    fallback = e.what();
                    if (opts_.warmup) {
                        clipFree(ctx_);
                        clipLog.text.clear();
                        co.warmup = true;
                        ctx_ = clipLoad(opts_.path, co);
                    }
                }
            }
            if (graph_) {
                // What percept's graph resolved: one backend runs it all (one split).
                report_.flashAttention = graph_->flashAttention() ? 1 : 0;
                report_.flashAttentionHead = graph_->flashAttentionHead();
                report_.attentionKernel = graph_->perceptAttention() ? "percept" : graph_->flashAttention() ? "ggml" : "";
                report_.graphSplits = 1;
                report_.graphNodes = graph_->graphNodes();
                report_.copiedWeightBytes = graph_->copiedWeightBytes();
                if (graph_->computeBytes() > 0)
                    report_.computeBuffersMiB.emplace_back(graph_->bufferName(), double(graph_->computeBytes()) / (1024.0 * 1024.0));
            } else {
                report_ = parseLoadReport(clipLog.text);
                report_.graphFallback = fallback;
                if (report_.flashAttention == 1 && meta_.heads > 0) report_.flashAttentionHead = meta_.hidden / meta_.heads;
                if (report_.flashAttention == 1) report_.attentionKernel = "ggml";
            }
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
        Napi::Object obj =
            ctor_.New({Napi::External<clip_ctx>::New(env, c), Napi::External<VisionMeta>::New(env, &meta_),
                       Napi::External<VisionLoadReport>::New(env, &report_), Napi::External<VisionProfile>::New(env, profile_.release()),
                       Napi::External<VisionGraph>::New(env, graph_.release())});
        deferred_.Resolve(obj);
    }

private:
    Napi::FunctionReference ctor_;
    LoadOptions opts_;
    VisionMeta meta_;
    VisionLoadReport report_;
    std::unique_ptr<VisionProfile> profile_;
    std::unique_ptr<VisionGraph> graph_;
    clip_ctx * ctx_ = nullptr;
};

// ------------------------------------------------------------------------------------------------
// Encode

// clip takes interleaved RGB rows (HWC); it makes them planar again for the conv.
void toInterleaved(const float * src, PixelLayout layout, size_t w, size_t h, size_t patch, float * hwc) {
    const size_t n = w * h;
    if (layout == PixelLayout::Chw) {
        for (size_t i = 0; i < n; i++) {
            hwc[3 * i] = src[i];
            hwc[3 * i + 1] = src[n + i];
            hwc[3 * i + 2] = src[2 * n + i];
        }
        return;
    }
    const size_t cols = w / patch;
    const size_t patchValues = patch * patch * 3;
    for (size_t y = 0; y < h; y++) {
        const float * patchRow = src + (y / patch) * cols * patchValues + (y % patch) * patch * 3;
        float * out = hwc + y * w * 3;
        for (size_t px = 0; px < cols; px++)
            std::copy(patchRow + px * patchValues, patchRow + px * patchValues + patch * 3, out + px * patch * 3);
    }
}

// One JPEG frame for the GPU path: its bytes (kept alive by the worker's references), the stored
// size its header was read as, and its EXIF orientation.
struct JpegFrame {
    const uint8_t * data = nullptr;
    size_t bytes = 0;
    int32_t storedWidth = 0, storedHeight = 0;
    int32_t orientation = 1;
};

// Decodes a frame on the GPU, checked against the size its header was read as.
void decodeChecked(DeviceJpeg & decoder, const JpegFrame & f) {
    int32_t w = 0, h = 0;
    decoder.decode(f.data, f.bytes, w, h);
    if (w != f.storedWidth || h != f.storedHeight) {
        throw std::runtime_error("the JPEG is " + std::to_string(w) + "x" + std::to_string(h) + ", its header was read as " +
                                 std::to_string(f.storedWidth) + "x" + std::to_string(f.storedHeight));
    }
}

// Encodes N images of one size. percept's graph takes them as one batch, and so does clip's gemma4v
// graph; clip's gemma3 encodes them one after the other. The embeddings come back in one buffer
// that becomes the JS ArrayBuffer without a copy.
class EncodeWorker : public ThreadWorker {
public:
    EncodeWorker(Napi::Env env, Napi::Object self, Vision * vision, const std::vector<Napi::Float32Array> & images, PixelLayout layout,
                 int32_t width, int32_t height, VisionProfile::Mode profile, bool single)
        : ThreadWorker(env, "percept:Vision.encode", "EENCODE"), self_(Napi::Persistent(self)), vision_(vision), layout_(layout),
          width_(width), height_(height), profileMode_(profile), single_(single) {
        for (const auto & px : images) {
            refs_.push_back(Napi::Persistent(px.As<Napi::Object>()));
            src_.push_back(px.Data());
        }
    }
    // JPEG frames, decoded and laid out on the graph's GPU (Vision::decodesJpeg) into one batch.
    EncodeWorker(Napi::Env env, Napi::Object self, Vision * vision, const std::vector<Napi::Uint8Array> & arrays,
                 std::vector<JpegFrame> jpegs, const DeviceJpegPlan & plan, VisionProfile::Mode profile, bool single)
        : ThreadWorker(env, "percept:Vision.encodeJpeg", "EENCODE"), self_(Napi::Persistent(self)), vision_(vision),
          layout_(plan.patches ? PixelLayout::Patches : PixelLayout::Chw), width_(plan.width), height_(plan.height), profileMode_(profile),
          single_(single), jpegs_(std::move(jpegs)), plan_(plan) {
        for (const auto & a : arrays) refs_.push_back(Napi::Persistent(a.As<Napi::Object>()));
    }

protected:
    void Execute() override {
        try {
            if (VisionGraph * graph = vision_->graph()) {
                encodeWithGraph(*graph);
                return;
            }
            const int64_t t0 = monotonicNs();
            clip_ctx * ctx = vision_->raw();
            VisionScratch & scratch = vision_->scratch();
            const size_t n = src_.size();
            const size_t values = size_t(width_) * size_t(height_) * 3;
            ClipImages & images = scratch.images;
            images.resize(n);
            scratch.hwc.resize(values);
            for (size_t i = 0; i < n; i++) {
                toInterleaved(src_[i], layout_, size_t(width_), size_t(height_), size_t(vision_->meta().patchSize), scratch.hwc.data());
                images.set(i, width_, height_, scratch.hwc);
            }
            nTokens_ = clipOutputTokens(ctx, images);
            nEmbd_ = clipEmbdWidth(ctx);
            const size_t perImage = size_t(nTokens_) * size_t(nEmbd_);
            out_ = std::make_unique<std::vector<float>>(perImage * n);
            const int64_t t1 = monotonicNs();
            VisionProfile * profile = vision_->profile();
            if (profile != nullptr) profile->begin(profileMode_);
            LogCapture capture;
            const int32_t threads = vision_->meta().threads;
            batched_ = n > 1 && clipSupportsBatch(ctx);
            bool ok = true;
            if (n == 1 || batched_) {
                ok = clipEncode(ctx, threads, images, 0, n, *out_);
            } else {
                // One graph per image.
                std::vector<float> part(perImage);
                for (size_t i = 0; i < n && ok; i++) {
                    ok = clipEncode(ctx, threads, images, i, 1, part);
                    std::copy(part.begin(), part.end(), out_->begin() + ptrdiff_t(i * perImage));
                }
            }
            const int64_t t2 = monotonicNs();
            if (profile != nullptr) {
                profile->mode = VisionProfile::Mode::Off;
                if (profileMode_ != VisionProfile::Mode::Off && profile->firstNodeNs != 0) {
                    setupMs_ = double(profile->firstNodeNs - t1) / 1e6;
                    computeMs_ = double(t2 - profile->firstNodeNs) / 1e6;
                    ops_ = profile->ops;
                }
            }
            if (!ok) {
                std::string why = capture.text();
                SetError("clip_image_batch_encode failed" + (why.empty() ? std::string() : ": " + why));
                return;
            }
            prepareMs_ = double(t1 - t0) / 1e6;
            encodeMs_ = double(t2 - t1) / 1e6;
        } catch (const std::exception & e) {
            SetError(std::string("encode failed: ") + e.what());
        }
    }
    // percept's graph reads the caller's arrays as they are (no interleaving) and reports its
    // phases on every call; a profile asks only for the per-op times in addition.
    void encodeWithGraph(VisionGraph & graph) {
        const int64_t t0 = monotonicNs();
        const size_t n = images();
        nTokens_ = graph.outputTokens(width_, height_);
        nEmbd_ = graph.nOutEmbd();
        out_ = std::make_unique<std::vector<float>>(size_t(nTokens_) * size_t(nEmbd_) * n);
        const int64_t t1 = monotonicNs();
        std::map<std::string, VisionOpTime> * ops = profileMode_ == VisionProfile::Mode::Ops ? &graphOps_ : nullptr;
        if (!jpegs_.empty()) {
            graph.encodeFilled([this](ggml_tensor * pixels) { decodeInto(pixels); }, layout_, width_, height_, int32_t(n), out_->data(),
                               times_, ops);
        } else {
            graph.encode(src_, layout_, width_, height_, out_->data(), times_, ops);
        }
        const int64_t t2 = monotonicNs();
        perceptGraph_ = true;
        batched_ = n > 1;
        prepareMs_ = double(t1 - t0) / 1e6;
        encodeMs_ = double(t2 - t1) / 1e6;
        setupMs_ = times_.build + times_.alloc + times_.upload;
        computeMs_ = times_.compute + times_.read;
        for (const auto & [name, op] : graphOps_) ops_[name] = {op.ms, op.count, op.onHost};
    }

    // Images in this encode: the arrays, or the JPEGs.
    size_t images() const { return jpegs_.empty() ? src_.size() : jpegs_.size(); }

    // Each JPEG decoded on the GPU and resampled straight into its image of the graph's input.
    void decodeInto(ggml_tensor * pixels) {
        DeviceJpeg & decoder = vision_->deviceJpeg();
        const size_t perImage = size_t(width_) * size_t(height_) * 3;
        if (ggml_nbytes(pixels) != perImage * jpegs_.size() * sizeof(float))
            throw std::runtime_error("the graph's input is not the planned images");
        for (size_t i = 0; i < jpegs_.size(); i++) {
            const int64_t t0 = monotonicNs();
            decodeChecked(decoder, jpegs_[i]);
            const int64_t t1 = monotonicNs();
            DeviceJpegPlan plan = plan_;
            plan.orientation = jpegs_[i].orientation;
            decoder.layout(static_cast<float *>(pixels->data) + i * perImage, plan);
            jpegDecodeMs_ += double(t1 - t0) / 1e6;
            deviceLayoutMs_ += double(monotonicNs() - t1) / 1e6;
        }
    }

    void OnOK() override {
        Napi::Env env = Env();
        vision_->releaseBusy();
        const size_t n = images();
        const size_t perImage = size_t(nTokens_) * size_t(nEmbd_);
        std::vector<float> * out = out_.release();
        Napi::ArrayBuffer buffer = Napi::ArrayBuffer::New(
            env, out->data(), out->size() * sizeof(float), [](Napi::Env, void *, std::vector<float> * v) { delete v; }, out);
        Napi::Object o = Napi::Object::New(env);
        if (single_) {
            o.Set("data", Napi::Float32Array::New(env, perImage, buffer, 0));
        } else {
            Napi::Array list = Napi::Array::New(env, n);
            for (size_t i = 0; i < n; i++)
                list.Set(uint32_t(i), Napi::Float32Array::New(env, perImage, buffer, i * perImage * sizeof(float)));
            o.Set("data", list);
            o.Set("batched", batched_);
        }
        o.Set("nTokens", nTokens_);
        o.Set("nEmbd", nEmbd_);
        o.Set("path", perceptGraph_ ? "percept" : "clip");
        o.Set("prepareMs", prepareMs_);
        o.Set("encodeMs", encodeMs_);
        if (perceptGraph_) {
            Napi::Object ph = Napi::Object::New(env);
            ph.Set("buildMs", times_.build);
            ph.Set("allocMs", times_.alloc);
            ph.Set("uploadMs", times_.upload);
            ph.Set("computeMs", times_.compute);
            ph.Set("readMs", times_.read);
            if (!jpegs_.empty()) {
                ph.Set("jpegDecodeMs", jpegDecodeMs_);
                ph.Set("deviceLayoutMs", deviceLayoutMs_);
            }
            o.Set("phases", ph);
        }
        if (profileMode_ != VisionProfile::Mode::Off) {
            Napi::Object prof = Napi::Object::New(env);
            prof.Set("setupMs", setupMs_);
            prof.Set("computeMs", computeMs_);
            if (profileMode_ == VisionProfile::Mode::Ops) {
                Napi::Array ops = Napi::Array::New(env, ops_.size());
                uint32_t i = 0;
                for (const auto & [name, stat] : ops_) {
                    Napi::Object op = Napi::Object::New(env);
                    op.Set("op", name);
                    op.Set("ms", stat.ms);
                    op.Set("count", stat.count);
                    op.Set("onHost", stat.onHost);
                    ops.Set(i++, op);
                }
                prof.Set("ops", ops);
            }
            o.Set("profile", prof);
        }
        deferred_.Resolve(o);
    }
    void OnError(const Napi::Error & e) override {
        vision_->releaseBusy();
        ThreadWorker::OnError(e);
    }

private:
    Napi::ObjectReference self_;               // keeps the Vision alive (no GC) during the run
    std::vector<Napi::ObjectReference> refs_;  // keep the input arrays alive; read off-thread
    std::vector<const float *> src_;
    Vision * vision_;
    PixelLayout layout_;
    int32_t width_, height_;
    VisionProfile::Mode profileMode_;
    bool single_;
    bool batched_ = false;
    bool perceptGraph_ = false;
    VisionGraphTimes times_;
    std::map<std::string, VisionOpTime> graphOps_;
    std::unique_ptr<std::vector<float>> out_;
    int32_t nTokens_ = 0, nEmbd_ = 0;
    double prepareMs_ = 0, encodeMs_ = 0, setupMs_ = 0, computeMs_ = 0;
    std::map<std::string, VisionProfile::OpStat> ops_;
    std::vector<JpegFrame> jpegs_;  // set: the images are these JPEGs (refs_ keeps them alive)
    DeviceJpegPlan plan_;
    double jpegDecodeMs_ = 0, deviceLayoutMs_ = 0;
};

// The pixels encodeJpeg would hand the graph, brought back to the host: the GPU path checked
// against the host layout pass (tests, bench encode --check).
class JpegPixelsWorker : public ThreadWorker {
public:
    JpegPixelsWorker(Napi::Env env, Napi::Object self, Vision * vision, Napi::Uint8Array array, const JpegFrame & jpeg,
                     const DeviceJpegPlan & plan)
        : ThreadWorker(env, "percept:Vision.jpegPixels", "EENCODE"), self_(Napi::Persistent(self)),
          jpegRef_(Napi::Persistent(array.As<Napi::Object>())), vision_(vision), jpeg_(jpeg), plan_(plan) {
        plan_.orientation = jpeg.orientation;
    }

protected:
    void Execute() override {
        try {
            DeviceJpeg & decoder = vision_->deviceJpeg();
            decodeChecked(decoder, jpeg_);
            out_ = std::make_unique<std::vector<float>>(size_t(plan_.width) * size_t(plan_.height) * 3);
            decoder.layoutToHost(out_->data(), plan_);
        } catch (const std::exception & e) {
            SetError(std::string("GPU JPEG path failed: ") + e.what());
        }
    }
    void OnOK() override {
        Napi::Env env = Env();
        vision_->releaseBusy();
        std::vector<float> * out = out_.release();
        Napi::ArrayBuffer buffer = Napi::ArrayBuffer::New(
            env, out->data(), out->size() * sizeof(float), [](Napi::Env, void *, std::vector<float> * v) { delete v; }, out);
        deferred_.Resolve(Napi::Float32Array::New(env, out->size(), buffer, 0));
    }
    void OnError(const Napi::Error & e) override {
        vision_->releaseBusy();
        ThreadWorker::OnError(e);
    }

private:
    Napi::ObjectReference self_;
    Napi::ObjectReference jpegRef_;
    Vision * vision_;
    JpegFrame jpeg_;
    DeviceJpegPlan plan_;
    std::unique_ptr<std::vector<float>> out_;
};

}  // namespace

// ------------------------------------------------------------------------------------------------

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

void VisionProfile::begin(Mode m) {
    mode = m;
    firstNodeNs = 0;
    lastNs = 0;
    asked = 0;
    ops.clear();
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
    auto * worker =
        new EncodeWorker(env, info.This().As<Napi::Object>(), this, images, shape.layout, shape.width, shape.height, shape.profile, single);
    Napi::Promise promise = worker->promise();
    worker->Queue(*thread_);
    return promise;
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
    auto * worker =
        new EncodeWorker(env, info.This().As<Napi::Object>(), this, r.arrays, std::move(r.frames), r.plan, r.shape.profile, single);
    Napi::Promise promise = worker->promise();
    worker->Queue(*thread_);
    return promise;
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
    auto * worker = new JpegPixelsWorker(env, info.This().As<Napi::Object>(), this, r.arrays[0], r.frames[0], r.plan);
    Napi::Promise promise = worker->promise();
    worker->Queue(*thread_);
    return promise;
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
