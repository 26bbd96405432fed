// A Cyclone DDS subscriber of std_msgs/msg/String, in plain C with an idlc-generated type: the samples are decoded by
// Cyclone's own CDR code. Prints "matched" once a writer matches, then each sample's data on a line; exits after COUNT.
//   cyclone-string-sub DOMAIN DDS_TOPIC COUNT      (Cyclone's config from CYCLONEDDS_URI)
#include <stdio.h>
#include <stdlib.h>
#include "dds/dds.h"
#include "std_msgs_string.h"

int main(int argc, char **argv) {
  if (argc != 4) return 2;
  const dds_domainid_t domain = (dds_domainid_t)atoi(argv[1]);
  const int count = atoi(argv[3]);
  const dds_entity_t pp = dds_create_participant(domain, NULL, NULL);
  if (pp < 0) { fprintf(stderr, "dds_create_participant: %s\n", dds_strretcode(pp)); return 1; }
  const dds_entity_t tp = dds_create_topic(pp, &std_msgs_msg_dds__String__desc, argv[2], NULL, NULL);
  if (tp < 0) { fprintf(stderr, "dds_create_topic: %s\n", dds_strretcode(tp)); return 1; }
  dds_qos_t *qos = dds_create_qos();
  dds_qset_reliability(qos, DDS_RELIABILITY_RELIABLE, DDS_SECS(10));
  dds_qset_history(qos, DDS_HISTORY_KEEP_ALL, 0);
  dds_data_representation_id_t reprs[] = {DDS_DATA_REPRESENTATION_XCDR1, DDS_DATA_REPRESENTATION_XCDR2};
  dds_qset_data_representation(qos, 2, reprs);
  const dds_entity_t rd = dds_create_reader(pp, tp, qos, NULL);
  dds_delete_qos(qos);
  if (rd < 0) { fprintf(stderr, "dds_create_reader: %s\n", dds_strretcode(rd)); return 1; }
  int matched = 0, got = 0;
  void *samples[16] = {0};
  dds_sample_info_t infos[16];
  while (got < count) {
    if (!matched) {
      dds_subscription_matched_status_t st;
      if (dds_get_subscription_matched_status(rd, &st) == 0 && st.current_count > 0) {
        matched = 1;
        printf("matched\n");
        fflush(stdout);
      }
    }
    const int n = dds_take(rd, samples, infos, 16, 16);
    if (n < 0) { fprintf(stderr, "dds_take: %s\n", dds_strretcode(n)); return 1; }
    for (int i = 0; i < n; i++) {
      if (!infos[i].valid_data) continue;
      const std_msgs_msg_dds__String_ *s = samples[i];
      printf("%s\n", s->data);
      got++;
    }
    if (n > 0) {
      dds_return_loan(rd, samples, n);
      fflush(stdout);
    } else {
      dds_sleepfor(DDS_MSECS(5));
    }
  }
  dds_delete(pp);
  return 0;
}
