#include "abort-report.h"

#include <cstdio>
#include <mutex>
#include <string>

// ggml's backtrace printer (gdb, else backtrace_symbols), what ggml_abort prints without a
// callback; ggml-impl.h declares it, outside ggml's public headers.
extern "C" void ggml_print_backtrace(void);

namespace percept {

namespace {

// Enough for the few lines before an abort (ggml_cuda_error logs three).
constexpr size_t kKeptBytes = 4096;

thread_local std::string tlsErrors;
thread_local bool tlsInError = false;  // whether a GGML_LOG_LEVEL_CONT line continues an error

void reportAbort(const char * message) {
    std::string text;
    if (!tlsErrors.empty()) {
        text = "percept: the last errors logged on the aborting thread:\n" + tlsErrors;
        if (text.back() != '\n') text += '\n';
    }
    text += message;
    text += '\n';
    std::fputs(text.c_str(), stderr);
    std::fflush(stderr);
    ggml_print_backtrace();
}

}  // namespace

void noteLogLine(ggml_log_level level, const char * text) {
    if (level != GGML_LOG_LEVEL_CONT) tlsInError = level == GGML_LOG_LEVEL_ERROR;
    if (!tlsInError || text == nullptr) return;
    tlsErrors += text;
    if (tlsErrors.size() <= kKeptBytes) return;
    // Keep the newest bytes, from a line start.
    size_t cut = tlsErrors.size() - kKeptBytes;
    const size_t eol = tlsErrors.find('\n', cut);
    cut = eol == std::string::npos ? cut : eol + 1;
    tlsErrors.erase(0, cut);
}

void installAbortReport() {
    static std::once_flag once;
    std::call_once(once, []() { ggml_set_abort_callback(reportAbort); });
}

}  // namespace percept
