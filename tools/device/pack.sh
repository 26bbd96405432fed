#!/usr/bin/env bash
# Packs what the device needs beside the tracked tree: node, build/llama.cpp (reduced), node_modules (reduced).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .carry/device
[ -f .carry/device/node.xz ] || xz -T2 -9 -c "$(command -v node)" > .carry/device/node.xz
# Nsight Compute's nsys importer on the GPU host lacks libdw (setup.sh's gaps): this machine's, with its libelf.
mkdir -p .carry/device/lib && cp -L /usr/lib/x86_64-linux-gnu/libdw.so.1 /usr/lib/x86_64-linux-gnu/libelf.so.1 .carry/device/lib/
S=/tmp/percept-pack && rm -rf $S && mkdir -p $S/build
tar -C build -cf - --anchored --exclude=llama.cpp/.git --exclude=llama.cpp/docs --exclude=llama.cpp/models --exclude=llama.cpp/tests --exclude=llama.cpp/pocs --exclude=llama.cpp/benches --exclude=llama.cpp/media --exclude=llama.cpp/.github --exclude=llama.cpp/.devops --exclude=llama.cpp/gguf-py --exclude=llama.cpp/ggml/src/ggml-cann --exclude=llama.cpp/ggml/src/ggml-et --exclude=llama.cpp/ggml/src/ggml-hexagon --exclude=llama.cpp/ggml/src/ggml-metal --exclude=llama.cpp/ggml/src/ggml-opencl --exclude=llama.cpp/ggml/src/ggml-openvino --exclude=llama.cpp/ggml/src/ggml-sycl --exclude=llama.cpp/ggml/src/ggml-virtgpu --exclude=llama.cpp/ggml/src/ggml-vulkan --exclude=llama.cpp/ggml/src/ggml-webgpu --exclude=llama.cpp/ggml/src/ggml-zdnn --exclude=llama.cpp/ggml/src/ggml-zendnn --exclude=llama.cpp/tools/ui/tests llama.cpp | tar -C $S/build -xf -
mkdir -p $S/build/llama.cpp/models $S/build/llama.cpp/tests $S/build/llama.cpp/pocs $S/build/llama.cpp/benches
cp build/llama.cpp/models/ggml-vocab-gemma-4.gguf $S/build/llama.cpp/models/
for d in tests pocs benches; do : > $S/build/llama.cpp/$d/CMakeLists.txt; done
# Source maps, type declarations and package tests are not needed to run.
tar -cf - --anchored '--exclude=*.map' '--exclude=*.d.ts' '--exclude=*.d.mts' '--exclude=node_modules/bintrees/test' '--exclude=node_modules/@node-llama-cpp' '--exclude=node_modules/typescript' '--exclude=node_modules/eslint' '--exclude=node_modules/@eslint' '--exclude=node_modules/@typescript-eslint' '--exclude=node_modules/prettier' '--exclude=node_modules/playwright-core' '--exclude=node_modules/dependency-cruiser' '--exclude=node_modules/onnxruntime-node/bin/napi-v6/darwin' '--exclude=node_modules/onnxruntime-node/bin/napi-v6/win32' '--exclude=node_modules/onnxruntime-node/bin/napi-v6/linux/arm64' '--exclude=node_modules/@img/*darwin*' '--exclude=node_modules/@img/*arm*' '--exclude=node_modules/@img/*musl*' '--exclude=node_modules/@img/*win32*' '--exclude=node_modules/node-llama-cpp/llama/gitRelease.bundle' '--exclude=node_modules/zeromq/build/darwin' '--exclude=node_modules/zeromq/build/win32' '--exclude=node_modules/zeromq/build/linux/arm64' '--exclude=node_modules/.cache' '--exclude=node_modules/onnxruntime-node' '--exclude=node_modules/@types' '--exclude=node_modules/@mlc-ai' '--exclude=node_modules/ipull' '--exclude=node_modules/simple-git' '--exclude=node_modules/zeromq/build/linux/x64/node/[0-9]*' '--exclude=node_modules/zeromq/build/linux/x64/node/musl*' '--exclude=node_modules/zeromq/build/linux/x64/node/glibc-[!1]*' '--exclude=node_modules/zeromq/build/linux/x64/node/glibc-1[!1]*' '--exclude=node_modules/zeromq/build/linux/x64/node/glibc-14*' '--exclude=node_modules/node-llama-cpp/dist' '--exclude=node_modules/node-llama-cpp/templates' '--exclude=node_modules/node-llama-cpp/bins' node_modules | tar -C $S -xf -
: > $S/node_modules/node-llama-cpp/llama/gitRelease.bundle
tar -C $S -cf - build node_modules | xz -T2 -9 > .carry/device/tree.tar.xz
ls -la .carry/device
