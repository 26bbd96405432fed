// What a native abort says on stderr.
//
// ggml and llama.cpp log why they give up, then abort: ggml_cuda_error logs the CUDA error string,
// the failed call and where it was, and only then calls ggml_abort, whose own message is just
// "CUDA error". percept's logger is quiet unless JS asks for the lines, and then hands them to the
// JS thread, which never runs again once the process aborts: the reason was lost. Each thread keeps
// its last error lines here, and ggml_abort's callback writes them to stderr, then ggml's message
// and backtrace (GGML_NO_BACKTRACE=1 leaves the backtrace out, as ggml's own default does).
#pragma once

#include "ggml.h"

namespace percept {

// From the log callback, for every line: keeps this thread's last error lines (and their
// continuations), bounded.
void noteLogLine(ggml_log_level level, const char * text);

// Installs the abort callback (once per process; later calls do nothing).
void installAbortReport();

}  // namespace percept
