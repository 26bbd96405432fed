#include "util.h"

#include "abort-report.h"
#include "context-thread.h"
#include "llama.h"
#include "log.h"  // llama.cpp common/log.h: common_log_set_verbosity_thold

#include <cmath>
#include <ctime>
#include <mutex>
#include <sstream>

namespace percept {

Napi::Error codedError(Napi::Env env, const char * code, const std::string & message) {
    Napi::Error err = Napi::Error::New(env, message);
    err.Set("code", Napi::String::New(env, code));
    return err;
}

ThreadWorker::ThreadWorker(Napi::Env env, const char * name, const char * defaultCode)
    : deferred_(Napi::Promise::Deferred::New(env)), env_(env), name_(name), code_(defaultCode) {}

void ThreadWorker::Queue(SerialThread & thread) {
    done_ = Napi::ThreadSafeFunction::New(env_, Napi::Function::New(env_, [](const Napi::CallbackInfo &) {}), name_, 0, 1);
    thread.post([this]() {
        try {
            Execute();
        } catch (const std::exception & e) {
            SetError(e.what());
        } catch (...) {
            SetError("unknown failure");
        }
        // The JS thread may settle and delete this worker as soon as the call is queued: keep the
        // handle on the stack. Queued while the environment closes, the call never runs and the
        // worker is not freed (nothing may touch its JS references off the JS thread).
        Napi::ThreadSafeFunction done = done_;
        done.NonBlockingCall([this](Napi::Env, Napi::Function) { settle(); });
        done.Release();
    });
}

void ThreadWorker::settle() {
    Napi::HandleScope scope(env_);
    if (error_.empty()) {
        try {
            OnOK();
        } catch (const Napi::Error & e) {
            deferred_.Reject(e.Value());
        }
    } else {
        OnError(Napi::Error::New(env_, error_));
    }
    delete this;
}

void ThreadWorker::OnError(const Napi::Error & e) { deferred_.Reject(codedError(env_, code_, e.Message()).Value()); }

int64_t monotonicNs() {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return int64_t(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

namespace {

// A value as the messages show it, as native/args.ts describe() does: `5 of type number`, `null`, `array`.
std::string describe(const Napi::Value & v) {
    switch (v.Type()) {
    case napi_undefined:
        return "undefined of type undefined";
    case napi_null:
        return "null";
    case napi_boolean:
        return std::string(v.As<Napi::Boolean>().Value() ? "true" : "false") + " of type boolean";
    case napi_number:
        return v.ToString().Utf8Value() + " of type number";
    case napi_string:
        return v.As<Napi::String>().Utf8Value() + " of type string";
    case napi_bigint:
        return v.ToString().Utf8Value() + "n";
    case napi_symbol:
        return "a symbol";
    case napi_function:
        return "a function";
    default:
        return v.IsArray() ? "array" : "[object Object] of type object";
    }
}

[[noreturn]] void invalid(const Napi::Object & o, const char * key, const std::string & expected, const char * where, bool range) {
    const std::string msg = "Expected " + expected + " for " + where + "." + key + " but received " + describe(o.Get(key));
    if (range) throw Napi::RangeError::New(o.Env(), msg);
    throw Napi::TypeError::New(o.Env(), msg);
}

}  // namespace

Napi::Object requireObject(const Napi::Value & v, const char * what) {
    if (!v.IsObject()) throw Napi::TypeError::New(v.Env(), std::string("Expected an object for ") + what + " but received " + describe(v));
    return v.As<Napi::Object>();
}

std::string requireString(const Napi::Value & v, const char * what) {
    if (!v.IsString()) throw Napi::TypeError::New(v.Env(), std::string("Expected a string for ") + what + " but received " + describe(v));
    return v.As<Napi::String>().Utf8Value();
}

int64_t requireInt(const Napi::Object & o, const char * key, int64_t min, int64_t max, const char * where) {
    Napi::Value v = o.Get(key);
    const double d = v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : NAN;
    if (!std::isfinite(d) || std::floor(d) != d || d < double(min) || d > double(max)) {
        invalid(o, key, "an integer between " + std::to_string(min) + " and " + std::to_string(max), where, v.IsNumber());
    }
    return int64_t(d);
}

double requireNumber(const Napi::Object & o, const char * key, double min, double max, const char * where) {
    Napi::Value v = o.Get(key);
    const double d = v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : NAN;
    if (!std::isfinite(d) || d < min || d > max) {
        std::ostringstream range;
        range << "a number between " << min << " and " << max;
        invalid(o, key, range.str(), where, v.IsNumber());
    }
    return d;
}

bool requireBool(const Napi::Object & o, const char * key, const char * where) {
    Napi::Value v = o.Get(key);
    if (!v.IsBoolean()) invalid(o, key, "a boolean", where, false);
    return v.As<Napi::Boolean>().Value();
}

std::string requireString(const Napi::Object & o, const char * key, const char * where) {
    Napi::Value v = o.Get(key);
    if (!v.IsString()) invalid(o, key, "a string", where, false);
    return v.As<Napi::String>().Utf8Value();
}

size_t requireChoice(const Napi::Object & o, const char * key, const std::vector<std::string> & choices, const char * where) {
    Napi::Value v = o.Get(key);
    if (v.IsString()) {
        const std::string s = v.As<Napi::String>().Utf8Value();
        for (size_t i = 0; i < choices.size(); i++)
            if (choices[i] == s) return i;
    }
    std::string expected;
    for (size_t i = 0; i < choices.size(); i++)
        expected += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + ("'" + choices[i] + "'");
    invalid(o, key, expected, where, false);
}

std::vector<int32_t> requireTokens(const Napi::Value & v, int32_t limit, const std::string & what) {
    Napi::Env env = v.Env();
    std::vector<int32_t> out;
    if (v.IsTypedArray() && v.As<Napi::TypedArray>().TypedArrayType() == napi_int32_array) {
        Napi::Int32Array a = v.As<Napi::Int32Array>();
        out.assign(a.Data(), a.Data() + a.ElementLength());
    } else if (v.IsArray()) {
        Napi::Array a = v.As<Napi::Array>();
        out.reserve(a.Length());
        for (uint32_t i = 0; i < a.Length(); i++) {
            Napi::Value e = a.Get(i);
            double d = e.IsNumber() ? e.As<Napi::Number>().DoubleValue() : NAN;
            if (!std::isfinite(d) || std::floor(d) != d || d < INT32_MIN || d > INT32_MAX) {
                throw Napi::TypeError::New(env, what + "[" + std::to_string(i) + "] is not an integer token id");
            }
            out.push_back(int32_t(d));
        }
    } else {
        throw Napi::TypeError::New(env, "Expected an Int32Array or an array of token ids for " + what);
    }
    for (size_t i = 0; i < out.size(); i++) {
        if (out[i] < 0 || out[i] >= limit) {
            throw Napi::RangeError::New(env,
                                        what + "[" + std::to_string(i) + "] = " + std::to_string(out[i]) +
                                            " is out of range (vocabulary has " + std::to_string(limit) + " tokens)");
        }
    }
    return out;
}

// ---------------------------------------------------------------------------------------------
// Logging. llama_log_set is process-wide; the capture is per thread (each worker captures the
// errors of its own load/create call) and the forwarder is per environment.

namespace {

thread_local std::string * tlsCapture = nullptr;
thread_local ggml_log_level tlsLastLevel = GGML_LOG_LEVEL_NONE;

struct LogLine {
    int level;
    std::string text;
};

void callJsLog(Napi::Env env, Napi::Function fn, std::nullptr_t *, LogLine * line) {
    if (env != nullptr && fn != nullptr) {
        try {
            fn.Call({Napi::Number::New(env, line->level), Napi::String::New(env, line->text)});
        } catch (...) {
            // A throwing JS logger must not take the process down.
        }
    }
    delete line;
}

using LogTsfn = Napi::TypedThreadSafeFunction<std::nullptr_t, LogLine, callJsLog>;

}  // namespace

struct LogState {
    std::mutex mutex;
    LogTsfn tsfn;
    bool forwarding = false;
};

namespace {

void logCallback(ggml_log_level level, const char * text, void * user) {
    noteLogLine(level, text);  // said on stderr if this thread aborts next (abort-report.h)
    ggml_log_level effective = level == GGML_LOG_LEVEL_CONT ? tlsLastLevel : level;
    if (level != GGML_LOG_LEVEL_CONT) tlsLastLevel = level;
    if (tlsCapture != nullptr && (effective == GGML_LOG_LEVEL_ERROR || effective == GGML_LOG_LEVEL_WARN)) {
        tlsCapture->append(text);
    }
    auto * state = static_cast<LogState *>(user);
    if (state == nullptr) return;
    std::lock_guard<std::mutex> lock(state->mutex);
    if (state->forwarding) state->tsfn.NonBlockingCall(new LogLine{int(effective), text});
}

}  // namespace

LogCapture::LogCapture() { tlsCapture = new std::string(); }
LogCapture::~LogCapture() {
    delete tlsCapture;
    tlsCapture = nullptr;
}
std::string LogCapture::text() const {
    std::string s = tlsCapture ? *tlsCapture : std::string();
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    // Keep the message short: the last three lines carry the reason.
    size_t pos = s.size();
    for (int lines = 0; lines < 3 && pos != std::string::npos && pos > 0; lines++) pos = s.rfind('\n', pos - 1);
    if (pos != std::string::npos && pos > 0) s = s.substr(pos + 1);
    for (char & c : s)
        if (c == '\n') c = ';';
    return s;
}

void installLogger(Napi::Env env, AddonData & data) {
    auto * state = new LogState();
    llama_log_set(logCallback, state);
    installAbortReport();
    common_log_set_verbosity_thold(-1);  // common/ (speculative, sampling) logs through its own sink
    env.AddCleanupHook([state]() {
        llama_log_set(logCallback, nullptr);
        std::lock_guard<std::mutex> lock(state->mutex);
        if (state->forwarding) state->tsfn.Release();
        state->forwarding = false;
        // The state is leaked on purpose: a llama.cpp thread may still be inside logCallback.
    });
    data.log = state;
}

void setLogForwarder(Napi::Env env, const Napi::Value & callback) {
    LogState * state = addonData(env).log;
    if (state == nullptr) throw Napi::Error::New(env, "logger not installed");
    if (!callback.IsNull() && !callback.IsUndefined() && !callback.IsFunction()) {
        throw Napi::TypeError::New(env, "setLogger: expected a function or null");
    }
    std::lock_guard<std::mutex> lock(state->mutex);
    if (state->forwarding) {
        state->tsfn.Release();
        state->forwarding = false;
    }
    if (callback.IsFunction()) {
        state->tsfn = LogTsfn::New(env, callback.As<Napi::Function>(), "percept-log", 0, 1);
        state->tsfn.Unref(env);  // logging must not keep the process alive
        state->forwarding = true;
        common_log_set_verbosity_thold(LOG_LEVEL_WARN);
    } else {
        common_log_set_verbosity_thold(-1);
    }
}

}  // namespace percept
