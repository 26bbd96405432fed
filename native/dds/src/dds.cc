// percept_dds: a thin Cyclone DDS writer and reader of serialized samples. TypeScript owns the CDR; this file
// moves bytes. A custom sertype carries raw CDR (encapsulation header included), as rmw_cyclonedds does for
// rmw_publish_serialized_message (rmw_cyclonedds_cpp/src/serdata.cpp). Design: native/dds/README.md
//
// Writes never block the JS thread: write() copies the bytes into a bounded queue that one native thread
// drains into dds_writecdr. Readers notify JS through a thread-safe function; JS then takes the samples.
#include <napi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dds/dds.h"
#include "dds/ddsi/ddsi_serdata.h"
#include "dds/ddsi/ddsi_sertype.h"
#include "dds/ddsi/q_radmin.h"

namespace {

// ---- the raw-CDR sertype -------------------------------------------------------------------------------

struct RawSertype {
    ddsi_sertype c;
};

struct RawSerdata {
    ddsi_serdata c;
    uint32_t size;
    unsigned char * data;
};

// DDSI may read a sample's last 4-byte word whole, so buffers are zero-padded to a multiple of 4
// (the same reason rmw_cyclonedds_cpp/src/serdata.cpp serdata_rmw::resize gives).
RawSerdata * newSerdata(const ddsi_sertype * type, ddsi_serdata_kind kind, size_t size) {
    auto * d = new RawSerdata();
    ddsi_serdata_init(&d->c, type, kind);
    const size_t padded = (size + 3) & ~size_t(3);
    d->size = static_cast<uint32_t>(padded);
    d->data = padded ? static_cast<unsigned char *>(calloc(1, padded)) : nullptr;
    return d;
}

bool serdataEqkey(const ddsi_serdata *, const ddsi_serdata *) { return true; }  // keyless: one instance
uint32_t serdataSize(const ddsi_serdata * d) { return reinterpret_cast<const RawSerdata *>(d)->size; }

// Received fragments (q_radmin.h nn_rdata) are concatenated; a later fragment may overlap the one before.
ddsi_serdata * serdataFromSer(const ddsi_sertype * type, ddsi_serdata_kind kind, const nn_rdata * fragchain, size_t size) {
    RawSerdata * d = newSerdata(type, kind, size);
    uint32_t done = 0;
    for (const nn_rdata * frag = fragchain; frag; frag = frag->nextfrag) {
        if (frag->maxp1 <= done) continue;
        const unsigned char * payload = NN_RMSG_PAYLOADOFF(frag->rmsg, NN_RDATA_PAYLOAD_OFF(frag));
        memcpy(d->data + done, payload + (done - frag->min), frag->maxp1 - done);
        done = frag->maxp1;
    }
    return &d->c;
}

ddsi_serdata * serdataFromSerIov(const ddsi_sertype * type, ddsi_serdata_kind kind, ddsrt_msg_iovlen_t niov, const ddsrt_iovec_t * iov,
                                 size_t size) {
    RawSerdata * d = newSerdata(type, kind, size);
    size_t off = 0;
    for (ddsrt_msg_iovlen_t i = 0; i < niov && off < size; i++) {
        const size_t n = std::min(static_cast<size_t>(iov[i].iov_len), size - off);
        memcpy(d->data + off, iov[i].iov_base, n);
        off += n;
    }
    return &d->c;
}

ddsi_serdata * serdataFromKeyhash(const ddsi_sertype * type, const ddsi_keyhash *) { return &newSerdata(type, SDK_KEY, 0)->c; }

/** A sample for dds_write: the CDR bytes. Only dds_writecdr is used, but Cyclone may ask. */
struct RawSample {
    const void * data;
    size_t size;
};

ddsi_serdata * serdataFromSample(const ddsi_sertype * type, ddsi_serdata_kind kind, const void * sample) {
    const auto * s = static_cast<const RawSample *>(sample);
    RawSerdata * d = newSerdata(type, kind, kind == SDK_DATA ? s->size : 0);
    if (kind == SDK_DATA && s->size) memcpy(d->data, s->data, s->size);
    return &d->c;
}

void serdataToSer(const ddsi_serdata * dcmn, size_t off, size_t sz, void * buf) {
    memcpy(buf, reinterpret_cast<const RawSerdata *>(dcmn)->data + off, sz);
}

ddsi_serdata * serdataToSerRef(const ddsi_serdata * dcmn, size_t off, size_t sz, ddsrt_iovec_t * ref) {
    ref->iov_base = reinterpret_cast<const RawSerdata *>(dcmn)->data + off;
    ref->iov_len = static_cast<ddsrt_iov_len_t>(sz);
    return ddsi_serdata_ref(dcmn);
}

void serdataToSerUnref(ddsi_serdata * d, const ddsrt_iovec_t *) { ddsi_serdata_unref(d); }
bool serdataToSample(const ddsi_serdata *, void *, void **, void *) { return false; }  // samples are taken as CDR

// The untyped form is the key, and these topics have none (as serdata_rmw_to_untyped in serdata.cpp).
ddsi_serdata * serdataToUntyped(const ddsi_serdata * dcmn) {
    RawSerdata * d = newSerdata(dcmn->type, SDK_KEY, 0);
    d->c.type = nullptr;
    return &d->c;
}

bool serdataUntypedToSample(const ddsi_sertype *, const ddsi_serdata *, void *, void **, void *) { return false; }

void serdataFree(ddsi_serdata * dcmn) {
    auto * d = reinterpret_cast<RawSerdata *>(dcmn);
    free(d->data);
    delete d;
}

size_t serdataPrint(const ddsi_sertype *, const ddsi_serdata * dcmn, char * buf, size_t size) {
    return static_cast<size_t>(snprintf(buf, size, "(%u bytes of CDR)", reinterpret_cast<const RawSerdata *>(dcmn)->size));
}

void serdataGetKeyhash(const ddsi_serdata *, ddsi_keyhash * buf, bool) { memset(buf, 0, sizeof(*buf)); }

const ddsi_serdata_ops RAW_SERDATA_OPS = {
    serdataEqkey, serdataSize,     serdataFromSer,    serdataFromSerIov, serdataFromKeyhash, serdataFromSample,
    serdataToSer, serdataToSerRef, serdataToSerUnref, serdataToSample,   serdataToUntyped,   serdataUntypedToSample,
    serdataFree,  serdataPrint,    serdataGetKeyhash,
#ifdef DDS_HAS_SHM
    nullptr,  // get_sample_size: shared memory stays off (loopback UDP only)
    nullptr,  // from_iox_buffer
#endif
};

void sertypeFree(ddsi_sertype * tp) {
    ddsi_sertype_fini(tp);
    delete reinterpret_cast<RawSertype *>(tp);
}
void sertypeZeroSamples(const ddsi_sertype *, void *, size_t) {}
void sertypeReallocSamples(void ** ptrs, const ddsi_sertype *, void *, size_t, size_t count) {
    for (size_t i = 0; i < count; i++) ptrs[i] = nullptr;
}
void sertypeFreeSamples(const ddsi_sertype *, void **, size_t, dds_free_op_t) {}
// Same type name and same ops: the same type (the name is compared by Cyclone itself).
bool sertypeEqual(const ddsi_sertype *, const ddsi_sertype *) { return true; }
uint32_t sertypeHash(const ddsi_sertype *) { return 0x70657263u; }

const ddsi_sertype_ops RAW_SERTYPE_OPS = {
    ddsi_sertype_v0,
    nullptr,
    sertypeFree,
    sertypeZeroSamples,
    sertypeReallocSamples,
    sertypeFreeSamples,
    sertypeEqual,
    sertypeHash,
    // No type information: discovery matches by topic and type name, as rmw_cyclonedds' sertype_rmw_ops.
    nullptr,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
};

ddsi_sertype * newRawSertype(const std::string & typeName) {
    auto * st = new RawSertype();
    ddsi_sertype_init_flags(&st->c, typeName.c_str(), &RAW_SERTYPE_OPS, &RAW_SERDATA_OPS, DDSI_SERTYPE_FLAG_TOPICKIND_NO_KEY);
    // XCDR1 only, as rmw_cyclonedds' create_sertype (serdata.cpp) states for ROS 2 types.
    st->c.allowed_data_representation = DDS_DATA_REPRESENTATION_FLAG_XCDR1;
    return &st->c;
}

// ---- the participant -----------------------------------------------------------------------------------

std::string ddsError(const char * what, dds_return_t rc) { return std::string(what) + ": " + dds_strretcode(rc); }

// Deleting a domain deletes every participant in it, so the domain an explicit config created is deleted
// only when the process's last participant on that domain id closes.
struct DomainUse {
    dds_entity_t domain = 0;  // 0: Cyclone created it implicitly
    int participants = 0;
};
std::mutex domainsMu;
std::map<dds_domainid_t, DomainUse> domains;

struct WriterState {
    dds_entity_t writer = 0;
    ddsi_sertype * sertype = nullptr;  // not counted: the topic owns it
    std::string topic;
    uint64_t written = 0;
    uint64_t failed = 0;
    uint64_t dropped = 0;
    std::string lastError;
};

// Samples are taken from Cyclone as they arrive, into a queue of the reader's keep-last depth.
// So an overwrite happens here, where it is counted: Cyclone's statuses do not count keep-last overwrites.
struct ReaderState : std::enable_shared_from_this<ReaderState> {
    dds_entity_t reader = 0;
    std::string topic;
    Napi::ThreadSafeFunction notify;
    std::atomic<bool> pending{false};
    std::atomic<bool> open{true};
    std::mutex mu;
    std::deque<ddsi_serdata *> samples;  // guarded by mu, oldest first
    size_t depth = 1;
    uint64_t overwritten = 0;  // guarded by mu

