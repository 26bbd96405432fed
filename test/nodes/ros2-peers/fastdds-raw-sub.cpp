// A Fast DDS (eProsima, Debian's libfastrtps-dev) participant that subscribes to ROS 2 topics by DDS topic and type name,
// with a type that keeps each sample's serialized bytes: the test decodes them. Loopback only, unicast discovery.
// Prints "matched TOPIC" once a writer matches, then "TOPIC HEX" per sample; exits after COUNT samples of each topic
// (a COUNT of 0: reads until killed).
//   fastdds-raw-sub DOMAIN DDS_TOPIC:DDS_TYPE:COUNT...
#include <fastdds/dds/domain/DomainParticipant.hpp>
#include <fastdds/dds/domain/DomainParticipantFactory.hpp>
#include <fastdds/dds/topic/Topic.hpp>
#include <fastdds/dds/subscriber/DataReader.hpp>
#include <fastdds/dds/subscriber/DataReaderListener.hpp>
#include <fastdds/dds/subscriber/SampleInfo.hpp>
#include <fastdds/dds/subscriber/Subscriber.hpp>
#include <fastdds/dds/topic/TopicDataType.hpp>
#include <fastdds/rtps/transport/UDPv4TransportDescriptor.h>
#include <fastrtps/utils/IPLocator.h>

#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

using namespace eprosima::fastdds::dds;
using eprosima::fastrtps::rtps::IPLocator;
using eprosima::fastrtps::rtps::Locator_t;
using eprosima::fastrtps::rtps::SerializedPayload_t;
using eprosima::fastrtps::rtps::InstanceHandle_t;

using Bytes = std::vector<unsigned char>;

// A sample is its serialized payload as it came off the wire, encapsulation header included.
class RawType : public TopicDataType {
 public:
  explicit RawType(const std::string &name) {
    setName(name.c_str());
    m_typeSize = 1 << 20;
    m_isGetKeyDefined = false;
    auto_fill_type_object(false);
    auto_fill_type_information(false);
  }
  bool serialize(void *data, SerializedPayload_t *payload) override {
    auto *b = static_cast<Bytes *>(data);
    std::memcpy(payload->data, b->data(), b->size());
    payload->length = static_cast<uint32_t>(b->size());
    return true;
  }
  bool deserialize(SerializedPayload_t *payload, void *data) override {
    static_cast<Bytes *>(data)->assign(payload->data, payload->data + payload->length);
    return true;
  }
  std::function<uint32_t()> getSerializedSizeProvider(void *data) override {
    return [data] { return static_cast<uint32_t>(static_cast<Bytes *>(data)->size()); };
  }
  void *createData() override { return new Bytes(); }
  void deleteData(void *data) override { delete static_cast<Bytes *>(data); }
  bool getKey(void *, InstanceHandle_t *, bool) override { return false; }
};

std::mutex mu;
std::condition_variable cv;
int remaining = 0;

class Listener : public DataReaderListener {
 public:
  Listener(std::string topic, int count) : topic_(std::move(topic)), count_(count) {}
  void on_subscription_matched(DataReader *, const SubscriptionMatchedStatus &info) override {
    std::lock_guard<std::mutex> lock(mu);
    if (info.current_count > 0 && !matched_) {
      matched_ = true;
      std::printf("matched %s\n", topic_.c_str());
      std::fflush(stdout);
    }
  }
  void on_data_available(DataReader *reader) override {
    Bytes sample;
    SampleInfo info;
    while (reader->take_next_sample(&sample, &info) == ReturnCode_t::RETCODE_OK) {
      if (!info.valid_data) continue;
      std::lock_guard<std::mutex> lock(mu);
      std::string hex;
      char buf[3];
      for (unsigned char c : sample) {
        std::snprintf(buf, sizeof buf, "%02x", c);
        hex += buf;
      }
      std::printf("%s %s\n", topic_.c_str(), hex.c_str());
      std::fflush(stdout);
      if (got_++ < count_ && --remaining == 0) cv.notify_all();
    }
  }

 private:
  std::string topic_;
  int count_;
  int got_ = 0;
  bool matched_ = false;
};

int main(int argc, char **argv) {
  if (argc < 3) return 2;
  const int domain = std::atoi(argv[1]);
  DomainParticipantQos pqos = PARTICIPANT_QOS_DEFAULT;
  pqos.transport().use_builtin_transports = false;
  auto udp = std::make_shared<eprosima::fastdds::rtps::UDPv4TransportDescriptor>();
  udp->interfaceWhiteList.push_back("127.0.0.1");
  pqos.transport().user_transports.push_back(udp);
  Locator_t peer;
  IPLocator::setIPv4(peer, 127, 0, 0, 1);
  pqos.wire_protocol().builtin.initialPeersList.push_back(peer);
  DomainParticipant *pp = DomainParticipantFactory::get_instance()->create_participant(domain, pqos);
  if (!pp) return 1;
  Subscriber *sub = pp->create_subscriber(SUBSCRIBER_QOS_DEFAULT);
  std::vector<std::unique_ptr<Listener>> listeners;
  for (int i = 2; i < argc; i++) {
    std::string spec = argv[i];
    const auto a = spec.find(':'), b = spec.rfind(':');
    const std::string topic = spec.substr(0, a), type = spec.substr(a + 1, b - a - 1);
    const int count = std::atoi(spec.substr(b + 1).c_str());
    TypeSupport ts(new RawType(type));
    if (ts.register_type(pp) != ReturnCode_t::RETCODE_OK) return 1;
    Topic *tp = pp->create_topic(topic, type, TOPIC_QOS_DEFAULT);
    if (!tp) return 1;
    DataReaderQos rq = DATAREADER_QOS_DEFAULT;
    rq.reliability().kind = RELIABLE_RELIABILITY_QOS;
    rq.durability().kind = VOLATILE_DURABILITY_QOS;
    rq.history().kind = KEEP_ALL_HISTORY_QOS;
    {
      std::lock_guard<std::mutex> lock(mu);
      remaining += count > 0 ? count : (1 << 20);  // 0: read until killed
    }
    listeners.push_back(std::make_unique<Listener>(topic, count));
    if (!sub->create_datareader(tp, rq, listeners.back().get())) return 1;
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [] { return remaining <= 0; });
  lock.unlock();
  pp->delete_contained_entities();
  DomainParticipantFactory::get_instance()->delete_participant(pp);
  return 0;
}
