// The threads a Context (and a Vision) owns besides the JS thread.
//
// SerialThread runs every llama.cpp call of one context (decode, sampling, speculation), one job
// after another. llama.cpp's CPU backend keeps its worker team per calling thread (OpenMP's team,
// or the ggml threadpool's master); libuv's pool would hand each call to whichever of its threads
// is free, so the team and its caches would change hands between calls. Work is posted to it
// (ThreadWorker in util.h settles the promise on the JS thread), so no libuv thread waits on it.
//
// DeadlineTimer sets the context's stop flag when an armed deadline passes, so the abort callback
// that llama.cpp calls after every graph node is one relaxed atomic load instead of a clock read.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace percept {

class SerialThread {
public:
    // `name`: the thread's name as tools show it (at most 15 characters); the compute threads it
    // starts inherit it.
    explicit SerialThread(const char * name = "percept-ctx");
    ~SerialThread();  // runs the jobs already queued, then joins
    SerialThread(const SerialThread &) = delete;
    SerialThread & operator=(const SerialThread &) = delete;

    // Queues `job` without waiting (any thread). It must not throw: nothing would see it.
    void post(std::function<void()> job);

private:
    void loop(const char * name);

    std::mutex mutex_;
    std::condition_variable wake_;
    std::deque<std::function<void()>> jobs_;
    bool closing_ = false;
    std::thread thread_;
};

class DeadlineTimer {
public:
    // On expiry, stores `code` into `flag` unless it already holds a non-zero value.
    DeadlineTimer(std::atomic<int> & flag, int code);
    ~DeadlineTimer();
    DeadlineTimer(const DeadlineTimer &) = delete;
    DeadlineTimer & operator=(const DeadlineTimer &) = delete;

    // Arms for a CLOCK_MONOTONIC instant in ns (process.hrtime.bigint()'s clock); replaces any armed one.
    void arm(int64_t deadlineNs);
    void disarm();

private:
    void loop();

    std::atomic<int> & flag_;
    const int code_;
    std::mutex mutex_;
    std::condition_variable wake_;
    int64_t deadlineNs_ = 0;  // 0: disarmed
    bool closing_ = false;
    std::thread thread_;
};

}  // namespace percept
