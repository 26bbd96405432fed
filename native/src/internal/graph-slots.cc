// Graph slots (llama-internal.h, native/patches/llama-graph-slots.diff): built graphs kept per step shape.
#include "../llama-internal.h"

#include "llama-context.h"  // llama_context::set_graph_slots

namespace percept {

void setGraphSlots(llama_context * ctx, uint32_t slots) { ctx->set_graph_slots(slots); }

}  // namespace percept
