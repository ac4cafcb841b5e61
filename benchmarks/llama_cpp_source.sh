#!/usr/bin/env bash
# Pack llama.cpp's source for the GPU machine, which has nvcc, cmake and ninja but no internet: the llama.cpp
# tree that llama-cpp-python vendors (a pinned release on PyPI, reachable from the CPU machine), without what a
# CUDA build of llama-bench / llama-speculative / llama-quantize never reads (models/ holds test vocabularies
# of ~75 MB, docs, the web UI, the server, mobile examples, tests, and every ggml backend but CPU and CUDA).
# benchmarks/llama_cpp_peer.py unpacks and builds it inside the benchmark (gpu_speed.py --phases llama_cpp).
#
# Usage: bash benchmarks/llama_cpp_source.sh [OUT_TARBALL]   (default .peers/llama.cpp.tar.gz, git-ignored)
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.3.36
out=${1:-.peers/llama.cpp.tar.gz}
mkdir -p "$(dirname "$out")" .peers/sdist
sdist=.peers/sdist/llama_cpp_python-$version.tar.gz
if [ ! -f "$sdist" ]; then
  python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d .peers/sdist \
    || { echo "error: pip download llama-cpp-python==$version failed: this step needs PyPI (run it on the CPU machine)" >&2; exit 2; }
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar xzf "$sdist" -C "$work" "llama_cpp_python-$version/vendor/llama.cpp"
src=$work/llama_cpp_python-$version/vendor/llama.cpp
# Top-level folders no CMake target of ours reads (src/models and tools/mtmd/models are sources: kept).
rm -rf "$src"/{models,docs,media,benches,tests,gguf-py,conversion,scripts,ci,app,skills,grammars,requirements}
rm -rf "$src"/tools/{ui,server} "$src"/examples/{llama.android,llama.swiftui,llama.vim,batched.swift,model-conversion}
rm -rf "$src"/examples/{sycl,simple-cmake-pkg,test-cmake,deprecation-warning}
for backend in blas cann et hexagon hip metal musa opencl openvino rpc sycl virtgpu vulkan webgpu zdnn zendnn; do
  rm -rf "$src/ggml/src/ggml-$backend"
done
find "$src" -maxdepth 1 -name '*.py' -delete
echo "llama-cpp-python==$version" > "$src/DFVG_SOURCE"
tar czf "$out" -C "$(dirname "$src")" llama.cpp
echo "$out: $(du -h "$out" | cut -f1), llama.cpp vendored by llama-cpp-python==$version"
