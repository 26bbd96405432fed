// A Cyclone DDS publisher of sensor_msgs/msg/CompressedImage in plain C, with an idlc-generated type: the frames a
// ROS 2 camera driver would publish. Waits for a reader, writes each file as one JPEG frame (the word BAD writes a
// message whose data is not a JPEG), waits for the reader's acknowledgements, prints "done" and exits.
//   cyclone-image-pub DOMAIN DDS_TOPIC FRAME_ID FILE|BAD...      (Cyclone's config from CYCLONEDDS_URI)
// Message k (from 0) is stamped sec 1700000000 + k, nanosec k.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dds/dds.h"
#include "sensor_msgs_compressed_image.h"

static unsigned char *readFile(const char *path, uint32_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  const long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *buf = malloc((size_t)n);
  if (fread(buf, 1, (size_t)n, f) != (size_t)n) { fclose(f); free(buf); return NULL; }
  fclose(f);
  *size = (uint32_t)n;
  return buf;
}

int main(int argc, char **argv) {
  if (argc < 5) return 2;
  const dds_entity_t pp = dds_create_participant((dds_domainid_t)atoi(argv[1]), NULL, NULL);
  if (pp < 0) { fprintf(stderr, "dds_create_participant: %s\n", dds_strretcode(pp)); return 1; }
  const dds_entity_t tp = dds_create_topic(pp, &sensor_msgs_msg_dds__CompressedImage__desc, argv[2], NULL, NULL);
  if (tp < 0) { fprintf(stderr, "dds_create_topic: %s\n", dds_strretcode(tp)); return 1; }
  dds_qos_t *qos = dds_create_qos();
  dds_qset_reliability(qos, DDS_RELIABILITY_RELIABLE, DDS_SECS(10));
  dds_qset_history(qos, DDS_HISTORY_KEEP_ALL, 0);
  dds_data_representation_id_t xcdr1 = DDS_DATA_REPRESENTATION_XCDR1;
  dds_qset_data_representation(qos, 1, &xcdr1);
  const dds_entity_t wr = dds_create_writer(pp, tp, qos, NULL);
  dds_delete_qos(qos);
  if (wr < 0) { fprintf(stderr, "dds_create_writer: %s\n", dds_strretcode(wr)); return 1; }
  for (;;) {
    dds_publication_matched_status_t st;
    if (dds_get_publication_matched_status(wr, &st) == 0 && st.current_count > 0) break;
    dds_sleepfor(DDS_MSECS(5));
  }
  printf("matched\n");
  fflush(stdout);
  static const unsigned char NOT_JPEG[] = "this is not a JPEG";
  // REPEAT first: send the frames again and again until killed (a best-effort reader may discover us late).
  const int repeat = strcmp(argv[4], "REPEAT") == 0;
  const int first = repeat ? 5 : 4;
  for (int i = first; i < argc || repeat; i++) {
    if (i == argc) {
      i = first;
      dds_sleepfor(DDS_MSECS(20));
    }
    const int k = i - first;
    sensor_msgs_msg_dds__CompressedImage_ msg;
    memset(&msg, 0, sizeof msg);
    msg.header.stamp.sec = 1700000000 + k;
    msg.header.stamp.nanosec = (uint32_t)k;
    msg.header.frame_id = argv[3];
    msg.format = "jpeg";
    uint32_t size = 0;
    unsigned char *data = NULL;
    if (strcmp(argv[i], "BAD") == 0) {
      size = sizeof NOT_JPEG - 1;
      data = malloc(size);
      memcpy(data, NOT_JPEG, size);
    } else if (!(data = readFile(argv[i], &size))) {
      fprintf(stderr, "cannot read %s\n", argv[i]);
      return 1;
    }
    msg.data._buffer = data;
    msg.data._length = msg.data._maximum = size;
    const dds_return_t rc = dds_write(wr, &msg);
    free(data);
    if (rc < 0) { fprintf(stderr, "dds_write: %s\n", dds_strretcode(rc)); return 1; }
  }
  const dds_return_t acked = dds_wait_for_acks(wr, DDS_INFINITY);
  if (acked < 0) { fprintf(stderr, "dds_wait_for_acks: %s\n", dds_strretcode(acked)); return 1; }
  printf("done\n");
  fflush(stdout);
  dds_delete(pp);
  return 0;
}
