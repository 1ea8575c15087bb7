#!/usr/bin/env bash
# Fetch ONNX Runtime's C/C++ API headers on a Debian or Ubuntu machine whose own archive lacks
# them (Debian 12): Debian 13's libonnxruntime-dev, downloaded with a private apt configuration
# naming the trixie suite and unpacked with dpkg-deb, as a user, without installing anything.
#
#   llm_onnx/kernels/fetch_headers.sh [DEST]     (default: ~/.cache/llm-onnx/ort-headers)
#
# Prints the include folder to pass as ORT_INCLUDE_DIR (`python -m llm_onnx.kernels build` looks
# in DEST by default). Where the system has /usr/include/onnxruntime, nothing needs fetching.
set -euo pipefail
dest=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/llm-onnx/ort-headers}
suite=${LLM_ONNX_HEADERS_SUITE:-trixie}
mirror=${LLM_ONNX_HEADERS_MIRROR:-http://deb.debian.org/debian}

if [ -f "$dest/usr/include/onnxruntime/onnxruntime_c_api.h" ]; then
  echo "$dest/usr/include/onnxruntime"
  exit 0
fi
for tool in apt-get dpkg-deb; do
  command -v "$tool" >/dev/null || { echo "fetch_headers.sh: needs $tool (Debian/Ubuntu)" >&2; exit 1; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/llm-onnx-headers.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/etc/apt/apt.conf.d" "$work/etc/apt/preferences.d" "$work/etc/apt/sources.list.d" \
         "$work/lists/partial" "$work/archives/partial" "$work/debs"
: > "$work/status"
echo "deb $mirror $suite main" > "$work/etc/apt/sources.list"
# Everything apt reads or writes lives under $work; only the archive's signing keys are the
# system's (Debian 12's debian-archive-keyring has trixie's).
opts=(-o "Dir=$work" -o "Dir::State::Lists=$work/lists" -o "Dir::State::status=$work/status"
      -o "Dir::Cache::archives=$work/archives" -o "Dir::Etc::trusted=/etc/apt/trusted.gpg"
      -o "Dir::Etc::trustedparts=/etc/apt/trusted.gpg.d" -o "Debug::NoLocking=1"
      -o "APT::Architecture=$(dpkg --print-architecture)" -o "APT::Sandbox::User=$(id -un)")
apt-get "${opts[@]}" -qq update >&2
(cd "$work/debs" && apt-get "${opts[@]}" -qq download libonnxruntime-dev >&2)
# unpacked beside, then moved into place whole: a second copy of this script running at the
# same time (two test workers) finds either nothing or the finished folder
mkdir -p "$dest/usr/include"
dpkg-deb -x "$work"/debs/libonnxruntime-dev_*.deb "$work/unpacked"
test -f "$work/unpacked/usr/include/onnxruntime/onnxruntime_c_api.h"
mv -T "$work/unpacked/usr/include/onnxruntime" "$dest/usr/include/onnxruntime" 2>/dev/null ||
  test -f "$dest/usr/include/onnxruntime/onnxruntime_c_api.h"
echo "$dest/usr/include/onnxruntime"
