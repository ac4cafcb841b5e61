# Sourced by the H200 lease scripts (h200_one_engine.sh, h200_batch.sh) with chunks, draft_weights and out
# set: the carried gguf wheel on PYTHONPATH, the GGUFs cut back out of the carried chunk stream (target
# first, by its pinned size), SHA-256 of everything into $out/sha256.txt, the shipped draft's weights in place.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /root/cache/gguf "$out"
cat "$chunks"/c* > /root/all.bin
head -c 1117320768 /root/all.bin > /root/cache/gguf/qwen2.5-coder-1.5b-instruct.gguf
tail -c +1117320769 /root/all.bin > /root/cache/gguf/qwen2.5-coder-0.5b-instruct.gguf
rm /root/all.bin
sha256sum /root/cache/gguf/*.gguf "$draft_weights" > "$out/sha256.txt"
cmp -s "$draft_weights" drafts/*/model.safetensors || cp "$draft_weights" drafts/*/model.safetensors
