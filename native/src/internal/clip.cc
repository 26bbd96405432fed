// clip vision encoder (llama-internal.h): load, free, and encode percept's pixels.
#include "../llama-internal.h"

#include "clip-impl.h"  // clip_image_f32 (its buffer is interleaved RGB, row-major)
#include "clip.h"
#include "ggml-backend.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace percept {

clip_ctx * clipLoad(const std::string & path, const ClipOptions & options) {
    clip_context_params cp{};
    cp.use_gpu = options.useGpu;
    cp.device = nullptr;
    cp.flash_attn_type = clip_flash_attn_type(options.flashAttention);
    cp.image_min_tokens = -1;
    cp.image_max_tokens = -1;
    cp.warmup = options.warmup;
    cp.cb_eval = options.evalCallback;
    cp.cb_eval_user_data = options.evalCallbackData;
    cp.no_alloc = false;
    cp.progress_callback = nullptr;
    cp.progress_callback_user_data = nullptr;
    clip_init_result r = clip_init(path.c_str(), cp);
    if (r.ctx_a != nullptr) clip_free(r.ctx_a);
    if (r.ctx_gen_a != nullptr) clip_free(r.ctx_gen_a);
    return r.ctx_v;
}

void clipFree(clip_ctx * ctx) { clip_free(ctx); }

int32_t clipEmbdWidth(const clip_ctx * ctx) { return clip_n_mmproj_embd(ctx); }

bool clipSupportsBatch(const clip_ctx * ctx) { return clip_support_batch(ctx); }

ClipImages::ClipImages() : batch_(std::make_unique<clip_image_f32_batch>()) {}
ClipImages::~ClipImages() = default;

void ClipImages::resize(size_t n) { batch_->entries.resize(n); }

void ClipImages::set(size_t i, int32_t width, int32_t height, const std::vector<float> & hwc) {
    clip_image_f32 & img = batch_->entries.at(i);
    img.set_size({width, height}, /*is_placeholder=*/true, /*is_audio=*/false);
    img.cpy_buf(hwc);  // reuses the entry's capacity from the last call
}

void ClipImages::clear() { batch_->entries.clear(); }

int32_t clipOutputTokens(const clip_ctx * ctx, const ClipImages & images) {
    return clip_n_output_tokens(ctx, &images.batch_->entries.at(0));
}

bool clipEncode(clip_ctx * ctx, int32_t threads, ClipImages & images, size_t first, size_t count, std::vector<float> & out) {
    auto & entries = images.batch_->entries;
    if (first == 0 && count == entries.size()) return clip_image_batch_encode(ctx, threads, images.batch_.get(), out);
    // A part of the batch: its entries are moved into a batch of their own and back (no copies).
    clip_image_f32_batch part;
    part.entries.resize(count);
    for (size_t i = 0; i < count; i++) std::swap(part.entries[i], entries.at(first + i));
    const bool ok = clip_image_batch_encode(ctx, threads, &part, out);
    for (size_t i = 0; i < count; i++) std::swap(part.entries[i], entries[first + i]);
    return ok;
}

std::vector<DeviceBytes> clipMemoryUsage(const clip_ctx * ctx) {
    std::vector<DeviceBytes> out;
    for (const auto & [dev, bytes] : clip_get_mem_usage(ctx))
        out.push_back({dev != nullptr ? ggml_backend_dev_name(dev) : "unknown", bytes});
    return out;
}

}  // namespace percept