    void clear() {
        std::lock_guard<std::mutex> lock(mu);
        for (ddsi_serdata * d : samples) ddsi_serdata_unref(d);
        samples.clear();
    }
    ~ReaderState() { clear(); }
};

struct Job {
    std::shared_ptr<WriterState> writer;
    std::vector<unsigned char> bytes;
};

class Participant : public Napi::ObjectWrap<Participant> {
public:
    static Napi::Function Define(Napi::Env env) {
        return DefineClass(env, "Participant",
                           {
                               InstanceMethod("createWriter", &Participant::CreateWriter),
                               InstanceMethod("createReader", &Participant::CreateReader),
                               InstanceMethod("write", &Participant::Write),
                               InstanceMethod("writerStats", &Participant::WriterStats),
                               InstanceMethod("matched", &Participant::Matched),
                               InstanceMethod("take", &Participant::Take),
                               InstanceMethod("lost", &Participant::Lost),
                               InstanceMethod("drain", &Participant::Drain),
                               InstanceMethod("close", &Participant::Close),
                           });
    }

    // new Participant(domainId, configXml | '', queueCapacity)
    explicit Participant(const Napi::CallbackInfo & info) : Napi::ObjectWrap<Participant>(info) {
        Napi::Env env = info.Env();
        const auto domainId = static_cast<dds_domainid_t>(info[0].As<Napi::Number>().Uint32Value());
        const std::string config = info[1].As<Napi::String>().Utf8Value();
        capacity_ = info[2].As<Napi::Number>().Uint32Value();
        domainId_ = domainId;
        std::lock_guard<std::mutex> lock(domainsMu);
        DomainUse & use = domains[domainId];
        if (!config.empty() && use.participants == 0) {
            const dds_entity_t domain = dds_create_domain(domainId, config.c_str());
            // PRECONDITION_NOT_MET: the domain runs already (created elsewhere); it keeps its config.
            if (domain < 0 && domain != DDS_RETCODE_PRECONDITION_NOT_MET) {
                domains.erase(domainId);
                throw Napi::Error::New(env, ddsError("dds_create_domain", domain));
            }
            if (domain > 0) use.domain = domain;
        }
        participant_ = dds_create_participant(domainId, nullptr, nullptr);
        if (participant_ < 0) {
            if (use.participants == 0) {
                if (use.domain > 0) dds_delete(use.domain);
                domains.erase(domainId);
            }
            throw Napi::Error::New(env, ddsError("dds_create_participant", participant_));
        }
        use.participants++;
        thread_ = std::thread([this] { Pump(); });
    }

