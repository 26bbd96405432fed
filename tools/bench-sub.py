"""The pyzmq subscriber of `percept bench publish --subscriber pyzmq`: a non-JS peer that receives as
fast as pyzmq can, so that "delivered" measures the publisher rather than a JS subscriber.

    bench-sub.py --connect E [--connect E2] --topic T [--topic T2] --reply R --end-topic T

Protocol (stdout, one JSON line each; stdin, one line):
  {"ready": true, "pyzmq": ..., "libzmq": ...}   once connected and subscribed;
  stdin "clock" -> {"clock_ns": time.monotonic_ns()}   the bench brackets it with process.hrtime to
      check that both read CLOCK_MONOTONIC (receive times below are compared with its send times);
  {"header": "..."}                              the first header of the first --topic;
  {"received": n, "base_ns": "..", "first_ns": "..", "last_ns": "..", "seqs": [...], "topics": [...],
   "received_ns": [...]}   at the end, once a message of --end-topic arrives: per message its seq
      (parsed from the header), --topic index and monotonic receive time (minus base_ns).
After each drain (a blocking receive, then NOBLOCK receives until none is left) it PUSHes
"<topic index> <last seq>" for each topic that got messages to --reply: the bench paces its sends on
these; they cost one send per drain, not per message.
"""

import argparse
import json
import sys
import time
from array import array

import zmq

SEQ = b'"seq":'


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--connect", action="append", required=True)
    parser.add_argument("--topic", action="append", required=True)
    parser.add_argument("--reply", required=True)
    parser.add_argument("--end-topic", required=True)
    parser.add_argument("--hwm", type=int, default=100_000)
    args = parser.parse_args()

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, args.hwm)
    sub.setsockopt(zmq.LINGER, 0)
    for endpoint in args.connect:
        sub.connect(endpoint)
    topics = [t.encode() for t in args.topic]
    end_topic = args.end_topic.encode()
    for t in topics + [end_topic]:
        sub.setsockopt(zmq.SUBSCRIBE, t)
    reply = ctx.socket(zmq.PUSH)
    reply.setsockopt(zmq.LINGER, 0)
    reply.connect(args.reply)

    def say(obj: dict) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    say({"ready": True, "pyzmq": zmq.__version__, "libzmq": zmq.zmq_version()})
    if sys.stdin.readline().strip() != "clock":
        raise SystemExit("bench-sub: expected 'clock' on stdin")
    say({"clock_ns": str(time.monotonic_ns())})

    seqs = array("q")
    received_ns = array("q")
    topic_of = bytearray()
    index = {t: i for i, t in enumerate(topics)}
    header_sent = False
    monotonic_ns = time.monotonic_ns
    recv = sub.recv_multipart
    while True:
        frames = recv()
        last = {}
        while True:
            now = monotonic_ns()
            topic = frames[0]
            if topic == end_topic:
                reply.close()
                sub.close()
                ctx.term()
                # Times past 2**53 ns (104 days of uptime) are not exact as JSON numbers: a
                # decimal string base and offsets from it.
                base = received_ns[0] if received_ns else 0
                say({
                    "received": len(seqs),
                    "base_ns": str(base),
                    "first_ns": str(base),
                    "last_ns": str(received_ns[-1] if received_ns else 0),
                    "seqs": seqs.tolist(),
                    "topics": list(topic_of),
                    "received_ns": [t - base for t in received_ns],
                })
                return
            header = frames[1]
            at = header.find(SEQ) + len(SEQ)
            end = at
            while 48 <= header[end] <= 57:
                end += 1
            seq = int(header[at:end])
            i = index[topic]
            seqs.append(seq)
            received_ns.append(now)
            topic_of.append(i)
            last[i] = seq
            if not header_sent and i == 0:
                header_sent = True
                say({"header": header.decode()})
            try:
                frames = recv(zmq.NOBLOCK)
            except zmq.Again:
                break
        for i, seq in last.items():
            reply.send(b"%d %d" % (i, seq))


if __name__ == "__main__":
    main()
