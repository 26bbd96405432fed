#include "context-thread.h"

#include <chrono>

#include <pthread.h>

namespace percept {

SerialThread::SerialThread(const char * name) : thread_([this, name]() { loop(name); }) {}

SerialThread::~SerialThread() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        closing_ = true;
    }
    wake_.notify_one();
    thread_.join();
}

void SerialThread::post(std::function<void()> job) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        jobs_.push_back(std::move(job));
    }
    wake_.notify_one();
}

void SerialThread::loop(const char * name) {
    pthread_setname_np(pthread_self(), name);
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
        wake_.wait(lock, [this]() { return closing_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // closing, nothing left
        std::function<void()> job = std::move(jobs_.front());
        jobs_.pop_front();
        lock.unlock();
        job();
        lock.lock();
    }
}

// ------------------------------------------------------------------------------------------------

DeadlineTimer::DeadlineTimer(std::atomic<int> & flag, int code) : flag_(flag), code_(code) {}

DeadlineTimer::~DeadlineTimer() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        closing_ = true;
    }
    wake_.notify_one();
    if (thread_.joinable()) thread_.join();
}

void DeadlineTimer::arm(int64_t deadlineNs) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        deadlineNs_ = deadlineNs;
        if (!thread_.joinable()) thread_ = std::thread([this]() { loop(); });  // started on first use
    }
    wake_.notify_one();
}

void DeadlineTimer::disarm() {
    std::lock_guard<std::mutex> lock(mutex_);
    deadlineNs_ = 0;  // the loop sees it when it wakes; nothing to signal
}

void DeadlineTimer::loop() {
    using Clock = std::chrono::steady_clock;  // CLOCK_MONOTONIC on Linux, like process.hrtime
    std::unique_lock<std::mutex> lock(mutex_);
    while (!closing_) {
        if (deadlineNs_ == 0) {
            wake_.wait(lock);
            continue;
        }
        const Clock::time_point at{std::chrono::nanoseconds(deadlineNs_)};
        if (Clock::now() < at) {
            wake_.wait_until(lock, at);  // re-checks: the deadline may have been disarmed or replaced
            continue;
        }
        int expected = 0;
        flag_.compare_exchange_strong(expected, code_, std::memory_order_relaxed);
        deadlineNs_ = 0;
    }
}

}  // namespace percept
