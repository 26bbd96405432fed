"""A robot stack's loop on percept's actions: act on fresh ones, notice losses, stop at the run's end.

    /usr/bin/python3 client/python/example.py [tcp://127.0.0.1:5556]
"""

import sys

from percept_client import Subscriber

endpoint = sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:5556"
with Subscriber(endpoint, topics=("actions", "events")) as sub:
    for msg in sub:
        if msg.lost:
            print("lost %d %s message(s) before seq %d" % (msg.lost, msg.topic, msg.header["seq"]))
        if not msg.valid:
            print("invalid %s message: %s" % (msg.topic, msg.error))
        elif msg.topic == "actions":
            if msg.stale:
                print("frame %d: stale action ignored (%.0f ms old)" % (msg.header["frame_id"], msg.age_ms))
            else:
                print("frame %d: %s" % (msg.header["frame_id"], msg.body))
        elif msg.body.get("type") == "end":
            summary = msg.body["summary"]
            print("run ended: %d frames in, %d out, %d dropped" % (summary["frames"]["in"], summary["frames"]["out"], summary["frames"]["dropped"]))
            break
        else:
            print("event:", msg.body["type"], msg.body.get("reason", ""))
