# Sourced by the lease scripts (h200_lease.sh pair, h200_one_engine.sh) with chunks and out set, in the repository
# copy: the carried gguf wheel on PYTHONPATH; the files packed by benchmarks/device_pack.py (the GGUFs as
# gguf/<name>, drafts as drafts/<folder>/<file>) unpacked from $chunks (chunks and manifest.json) and checked
# against the manifest's SHA-256 (listed in $out/sha256.txt); the GGUFs where download_models.py --cache-dir
# /root/cache looks, the drafts into this copy's drafts/ (they cannot travel inside the tree: it is over 64 MiB
# with them).
# Made here, e.g.: python benchmarks/device_pack.py pack --out .chunks/p \
#   ~/.cache/dfvg/gguf/qwen2.5-coder-1.5b-instruct.gguf:gguf/qwen2.5-coder-1.5b-instruct.gguf \
#   ~/.cache/dfvg/gguf/qwen2.5-coder-0.5b-instruct.gguf:gguf/qwen2.5-coder-0.5b-instruct.gguf \
#   drafts/qwen2.5-coder-1.5b-instruct-fpga-l4-d512-v32768:drafts/qwen2.5-coder-1.5b-instruct-fpga-l4-d512-v32768 \
#   drafts/qwen2.5-coder-1.5b-instruct-fpga-l4-d512-v32768-fh:drafts/qwen2.5-coder-1.5b-instruct-fpga-l4-d512-v32768-fh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /root/cache "$out"
python3 benchmarks/device_pack.py unpack --chunks "$chunks" --root /root/unpacked > "$out/sha256.txt"
cat "$out/sha256.txt"
if [ -d /root/unpacked/gguf ]; then mkdir -p /root/cache/gguf && mv -f /root/unpacked/gguf/* /root/cache/gguf/; fi
if [ -d /root/unpacked/drafts ]; then mkdir -p drafts && cp -r /root/unpacked/drafts/. drafts/; fi
