// The threads a Context (and a Vision) owns besides the JS thread: a SerialThread and a DeadlineTimer.
// Why a thread of its own, and why a timer: native/README.md#threads
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace percept {

// Runs every llama.cpp call of one context (decode, sampling, speculation), one job after another.
class SerialThread {
public:
    // `name`: the thread's name as tools show it, at most 15 characters.
    // The compute threads it starts inherit it.
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

// Sets the context's stop flag when an armed deadline passes.
// So llama.cpp's abort callback after every graph node is one relaxed atomic load, not a clock read.
class DeadlineTimer {
public:
    // On expiry, stores `code` into `flag` unless it already holds a non-zero value.
    DeadlineTimer(std::atomic<int> & flag, int code);
    ~DeadlineTimer();
    DeadlineTimer(const DeadlineTimer &) = delete;
    DeadlineTimer & operator=(const DeadlineTimer &) = delete;

    // Arms for a CLOCK_MONOTONIC instant in ns, process.hrtime.bigint()'s clock. Replaces any armed one.
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
