// percept-abort-report: the abort report (native/src/abort-report.h) the way the addon wires it,
// for test/native/abort-report.test.ts. ggml's log callback feeds noteLogLine; ggml itself logs the
// errors (a CPU buffer that cannot be allocated); then ggml aborts, as ggml_cuda_error does after
// logging the CUDA error. Arguments: the size that fails on the main thread (must not be reported:
// another thread aborts), then the sizes that fail, in order, on the aborting thread.
#include "abort-report.h"

#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

void failAllocation(size_t size) {
    if (ggml_backend_buft_alloc_buffer(ggml_backend_cpu_buffer_type(), size) != nullptr) {
        std::fprintf(stderr, "percept-abort-report: %zu bytes were allocated\n", size);
        std::exit(3);
    }
}

}  // namespace

int main(int argc, char ** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: percept-abort-report MAIN_SIZE SIZE...\n");
        return 2;
    }
    ggml_log_set([](ggml_log_level level, const char * text, void *) { percept::noteLogLine(level, text); }, nullptr);
    percept::installAbortReport();
    failAllocation(std::strtoull(argv[1], nullptr, 10));
    std::vector<size_t> sizes;
    for (int i = 2; i < argc; i++) sizes.push_back(std::strtoull(argv[i], nullptr, 10));
    std::thread worker([&sizes]() {
        for (size_t s : sizes) failAllocation(s);
        GGML_ABORT("percept-abort-report: abort after %zu errors", sizes.size());
    });
    worker.join();
    return 0;
}
