// What a native abort says on stderr: this thread's last error lines, then ggml's message and backtrace.
// Without it the reason was lost: percept's log reaches JS on a thread that never runs again.
// Details: native/README.md#abort-reports
#pragma once

#include "ggml.h"

namespace percept {

// From the log callback, for every line: keeps this thread's last error lines (and their
// continuations), bounded.
void noteLogLine(ggml_log_level level, const char * text);

// Installs the abort callback (once per process; later calls do nothing).
void installAbortReport();

}  // namespace percept
