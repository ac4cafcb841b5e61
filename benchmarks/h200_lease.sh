#!/usr/bin/env bash
# Issue 16's lease script, in two parts so the kernel measurements run while the GGUF chunks travel (until
# 2026-12-04 evening named h200_pdl.sh, which swept block sizes in its first part; the shipped table is used
# now). OUT must not be /root/out: that is the device tool's $OUT, emptied at every call.
#
#   bash benchmarks/h200_lease.sh kernels OUT        # first call (no model weights needed):
#     1. the gpu-marked kernel, graph and tree tests (bit-identical rows for T = 1..64 among them);
#     2. benchmarks/gpu_rows.py --profile: device time per kernel at T = 1 / 16 / 64 (contexts 512 and 32k), the
#        code variants side by side (gpu_modes.modes_of: K/V per token or shared, the attention grid, taller row
#        tiles, the GEMVs' weight prefetch and early trigger),
#        rows x contexts, invariance, cuBLAS; then benchmarks/draft_block.py: the distilled draft's block with the
#        shipped block sizes against linear_config's split-K (it has not run in its committed form yet), and
#        benchmarks/tree_step.py: the chain and tree steps' time and kernels side by side (random weights), and
#        gpu_decode.py --prefill-only: 64-row graph chunks against one causal pass, 150..8,192-token prompts, and
#        benchmarks/ncu_step.py: every kernel of the one-row step under Nsight Compute (hardware counters: they
#        read on the Firecracker H100s, not on the gVisor H200s, where it stops with ncu's message);
#   bash benchmarks/h200_lease.sh pair CHUNKS OUT     # after device_pack.py's chunks arrived (h200_weights.sh):
#     3. waits for part 1 (one GPU: timings must not overlap);
#     4. gpu_speed --phases dfvg --ks 4 with TREES' shapes (default "dynamic:15 4,2,1,1"): DFVG plain, chain and
#        trees with the 0.5B draft, the distilled draft and the feature head on the 20 held-out prompts; the head
#        again at k = 6 and DEEP_TREES (default dynamic:31; '' = skip) at depth 6 (phase file in OUT/deep);
#        --phases llama_cpp,report (llama.cpp built in the background by a separate command of the first call:
#        llama_cpp_peer.build into /root/w/peers): the report's best draft is any speculative row;
#     5. dfvg generate on one held-out prompt: plain, the distilled chain and the head, each chain and its
#        dynamic:15 tree;
#     6. --phases hf_eager,hf_static,hf_assist,report --ks 2,4,6,8: HF assisted at the k that is fastest on the
#        first 3 prompts, quoted on the other 17 (last: the part that may be cut short).
# The kernels part takes KERNEL_TESTS (test files beside test_gpu_fused.py and test_tree_device.py; default: the
# graph and kernel tests; empty: none), ROWS_FLAGS (extra gpu_rows.py flags, e.g. --modes-only, or
# "--sweep --sweep-rows 1,5,16") and BASELINE_DIR from the environment. BASELINE_DIR: an earlier revision's
# dfvg/ and benchmarks/ (made here with `git archive REV dfvg benchmarks | tar -x -C build/baseline`, carried);
# its shipped step runs first (gpu_rows.py --modes-only, one mode), in the same lease but its own process.
# Each part copies the repository first, so calls made while it runs may resync the working tree.
# Lessons of the leases that ran it: the machine is given back 30 s after a call returns even while these
# parts run in the background (their files go with it), so keep calling (e.g. `sleep 200; tail log`) and edit
# code only between such calls; `pkill -f PATTERN` also matches the call's own command line (write the pattern
# as `lease[.]sh pai[r]`, and restart in a separate call).
# Usage there: (setsid nohup bash benchmarks/h200_lease.sh kernels /root/kout > /root/kernels.log 2>&1 &)
#             (setsid nohup bash benchmarks/h200_lease.sh pair /root/p /root/pout > /root/pair.log 2>&1 &)
set -euo pipefail
part=$1
out=${*: -1}
case $out in /root/out | /root/out/*) echo "error: $out is the device tool's \$OUT, emptied at every call" >&2; exit 2;; esac
if [ "$part" = kernels ]; then
  trap 'echo KERNELS_FAILED' ERR
  rm -rf /root/repo_k && cp -r "$(dirname "$0")/.." /root/repo_k && cd /root/repo_k
  mkdir -p "$out"
  python3 -m pytest -q -m gpu tests/test_gpu_fused.py tests/test_tree_device.py tests/test_stream_ahead.py \
    ${KERNEL_TESTS-tests/test_gpu_graphs.py tests/test_gpu_kernels.py} > "$out/gpu_tests.log" 2>&1 || true
  tail -3 "$out/gpu_tests.log"
  if [ -n "${BASELINE_DIR:-}" ]; then
    (cd "$BASELINE_DIR" && python3 benchmarks/gpu_rows.py --modes-only \
      --modes "K/V shared, 4 split programs per SM (shipped)" --out "$out/baseline") 2>&1 | tee "$out/baseline.log"
  fi
  python3 benchmarks/gpu_rows.py --profile ${ROWS_FLAGS:-} --out "$out/rows" 2>&1 | tee "$out/rows.log"
  timeout 300 python3 benchmarks/draft_block.py --out "$out/draft_block" 2>&1 | tee "$out/draft_block.log" || true
  timeout 300 python3 benchmarks/tree_step.py --out "$out/tree_step" 2>&1 | tee "$out/tree_step.log" || true
  timeout 300 python3 benchmarks/gpu_decode.py --prefill-only --out "$out/prefill" 2>&1 | tee "$out/prefill.log" || true
  timeout 300 python3 benchmarks/ncu_step.py --rows 1 --kernels 0 --out "$out/ncu" 2>&1 | tee "$out/ncu.log" || true
  echo KERNELS_DONE
  exit 0
fi
chunks=$2
mkdir -p "$out"
for _ in $(seq 1 360); do  # give up after 30 min
  grep -q KERNELS_DONE /root/kernels.log 2>/dev/null && break
  grep -q KERNELS_FAILED /root/kernels.log 2>/dev/null && break
  sleep 5
done
rm -rf /root/repo && cp -r "$(dirname "$0")/.." /root/repo && cd /root/repo
# shellcheck source=benchmarks/h200_weights.sh
source benchmarks/h200_weights.sh
python3 scripts/download_models.py --cache-dir /root/cache 2>&1 | tail -2
common=(--gguf-dir /root/cache/gguf --work-dir /root/w --prompts-file .chunks/prompts.json --prompts 20
        --results /root/res --out "$out" --llama-src /root/peers.tar.gz)
head=models/qwen2.5-coder-1.5b-instruct-fpga-l4-d512-v32768-fh
python3 benchmarks/gpu_speed.py --phases dfvg --ks 4 --one-kernel --trees "${TREES-dynamic:15 4,2,1,1}" \
  --feature-head "$head" "${common[@]}" 2>&1 | tee "$out/gpu_speed_dfvg.log" || echo "the dfvg phase failed (its log says why)"
if [ -n "${DEEP_TREES-dynamic:31}" ]; then  # the head alone at depth 6 (issue 15's tree goal): its own plain row,
  # phase file and report (its rows' names would collide with the first run's in one report)
  python3 benchmarks/gpu_speed.py --phases dfvg,report --ks 6 --tree-depth 6 --one-kernel \
    --trees "${DEEP_TREES-dynamic:31}" --skip-draft --distilled-draft "" --feature-head "$head" "${common[@]}" \
    --results /root/res_deep --out "$out/deep" 2>&1 | tee "$out/gpu_speed_deep.log" || echo "the deep run failed"
fi
python3 benchmarks/gpu_speed.py --phases llama_cpp,report "${common[@]}" 2>&1 | tee "$out/gpu_speed_llama.log" \
  || echo "the llama.cpp phase failed (its log says why)"
# shellcheck source=benchmarks/h200_generate.sh
source benchmarks/h200_generate.sh
python3 benchmarks/gpu_speed.py --phases hf_eager,hf_static,hf_assist,report --ks 2,4,6,8 "${common[@]}" 2>&1 \
  | tee "$out/gpu_speed_hf.log"
echo DONE
