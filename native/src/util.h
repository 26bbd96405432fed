// Shared helpers of the percept addon:
//   - argument checks that throw TypeError or RangeError, never UB;
//   - errors with a `code`, and the monotonic clock;
//   - the log capture that turns llama.cpp's last error lines into a thrown JS error's message.
#pragma once

#include <napi.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace percept {

// Constructors of the wrapped classes, kept per Node environment (worker_threads each get one).
struct LogState;
struct AddonData {
    LogState * log = nullptr;  // owned by the log cleanup hook
    Napi::FunctionReference modelCtor;
    Napi::FunctionReference contextCtor;
    Napi::FunctionReference grammarCtor;
};

inline AddonData & addonData(Napi::Env env) { return *env.GetInstanceData<AddonData>(); }

// An Error with a `code` property (EBUSY, EDISPOSED, ECANCELED...), like Node's system errors.
Napi::Error codedError(Napi::Env env, const char * code, const std::string & message);

// A failure inside Execute() that knows its error code (ERANGE, ENOENT...).
struct CodedFailure : std::runtime_error {
    const char * code;
    CodedFailure(const char * c, const std::string & message) : std::runtime_error(message), code(c) {}
};

// An AsyncWorker that settles a promise. Execute() fails with SetError (the worker's default code) or SetCodedError (e.g. ENOENT).
// The promise is then rejected with an Error carrying that code.
// Subclasses that hold a busy flag release it in OnError, then call this one.
class PromiseWorker : public Napi::AsyncWorker {
public:
    Napi::Promise promise() { return deferred_.Promise(); }

protected:
    PromiseWorker(Napi::Env env, const char * name, const char * defaultCode)
        : Napi::AsyncWorker(env, name), deferred_(Napi::Promise::Deferred::New(env)), code_(defaultCode) {}
    void SetCodedError(const char * code, const std::string & message) {
        code_ = code;
        SetError(message);
    }
    void OnError(const Napi::Error & e) override { deferred_.Reject(codedError(Env(), code_, e.Message()).Value()); }

    Napi::Promise::Deferred deferred_;

private:
    const char * code_;
};

class SerialThread;

// PromiseWorker's shape, for work on a thread the addon owns: a context's or a vision encoder's SerialThread.
// Execute runs off the JS thread, then OnOK or OnError on it.
// The owned thread settles the promise through a thread-safe function, so no libuv pool thread sits waiting.
// The pool stays free for what runs on it: sharp, the layout pass, fs.
// Queue() hands the worker over; it deletes itself once settled.
// Like an AsyncWorker, a queued worker keeps the event loop alive until it settles.
class ThreadWorker {
public:
    virtual ~ThreadWorker() = default;
    ThreadWorker(const ThreadWorker &) = delete;
    ThreadWorker & operator=(const ThreadWorker &) = delete;
    Napi::Promise promise() { return deferred_.Promise(); }
    void Queue(SerialThread & thread);

protected:
    ThreadWorker(Napi::Env env, const char * name, const char * defaultCode);
    virtual void Execute() = 0;  // on the owned thread
    virtual void OnOK() = 0;     // on the JS thread
    virtual void OnError(const Napi::Error & e);
    void SetError(const std::string & message) { error_ = message.empty() ? "failed" : message; }
    void SetCodedError(const char * code, const std::string & message) {
        code_ = code;
        SetError(message);
    }
    Napi::Env Env() const { return env_; }

    Napi::Promise::Deferred deferred_;

private:
    void settle();

    Napi::Env env_;
    const char * name_;
    const char * code_;
    std::string error_;  // set by Execute: the promise is rejected
    Napi::ThreadSafeFunction done_;
};

// Monotonic nanoseconds on the clock process.hrtime.bigint() reads (CLOCK_MONOTONIC on Linux).
int64_t monotonicNs();

// Argument readers. JS (native/llama.ts, native/vision.ts) validates first and owns every default.
// So each option field is required here. C++ checks shape and range again: a wrong value would be undefined behaviour.
// Messages take the shape of native/args.ts: "Expected <what> for <where>.<key> but received <value>".
Napi::Object requireObject(const Napi::Value & v, const char * what);
std::string requireString(const Napi::Value & v, const char * what);
int64_t requireInt(const Napi::Object & o, const char * key, int64_t min, int64_t max, const char * where);
double requireNumber(const Napi::Object & o, const char * key, double min, double max, const char * where);
bool requireBool(const Napi::Object & o, const char * key, const char * where);
std::string requireString(const Napi::Object & o, const char * key, const char * where);
// One of `choices`; returns its index.
size_t requireChoice(const Napi::Object & o, const char * key, const std::vector<std::string> & choices, const char * where);
// Reads an Int32Array or an array of integers in [0, limit).
std::vector<int32_t> requireTokens(const Napi::Value & v, int32_t limit, const std::string & what);

// llama.cpp logs its reasons (bad magic, truncated tensor, unknown architecture) and returns NULL.
// Capture the error lines printed on this thread, so the JS error can say why.
class LogCapture {
public:
    LogCapture();
    ~LogCapture();
    // Error/warning lines logged on this thread since construction, trimmed; empty if none.
    std::string text() const;
};

// Installs the llama/ggml log callback. Quiet by default; `forward` sends lines to JS.
void installLogger(Napi::Env env, AddonData & data);
void setLogForwarder(Napi::Env env, const Napi::Value & callback);  // function or null

}  // namespace percept
