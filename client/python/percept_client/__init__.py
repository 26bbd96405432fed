"""Subscribe to a running percept's action stream from Python (pyzmq; Debian: python3-zmq).

    from percept_client import Subscriber
    with Subscriber("tcp://127.0.0.1:5556", topics=("actions", "events")) as sub:
        for msg in sub:
            if msg.topic == "actions" and msg.valid and not msg.stale:
                drive(msg.body)
            if msg.body.get("type") == "end":      # the run's final summary, its last message
                break

Every message is [topic, header JSON, body JSON] (percept's docs/wire.md). Each is checked against
the same JSON Schemas percept publishes with (configs/wire/*.schema.json and the action schema)
when the jsonschema package is there (Debian: python3-jsonschema); `msg.valid` and
`msg.error` say how it went. `msg.lost` counts the messages of that topic and run that never arrived
(seq gaps); `msg.stale` is True when an action's deadline had passed on arrival (None on a virtual
clock, whose times are not wall times).

The schemas: installed (`pip install client/python`) or copied out of the repo, the package reads its
own copy in percept_client/schemas/, its package data (tools/build-client.mjs or the install puts it
there). Inside percept's repo it reads the repo's configs/, their source. SCHEMAS says which.
`python3 -m percept_client --help` prints what a running percept publishes.
"""

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field

import zmq

try:
    import jsonschema
except ImportError:  # validation is skipped, and said so in msg.error
    jsonschema = None

HERE = os.path.dirname(os.path.abspath(__file__))


def _schema_dir():
    """The folder holding wire/ and actions/: in percept's repo (this package at client/python/percept_client)
    the repo's configs/, else the package's own copy. None when neither is there."""
    repo = os.path.normpath(os.path.join(HERE, "..", "..", "..", "configs"))
    in_repo = os.path.isfile(os.path.join(HERE, "..", "..", "index.ts"))
    for candidate in ((repo,) if in_repo else ()) + (os.path.join(HERE, "schemas"),):
        if os.path.isfile(os.path.join(candidate, "wire", "header.schema.json")):
            return candidate
    return None


#: Where the wire and action schemas are read from (wire/, actions/), or None when they are missing.
SCHEMAS = _schema_dir()


@dataclass
class Message:
    topic: str
    header: dict
    body: object
    lost: int = 0
    valid: bool = True
    error: str = ""
    stale: object = None  # True / False, or None on a virtual clock and for non-actions
    age_ms: object = None


@dataclass
class TopicCounts:
    received: int = 0
    lost: int = 0
    invalid: int = 0
    stale: int = 0


def _load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _validator(document, definition=None):
    """A validator for `document`, or for one of its definitions (refs stay inside the document)."""
    if jsonschema is None:
        return None
    schema = {"$ref": "#/definitions/" + definition, "definitions": document["definitions"]} if definition else document
    return jsonschema.Draft7Validator(schema)


