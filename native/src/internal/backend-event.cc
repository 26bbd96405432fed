// Backend events (llama-internal.h): the cudaEvent_t inside a ggml-cuda backend event.
#include "../llama-internal.h"

#include "ggml-backend-impl.h"  // ggml_backend_event

namespace percept {

void * cudaEventOf(ggml_backend_event_t event) { return event != nullptr ? event->context : nullptr; }

}  // namespace percept