    ~Participant() override { Shutdown(); }

private:
    dds_domainid_t domainId_ = 0;
    dds_entity_t participant_ = 0;
    size_t capacity_ = 1024;
    std::thread thread_;
    std::mutex mu_;
    std::condition_variable wake_;
    std::condition_variable idle_;
    std::deque<Job> queue_;
    bool busy_ = false;
    bool stopping_ = false;
    std::map<dds_entity_t, std::shared_ptr<WriterState>> writers_;
    std::map<dds_entity_t, std::shared_ptr<ReaderState>> readers_;

    void Pump() {
        std::unique_lock<std::mutex> lock(mu_);
        for (;;) {
            wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
            if (queue_.empty()) return;  // stopping, nothing left
            Job job = std::move(queue_.front());
            queue_.pop_front();
            busy_ = true;
            lock.unlock();
            // A reliable writer may wait here up to its max_blocking_time; the JS thread never does.
            ddsrt_iovec_t iov;
            iov.iov_base = job.bytes.data();
            iov.iov_len = static_cast<ddsrt_iov_len_t>(job.bytes.size());
            ddsi_serdata * d = ddsi_serdata_from_ser_iov(job.writer->sertype, SDK_DATA, 1, &iov, job.bytes.size());
            const dds_return_t rc = dds_writecdr(job.writer->writer, d);
            lock.lock();
            busy_ = false;
            if (rc >= 0) {
                job.writer->written++;
            } else {
                job.writer->failed++;
                job.writer->lastError = ddsError("dds_writecdr", rc);
            }
            if (queue_.empty()) idle_.notify_all();
        }
    }

