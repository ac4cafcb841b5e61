# Sourced by h200_lease.sh (pair) with out set, in the repository with the models installed: `dfvg generate
# --device cuda` on the first held-out prompt, 128 tokens, with no draft, then the distilled draft and the feature
# head, each as a chain (k = 4) and a dynamic:15 tree; one JSON file per row in $out and one line each on stdout.
prompt=$(python3 -c "import json; print(json.loads(open('data/humaneval-heldout.jsonl').readline())['prompt'])")
distilled=models/qwen2.5-coder-1.5b-instruct-fpga-l4-d512-v32768
head=$distilled-fh
i=0
for flags in "--no-draft" "--draft $distilled --draft-length 4" "--draft $distilled --draft-length 4 --tree dynamic:15" \
    "--draft $head --draft-length 4" "--draft $head --draft-length 4 --tree dynamic:15"; do
  i=$((i + 1)) name=$i$(echo "$flags" | tr -c 'a-z0-9\n' '_' | tail -c 24)  # distinct per row (a first version
  # cut the names to a common 60-character prefix: the tree's JSON replaced the chain's)
  # shellcheck disable=SC2086
  python3 -m dfvg generate --target models/qwen2.5-coder-1.5b-instruct $flags --device cuda --raw-prompt \
    --prompt "$prompt" --max-new-tokens 128 --json > "$out/generate$name.json" || true
  python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['stats']; print(sys.argv[1], round(s['tokens_per_second'],1), 'tok/s, tau', round(s['mean_accepted_length'],2))" "$out/generate$name.json" || true
done
