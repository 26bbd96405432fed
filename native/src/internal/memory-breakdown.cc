// Memory per buffer type (llama-internal.h): llama.cpp's staging C++ API for model, KV and compute bytes.
#include "../llama-internal.h"

#include "ggml-backend.h"
#include "llama-ext.h"  // llama_get_memory_breakdown

#include <string>
#include <vector>

namespace percept {

std::vector<BufferBytes> memoryBreakdown(const llama_context * ctx) {
    std::vector<BufferBytes> out;
    for (const auto & [buft, d] : llama_get_memory_breakdown(ctx)) {
        out.push_back({ggml_backend_buft_name(buft), d.model, d.context, d.compute});
    }
    return out;
}

}  // namespace percept