    void Shutdown() {
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (participant_ <= 0) return;
            stopping_ = true;
            for (auto & job : queue_) job.writer->dropped++;
            queue_.clear();
        }
        wake_.notify_all();
        if (thread_.joinable()) thread_.join();
        for (auto & [_, r] : readers_) r->open = false;
        // Deletes every reader, writer and topic; listeners in progress finish first.
        dds_delete(participant_);
        participant_ = 0;
        ReleaseDomain();
        // A notification still queued holds its own reference to its state.
        for (auto & [_, r] : readers_) {
            r->notify.Release();
            r->clear();
        }
    }

    void ReleaseDomain() {
        std::lock_guard<std::mutex> lock(domainsMu);
        auto it = domains.find(domainId_);
        if (it == domains.end() || --it->second.participants > 0) return;
        if (it->second.domain > 0) dds_delete(it->second.domain);
        domains.erase(it);
    }

    void CheckOpen(Napi::Env env) {
        if (participant_ <= 0) throw Napi::Error::New(env, "dds: the participant is closed");
    }

    /** qos: { reliable, depth, maxBlockingMs } */
    static dds_qos_t * MakeQos(const Napi::Object & q) {
        dds_qos_t * qos = dds_create_qos();
        const bool reliable = q.Get("reliable").ToBoolean();
        const int32_t depth = q.Get("depth").As<Napi::Number>().Int32Value();
        const int64_t blockMs = q.Has("maxBlockingMs") ? q.Get("maxBlockingMs").As<Napi::Number>().Int64Value() : 100;
        // ROS 2 profiles as rmw_cyclonedds' create_readwrite_qos (rmw_node.cpp) sets them: keep-last depth,
        // volatile, no autodispose; reliable or best effort.
        dds_qset_history(qos, DDS_HISTORY_KEEP_LAST, depth);
        dds_qset_durability(qos, DDS_DURABILITY_VOLATILE);
        dds_qset_writer_data_lifecycle(qos, false);
        if (reliable) dds_qset_reliability(qos, DDS_RELIABILITY_RELIABLE, DDS_MSECS(blockMs));
        else dds_qset_reliability(qos, DDS_RELIABILITY_BEST_EFFORT, 0);
        return qos;
    }

