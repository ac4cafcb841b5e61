# Sourced first by a lease script (h200_drafts.sh, h200_block_head.sh, h200_kernels.sh) with chunks and out set, and
# the folder of its repository copy as $1: refuses the device tool's $OUT (emptied at every call), copies the
# repository there and enters it (the drafts unpack into the copy), notes the GPU in $out/gpu.txt, then, where
# $chunks is not empty, unpacks the weights (h200_weights.sh: GGUFs to /root/cache/gguf, the shipped drafts into
# drafts/). A job on random weights (h200_kernels.sh) sets chunks empty and carries none.
case $out in /root/out | /root/out/*) echo "error: $out is the device tool's \$OUT, emptied at every call" >&2; exit 2;; esac
mkdir -p "$out"
rm -rf "$1" && cp -r "$(dirname "$0")/.." "$1" && cd "$1"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
if [ -n "$chunks" ]; then source benchmarks/h200_weights.sh; fi