class Subscriber:
    def __init__(self, connect="tcp://127.0.0.1:5556", topics=("actions",), action_schema=None,
                 server_key=None, actions_topic="actions", context=None):
        if SCHEMAS is None:
            raise FileNotFoundError("percept_client: no wire schemas in %s: install the package (pip install client/python) "
                                    "or run `node tools/build-client.mjs` in percept's repo before copying it" % os.path.join(HERE, "schemas"))
        header = _load(os.path.join(SCHEMAS, "wire", "header.schema.json"))
        messages = _load(os.path.join(SCHEMAS, "wire", "messages.schema.json"))
        action = _load(action_schema or os.path.join(SCHEMAS, "actions", "robot-action.schema.json"))
        self.action_schema_id = action["$id"]
        self._validators = {
            "action_header": _validator(header, "ActionHeader"),
            "message_header": _validator(header, "MessageHeader"),
            "event": _validator(messages, "Event"),
            "telemetry": _validator(messages, "Telemetry"),
            "action": _validator(action),
        }
        self.actions_topic = actions_topic
        self.counts = {}
        self._next = {}
        self._context = context or zmq.Context.instance()
        self.socket = self._context.socket(zmq.SUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.RCVHWM, 10000)
        if server_key:  # CURVE: the publisher's public key; our own pair is made per connection
            public, secret = zmq.curve_keypair()
            self.socket.curve_serverkey = server_key.encode() if isinstance(server_key, str) else server_key
            self.socket.curve_publickey = public
            self.socket.curve_secretkey = secret
        self.socket.connect(connect)
        for topic in topics:
            self.socket.setsockopt(zmq.SUBSCRIBE, topic.encode())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self.socket.close(0)

    def __iter__(self):
        while True:
            yield self.recv()

    def recv(self, timeout_ms=None):
        """The next message; raises zmq.Again after timeout_ms without one."""
        if timeout_ms is not None and not self.socket.poll(timeout_ms):
            raise zmq.Again()
        frames = self.socket.recv_multipart()
        return self._decode(frames)

    def _check(self, name, instance):
        validator = self._validators[name]
        if validator is None:
            return "not validated: the jsonschema package is not installed"
        errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.path))
        if not errors:
            return ""
        return "; ".join("%s: %s" % ("/" + "/".join(map(str, e.path)), e.message) for e in errors[:3])

    def _decode(self, frames):
        topic = frames[0].decode("utf-8", "replace") if frames else ""
        counts = self.counts.setdefault(topic, TopicCounts())
        if len(frames) != 3:
            counts.invalid += 1
            return Message(topic, {}, None, valid=False, error="expected [topic, header, body], got %d frames" % len(frames))
        try:
            header = json.loads(frames[1])
            body = json.loads(frames[2])
        except ValueError as err:
            counts.invalid += 1
            return Message(topic, {}, None, valid=False, error="not JSON: %s" % err)
        is_action = topic == self.actions_topic
        error = self._check("action_header" if is_action else "message_header", header)
        msg = Message(topic, header, body)
        if error and not error.startswith("not validated"):
            msg.valid, msg.error = False, "header: " + error
            counts.invalid += 1
            return msg
        expected = self._next.get(topic)
        if expected and expected[0] == header.get("run_id") and header["seq"] > expected[1]:
            msg.lost = header["seq"] - expected[1]
        self._next[topic] = (header.get("run_id"), header["seq"] + 1)
        counts.received += 1
        counts.lost += msg.lost
        if is_action:
            if header["schema_id"] != self.action_schema_id:
                error = "schema_id %s is not the action schema's $id %s" % (header["schema_id"], self.action_schema_id)
            else:
                error = self._check("action", body)
            if header["clock"] == "real":
                now = time.time() * 1000
                msg.stale = now > header["valid_until_wall_ms"]
                msg.age_ms = now - header["capture_wall_ms"]
                counts.stale += 1 if msg.stale else 0
        else:
            error = self._check("telemetry" if header["schema_id"].endswith("/Telemetry") else "event", body)
        if error and not error.startswith("not validated"):
            msg.valid, msg.error = False, error
            counts.invalid += 1
        elif error:
            msg.error = error
        return msg


def main(argv=None):
    parser = argparse.ArgumentParser(description="Print what a running percept publishes, one JSON line per message.")
    parser.add_argument("--connect", default="tcp://127.0.0.1:5556")
    parser.add_argument("--topic", action="append", help="actions, events, telemetry (repeatable; default actions)")
    parser.add_argument("--schema", help="the action schema (default: robot-action.schema.json, under SCHEMAS)")
    parser.add_argument("--server-key", help="the publisher's CURVE public key (Z85), when it encrypts")
    parser.add_argument("--until-end", action="store_true", help="exit after the run's end event (subscribe to events)")
    parser.add_argument("--timeout", type=float, default=0, help="give up after this many seconds without a message")
    args = parser.parse_args(argv)
    topics = args.topic or ["actions"]
    with Subscriber(args.connect, topics=topics, action_schema=args.schema, server_key=args.server_key) as sub:
        print(json.dumps({"ready": True}), flush=True)
        while True:
            try:
                msg = sub.recv(timeout_ms=int(args.timeout * 1000) if args.timeout else None)
            except zmq.Again:
                print(json.dumps({"error": "no message for %s s" % args.timeout}), flush=True)
                return 2
            print(json.dumps({"topic": msg.topic, "seq": msg.header.get("seq"), "lost": msg.lost, "valid": msg.valid,
                              "error": msg.error, "stale": msg.stale, "header": msg.header, "body": msg.body}), flush=True)
            if args.until_end and isinstance(msg.body, dict) and msg.body.get("type") == "end":
                counts = {t: vars(c) for t, c in sub.counts.items()}
                print(json.dumps({"counts": counts}), flush=True)
                return 0