    dds_entity_t MakeTopic(Napi::Env env, const std::string & name, const std::string & typeName, ddsi_sertype ** actual) {
        ddsi_sertype * st = newRawSertype(typeName);
        const dds_entity_t topic = dds_create_topic_sertype(participant_, name.c_str(), &st, nullptr, nullptr, nullptr);
        if (topic < 0) {
            ddsi_sertype_unref(st);
            throw Napi::Error::New(env, ddsError(("dds_create_topic_sertype " + name + " (" + typeName + ")").c_str(), topic));
        }
        *actual = st;  // the sertype Cyclone uses, valid while the topic lives (as create_topic in rmw_node.cpp)
        return topic;
    }

    // createWriter(topicName, typeName, qos) → writer handle
    Napi::Value CreateWriter(const Napi::CallbackInfo & info) {
        Napi::Env env = info.Env();
        CheckOpen(env);
        auto state = std::make_shared<WriterState>();
        state->topic = info[0].As<Napi::String>().Utf8Value();
        const dds_entity_t topic = MakeTopic(env, state->topic, info[1].As<Napi::String>().Utf8Value(), &state->sertype);
        dds_qos_t * qos = MakeQos(info[2].As<Napi::Object>());
        state->writer = dds_create_writer(participant_, topic, qos, nullptr);
        dds_delete_qos(qos);
        if (state->writer < 0) throw Napi::Error::New(env, ddsError(("dds_create_writer " + state->topic).c_str(), state->writer));
        std::lock_guard<std::mutex> lock(mu_);
        writers_[state->writer] = state;
        return Napi::Number::New(env, state->writer);
    }

    static void OnDataAvailable(dds_entity_t reader, void * arg) {
        auto * r = static_cast<ReaderState *>(arg);
        if (!r->open) return;
        // On Cyclone's listener thread: move every arrived sample into the queue, counting what the depth pushes out.
        for (;;) {
            ddsi_serdata * d = nullptr;
            dds_sample_info_t si;
            if (dds_takecdr(reader, &d, 1, &si, DDS_ANY_STATE) <= 0) break;
            if (!si.valid_data) {
                ddsi_serdata_unref(d);
                continue;
            }
            std::lock_guard<std::mutex> lock(r->mu);
            r->samples.push_back(d);
            if (r->samples.size() > r->depth) {
                ddsi_serdata_unref(r->samples.front());
                r->samples.pop_front();
                r->overwritten++;
            }
        }
        // One notification in flight at a time: JS takes everything there is when it runs.
        if (r->pending.exchange(true)) return;
        // The queued call owns the state: it may run after the participant dropped it.
        auto call = [self = r->shared_from_this()](Napi::Env, Napi::Function fn) {
            self->pending = false;
            if (self->open) fn.Call({});
        };
        if (r->notify.NonBlockingCall(call) != napi_ok) r->pending = false;
    }

    // createReader(topicName, typeName, qos, onData) → reader handle; onData() is called when samples wait.
    Napi::Value CreateReader(const Napi::CallbackInfo & info) {
        Napi::Env env = info.Env();
        CheckOpen(env);
        auto state = std::make_shared<ReaderState>();
        state->topic = info[0].As<Napi::String>().Utf8Value();
        ddsi_sertype * sertype = nullptr;
        const dds_entity_t topic = MakeTopic(env, state->topic, info[1].As<Napi::String>().Utf8Value(), &sertype);
        ReaderState * raw = state.get();
        state->depth = std::max<int32_t>(1, info[2].As<Napi::Object>().Get("depth").As<Napi::Number>().Int32Value());
        state->notify = Napi::ThreadSafeFunction::New(env, info[3].As<Napi::Function>(), "percept-dds-reader", 0, 1);
        dds_qos_t * qos = MakeQos(info[2].As<Napi::Object>());
        dds_listener_t * listener = dds_create_listener(raw);
        dds_lset_data_available(listener, OnDataAvailable);
        state->reader = dds_create_reader(participant_, topic, qos, listener);
        dds_delete_listener(listener);
        dds_delete_qos(qos);
        if (state->reader < 0) {
            state->notify.Release();
            throw Napi::Error::New(env, ddsError(("dds_create_reader " + state->topic).c_str(), state->reader));
        }
        readers_[state->reader] = state;
        return Napi::Number::New(env, state->reader);
    }

