#include "vision-workers.h"

#include "ggml-backend.h"
#include "gguf.h"
#include "llama-internal.h"
#include "llama.h"
#include "mtmd.h"
#include "util.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <sys/stat.h>
#include <utility>
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
// What vision.cc starts (vision-workers.h)

void installClipLog() {
    llama_log_get(&gForwardLog, &gForwardLogData);
    mtmd_log_set(clipLog, nullptr);
}

void VisionProfile::begin(Mode m) {
    mode = m;
    firstNodeNs = 0;
    lastNs = 0;
    asked = 0;
    ops.clear();
}

Napi::Promise startLoad(Napi::Env env, Napi::Function ctor, LoadOptions opts) {
    auto * worker = new LoadWorker(env, ctor, std::move(opts));
    Napi::Promise promise = worker->promise();
    worker->Queue();
    return promise;
}

Napi::Promise startEncode(Napi::Env env, Napi::Object self, Vision * vision, const std::vector<Napi::Float32Array> & images,
                          PixelLayout layout, int32_t width, int32_t height, VisionProfile::Mode profile, bool single) {
    auto * worker = new EncodeWorker(env, self, vision, images, layout, width, height, profile, single);
    Napi::Promise promise = worker->promise();
    worker->Queue(vision->thread());
    return promise;
}

Napi::Promise startEncodeJpeg(Napi::Env env, Napi::Object self, Vision * vision, const std::vector<Napi::Uint8Array> & arrays,
                              std::vector<JpegFrame> frames, const DeviceJpegPlan & plan, VisionProfile::Mode profile, bool single) {
    auto * worker = new EncodeWorker(env, self, vision, arrays, std::move(frames), plan, profile, single);
    Napi::Promise promise = worker->promise();
    worker->Queue(vision->thread());
    return promise;
}

Napi::Promise startJpegPixels(Napi::Env env, Napi::Object self, Vision * vision, Napi::Uint8Array array, const JpegFrame & frame,
                              const DeviceJpegPlan & plan) {
    auto * worker = new JpegPixelsWorker(env, self, vision, array, frame, plan);
    Napi::Promise promise = worker->promise();
    worker->Queue(vision->thread());
    return promise;
}

}  // namespace percept
