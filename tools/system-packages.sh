#!/usr/bin/env bash
# The Debian packages the tests use, in one list: .ci/run and `npm test` both call this.
# Installs what is missing where it can (root, or sudo); else names the command to run and fails.
#   clang-format        lint of native/src
#   ffmpeg              the ffmpeg source
#   python3-zmq         the Python subscriber, a non-JS peer
#   python3-jsonschema  the Python subscriber's schema check
#   chromium            the eval report's browser test
#   cyclonedds-dev      the DDS addon (native/dds) and the tests' C subscriber and publisher
#   cyclonedds-tools    idlc, the types of the tests' C subscriber and publisher (only recommended by cyclonedds-dev)
#   libfastrtps-dev     the tests' Fast DDS participant (RTPS interop with another implementation)
set -euo pipefail
missing=()
command -v clang-format >/dev/null || missing+=(clang-format)
command -v ffmpeg >/dev/null || missing+=(ffmpeg)
/usr/bin/python3 -c 'import zmq' 2>/dev/null || missing+=(python3-zmq)
/usr/bin/python3 -c 'import jsonschema' 2>/dev/null || missing+=(python3-jsonschema)
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -f /usr/include/dds/dds.h ] || missing+=(cyclonedds-dev)
command -v idlc >/dev/null || missing+=(cyclonedds-tools)
[ -f /usr/include/fastdds/dds/domain/DomainParticipantFactory.hpp ] || missing+=(libfastrtps-dev)
[ ${#missing[@]} -eq 0 ] && exit 0
install="apt-get install -y -qq --no-install-recommends ${missing[*]}"
if [ "$(id -u)" = 0 ]; then
  SUDO=
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  SUDO=sudo
else
  echo "percept: the tests need Debian packages: ${missing[*]}. Install them as root: apt-get update && $install" >&2
  exit 1
fi
echo "percept: installing the Debian packages the tests need: ${missing[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO $install