    std::shared_ptr<WriterState> WriterOf(Napi::Env env, const Napi::Value & v) {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = writers_.find(v.As<Napi::Number>().Int32Value());
        if (it == writers_.end()) throw Napi::Error::New(env, "dds: no such writer");
        return it->second;
    }

    // write(writer, bytes) → true when queued without dropping an older sample.
    Napi::Value Write(const Napi::CallbackInfo & info) {
        Napi::Env env = info.Env();
        CheckOpen(env);
        auto writer = WriterOf(env, info[0]);
        auto bytes = info[1].As<Napi::Uint8Array>();
        Job job{writer, std::vector<unsigned char>(bytes.Data(), bytes.Data() + bytes.ByteLength())};
        bool dropped = false;
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (queue_.size() >= capacity_) {
                queue_.front().writer->dropped++;
                queue_.pop_front();
                dropped = true;
            }
            queue_.push_back(std::move(job));
        }
        wake_.notify_one();
        return Napi::Boolean::New(env, !dropped);
    }

    Napi::Value WriterStats(const Napi::CallbackInfo & info) {
        Napi::Env env = info.Env();
        auto writer = WriterOf(env, info[0]);
        std::lock_guard<std::mutex> lock(mu_);
        size_t queued = 0;
        for (const auto & job : queue_) queued += job.writer == writer;
        Napi::Object out = Napi::Object::New(env);
        out.Set("written", Napi::Number::New(env, static_cast<double>(writer->written)));
        out.Set("failed", Napi::Number::New(env, static_cast<double>(writer->failed)));
        out.Set("dropped", Napi::Number::New(env, static_cast<double>(writer->dropped)));
        out.Set("queued", Napi::Number::New(env, static_cast<double>(queued)));
        out.Set("lastError", writer->lastError.empty() ? env.Null() : Napi::String::New(env, writer->lastError));
        return out;
    }

    // matched(handle) → the readers a writer matches, or the writers a reader matches, now.
    Napi::Value Matched(const Napi::CallbackInfo & info) {
        Napi::Env env = info.Env();
        CheckOpen(env);
        const dds_entity_t e = info[0].As<Napi::Number>().Int32Value();
        dds_return_t rc;
        uint32_t count = 0;
        if (writers_.count(e)) {
            dds_publication_matched_status_t s;
            rc = dds_get_publication_matched_status(e, &s);
            count = s.current_count;
        } else {
            dds_subscription_matched_status_t s;
            rc = dds_get_subscription_matched_status(e, &s);
            count = s.current_count;
        }
        if (rc < 0) throw Napi::Error::New(env, ddsError("matched status", rc));
        return Napi::Number::New(env, count);
    }

    // take(reader, max) → Buffer[]: the serialized samples waiting, oldest first (invalid samples, such as a writer leaving, are skipped).
    Napi::Value Take(const Napi::CallbackInfo & info) {
        Napi::Env env = info.Env();
        CheckOpen(env);
        std::shared_ptr<ReaderState> r = ReaderOf(env, info[0]);
        const uint32_t max = info[1].As<Napi::Number>().Uint32Value();
        std::vector<ddsi_serdata *> taken;
        {
            std::lock_guard<std::mutex> lock(r->mu);
            while (taken.size() < max && !r->samples.empty()) {
                taken.push_back(r->samples.front());
                r->samples.pop_front();
            }
        }
        Napi::Array out = Napi::Array::New(env, taken.size());
        for (size_t i = 0; i < taken.size(); i++) {
            const uint32_t size = ddsi_serdata_size(taken[i]);
            Napi::Buffer<unsigned char> buf = Napi::Buffer<unsigned char>::New(env, size);
            ddsi_serdata_to_ser(taken[i], 0, size, buf.Data());
            out.Set(uint32_t(i), buf);
            ddsi_serdata_unref(taken[i]);
        }
        return out;
    }

    std::shared_ptr<ReaderState> ReaderOf(Napi::Env env, const Napi::Value & v) {
        auto it = readers_.find(v.As<Napi::Number>().Int32Value());
        if (it == readers_.end()) throw Napi::Error::New(env, "dds: no such reader");
        return it->second;
    }

    // lost(reader) → { lost, rejected, overwritten }: samples DDS lost or refused, and those a newer one pushed out of the queue.
    Napi::Value Lost(const Napi::CallbackInfo & info) {
        Napi::Env env = info.Env();
        CheckOpen(env);
        const dds_entity_t reader = info[0].As<Napi::Number>().Int32Value();
        dds_sample_lost_status_t lost;
        dds_sample_rejected_status_t rejected;
        dds_return_t rc = dds_get_sample_lost_status(reader, &lost);
        if (rc >= 0) rc = dds_get_sample_rejected_status(reader, &rejected);
        if (rc < 0) throw Napi::Error::New(env, ddsError("sample lost status", rc));
        Napi::Object out = Napi::Object::New(env);
        out.Set("lost", Napi::Number::New(env, lost.total_count));
        out.Set("rejected", Napi::Number::New(env, rejected.total_count));
        std::shared_ptr<ReaderState> r = ReaderOf(env, info[0]);
        std::lock_guard<std::mutex> lock(r->mu);
        out.Set("overwritten", Napi::Number::New(env, double(r->overwritten)));
        return out;
    }

    // drain(timeoutMs) → Promise<boolean>: true when the queue emptied and every reliable reader acknowledged in time.
    class DrainWorker : public Napi::AsyncWorker {
    public:
        DrainWorker(Napi::Env env, Participant * p, int64_t timeoutMs)
            : Napi::AsyncWorker(env), p_(p), self_(Napi::Persistent(p->Value())), timeoutMs_(timeoutMs),
              deferred_(Napi::Promise::Deferred::New(env)) {}
        Napi::Promise Promise() { return deferred_.Promise(); }
        void Execute() override {
            const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs_);
            std::vector<dds_entity_t> writers;
            {
                std::unique_lock<std::mutex> lock(p_->mu_);
                ok_ = p_->idle_.wait_until(lock, deadline, [this] { return p_->queue_.empty() && !p_->busy_; });
                for (auto & [w, _] : p_->writers_) writers.push_back(w);
            }
            for (dds_entity_t w : writers) {
                const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - std::chrono::steady_clock::now()).count();
                if (dds_wait_for_acks(w, left > 0 ? left : 0) < 0) ok_ = false;
            }
        }
        void OnOK() override { deferred_.Resolve(Napi::Boolean::New(Env(), ok_)); }
        void OnError(const Napi::Error & e) override { deferred_.Reject(e.Value()); }

    private:
        Participant * p_;
        Napi::ObjectReference self_;  // keeps the participant alive while the worker runs
        int64_t timeoutMs_;
        bool ok_ = false;
        Napi::Promise::Deferred deferred_;
    };

    Napi::Value Drain(const Napi::CallbackInfo & info) {
        Napi::Env env = info.Env();
        CheckOpen(env);
        auto * worker = new DrainWorker(env, this, info[0].As<Napi::Number>().Int64Value());
        Napi::Promise promise = worker->Promise();
        worker->Queue();
        return promise;
    }

    Napi::Value Close(const Napi::CallbackInfo & info) {
        Shutdown();
        return info.Env().Undefined();
    }
};

Napi::Object Init(Napi::Env env, Napi::Object exports) {
    exports.Set("Participant", Participant::Define(env));
    return exports;
}

}  // namespace

NODE_API_MODULE(percept_dds, Init)
