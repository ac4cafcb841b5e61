"""Quantizer for the FPGA draft datapath: a float `Transformer` -> integer weights, multipliers and tables.

What this module owns: activation calibration (run the float model, record per-channel |x| maxima), the
float-exact smoothing transform that moves activation outliers into the weights, weight quantization (int8
per output channel; int4 with uint8 group scales) and the choice of every requantization multiplier. What
it does not own: the artifact on disk (`artifact.py`), the arithmetic (`fixed_point.py`), the integer
forward pass (`integer_model.py`), or anything in `dfvg/model.py` (which never learns about FPGAs).

Number formats (real = q * scale, symmetric, scales from calibrated absmax):
- residual stream: int32 at ONE model-wide scale `residual_scale` (Qwen2's attention-sink token reaches
  |x| ~ 900 while other tokens stay below ~80, too wide for int16); every residual add is a plain add.
- matmul inputs, q/k/v, gate, up, SiLU output: int8 at one per-tensor scale per layer.
- weights: int8 with one scale per output row, or int4 [-8, 7] with uint8 group scales of `group_size`
  columns and a per-row scale; biases int32 at the accumulator's scale.
- logits: int32 at `logit_scale` (per-row multipliers fold the LM head's row scales), argmax lowest index.
Smoothing (SmoothQuant, alpha = 0.5): for each matmul input channel j, s_j = sqrt(max|x_j| / max|W_:,j|);
x_j / s_j is folded into the producer (an RMSNorm gamma, the v rows of wqkv, the up rows of w13) and
W_:,j * s_j into the consumer. In float this changes nothing; in int8 it stops a few outlier channels
from eating the whole per-tensor range.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import torch
from torch import Tensor

from dfvg.errors import UserError
from dfvg.fpga.datapath import fixed_point as fp
from dfvg.model import ModelConfig, Transformer

SMOOTH_ALPHA = 0.5
RESIDUAL_BITS = 20  # calibrated max |residual| -> 2**20: 11 bits of headroom below the int32 limit
LOGIT_BITS = 20
BUILTIN_CALIBRATION = "builtin-lcg"



# ------------------------------------------------------------------------------------ calibration
def builtin_calibration(vocab_size: int, num_sequences: int = 2, length: int = 64) -> list[list[int]]:
    """A fixed token sequence set (a 32-bit LCG), for models without a tokenizer or prompt set."""
    state, seqs = 12345, []
    for _ in range(num_sequences):
        seq = []
        for _ in range(length):
            state = (1103515245 * state + 12345) % (1 << 31)
            seq.append(state % vocab_size)
        seqs.append(seq)
    return seqs


def block_calibration(cfg: ModelConfig, sequences: list[list[int]]) -> list[list[int]]:
    """A block drafter's calibration feeds each sequence with the mask ids after it, as a drafting pass feeds
    them (dfvg.block_draft): the mask rows' activations then set the scales too. Other drafts: unchanged."""
    return [list(s) + cfg.mask_ids for s in sequences] if cfg.block_size else sequences


def _absmax_channels(x: Tensor) -> Tensor:
    """[..., C] -> [C] float32 max |x| over everything but the channel dim."""
    return x.detach().float().abs().reshape(-1, x.shape[-1]).amax(dim=0)


def _pair_norm_max(x: Tensor, heads: int, head_dim: int) -> Tensor:
    """Max over RoPE pairs (j, j + hd/2) of sqrt(x_j^2 + x_j+h^2): bounds |x| before and after rotation."""
    x = x.detach().float().reshape(-1, heads, 2, head_dim // 2)
    return x.pow(2).sum(dim=2).sqrt().max()


@torch.inference_mode()
def calibrate(model: Transformer, sequences: list[list[int]],
              feed: Callable[[], None] | None = None) -> dict[str, Tensor]:
    """Run the float model on `sequences` and return per-channel |activation| maxima by site name.
    `feed` (no arguments) runs the model instead: a feature head feeds its body fused inputs, not embeddings.

    Sites per layer i: attn_in [D], qkv_out [qkv], q_pair, k_pair (scalars), wo_in [H*hd], ffn_in [D],
    w13_out [2I], silu (scalar), w2_in [I]; model-wide: residual (scalar), head_in [D], logits (scalar).
    With qk-norm (Qwen3), qkv_out is q/k before their norms and q_pair/k_pair are taken after them: RoPE
    rotates the normed q and k.
    """
    cfg = model.config
    stats: dict[str, Tensor] = {}

    def record(name: str, value: Tensor) -> None:
        stats[name] = value if name not in stats else torch.maximum(stats[name], value)

    def on_qkv(i: int, x: Tensor, y: Tensor) -> None:
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        record(f"layers.{i}.attn_in", _absmax_channels(x))
        record(f"layers.{i}.qkv_out", _absmax_channels(y))
        if not cfg.qk_norm:
            on_rope_input(i, y[..., :q_size], y[..., q_size:q_size + kv_size])

    def on_rope_input(i: int, q: Tensor, k: Tensor) -> None:
        record(f"layers.{i}.q_pair", _pair_norm_max(q, cfg.num_heads, cfg.head_dim))
        record(f"layers.{i}.k_pair", _pair_norm_max(k, cfg.num_kv_heads, cfg.head_dim))

    def on_w13(i: int, x: Tensor, y: Tensor) -> None:
        record(f"layers.{i}.ffn_in", _absmax_channels(x))
        record(f"layers.{i}.w13_out", _absmax_channels(y))
        gate = y[..., : cfg.intermediate_size]
        record(f"layers.{i}.silu", torch.nn.functional.silu(gate.float()).abs().max())

    hooks, normed_q = [], {}
    for i, layer in enumerate(model.layers):
        att, ffn = layer.attention, layer.feed_forward
        hooks += [
            att.wqkv.register_forward_hook(lambda m, a, y, i=i: on_qkv(i, a[0], y)),
            att.wo.register_forward_hook(lambda m, a, y, i=i: record(f"layers.{i}.wo_in", _absmax_channels(a[0]))),
            ffn.w13.register_forward_hook(lambda m, a, y, i=i: on_w13(i, a[0], y)),
            ffn.w2.register_forward_hook(lambda m, a, y, i=i: record(f"layers.{i}.w2_in", _absmax_channels(a[0]))),
            layer.attention_norm.register_forward_hook(lambda m, a, y: record("residual", a[0].abs().max().float())),
            layer.ffn_norm.register_forward_hook(lambda m, a, y: record("residual", a[0].abs().max().float())),
        ]
        if cfg.qk_norm:  # q_norm runs right before k_norm: hold q's output until k's arrives
            hooks += [att.q_norm.register_forward_hook(lambda m, a, y: normed_q.update(q=y)),
                      att.k_norm.register_forward_hook(lambda m, a, y, i=i: on_rope_input(i, normed_q["q"], y))]
    hooks.append(model.norm.register_forward_hook(lambda m, a, y: record("residual", a[0].abs().max().float())))

    def on_head(x: Tensor, y: Tensor) -> None:  # a hook that returned a value would replace the output
        record("head_in", _absmax_channels(x))
        record("logits", y.abs().max().float())

    hooks.append(model.output.register_forward_hook(lambda m, a, y: on_head(a[0], y)))
    try:
        (feed or (lambda: feed_tokens(model, sequences)))()
    finally:
        for hook in hooks:
            hook.remove()
    return {name: value.cpu() for name, value in stats.items()}


def feed_tokens(model: Transformer, sequences: list[list[int]]) -> None:
    """Feed every calibration sequence through the float model."""
    device = model.tok_embeddings.weight.device
    model.setup_cache(1, max(len(s) for s in sequences))
    for seq in sequences:
        ids = torch.tensor([seq], device=device)
        model(ids, torch.arange(len(seq), device=device)[None])


# -------------------------------------------------------------------------------------- smoothing
def _smooth_factors(act_max: Tensor, weight: Tensor) -> Tensor:
    """s_j = max|x_j|^a / max|W_:,j|^(1-a) for weight [N, C] (columns = input channels), clamped."""
    w_max = weight.detach().float().abs().amax(dim=0).clamp(min=1e-5)
    s = act_max.clamp(min=1e-5).pow(SMOOTH_ALPHA) / w_max.pow(1 - SMOOTH_ALPHA)
    return s.clamp(1e-2, 1e2)


@torch.inference_mode()
def smooth(model: Transformer, stats: dict[str, Tensor]) -> None:
    """Apply the smoothing transform in place (float-exact: the model computes the same function)."""
    cfg = model.config
    q_size, kv_size, hd = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.head_dim
    group = cfg.num_heads // cfg.num_kv_heads
    for i, layer in enumerate(model.layers):
        att, ffn = layer.attention, layer.feed_forward
        for norm, lin, site in ((layer.attention_norm, att.wqkv, "attn_in"), (layer.ffn_norm, ffn.w13, "ffn_in")):
            s = _smooth_factors(stats[f"layers.{i}.{site}"], lin.weight).to(lin.weight)
            norm.weight.div_(s)
            lin.weight.mul_(s)
        # w2 input = silu(gate) * up: divide the up rows, multiply w2's columns.
        s = _smooth_factors(stats[f"layers.{i}.w2_in"], ffn.w2.weight).to(ffn.w2.weight)
        ffn.w13.weight[cfg.intermediate_size:].div_(s[:, None])
        ffn.w2.weight.mul_(s)
        # wo input = softmax(qk) v per head: one factor per (kv head, channel), shared by the heads of a group.
        wo_max = stats[f"layers.{i}.wo_in"].reshape(cfg.num_kv_heads, group, hd).amax(dim=1)
        wo_w = att.wo.weight.detach().float().abs().reshape(-1, cfg.num_kv_heads, group, hd).amax(dim=(0, 2))
        s_v = (wo_max.clamp(min=1e-5).pow(SMOOTH_ALPHA) / wo_w.clamp(min=1e-5).pow(1 - SMOOTH_ALPHA)).clamp(1e-2, 1e2)
        s_v = s_v.to(att.wo.weight)
        v_rows = slice(q_size + kv_size, q_size + 2 * kv_size)
        att.wqkv.weight[v_rows].div_(s_v.reshape(-1, 1))
        if att.wqkv.bias is not None:
            att.wqkv.bias[v_rows].div_(s_v.reshape(-1))
        att.wo.weight.mul_(s_v[:, None, :].expand(-1, group, -1).reshape(1, -1))


# ---------------------------------------------------------------------------------------- weights
def quantize_rows_int8(w: Tensor, rows_per_chunk: int = 8192) -> tuple[Tensor, Tensor]:
    """Float [N, K] -> (int8 [N, K], float64 row scales [N]) with scale = max|row| / 127.

    Chunks of rows keep the float64 temporaries small (a 152k-row LM head would need 2 GB at once)."""
    q, scales = [], []
    for chunk in w.detach().split(rows_per_chunk):
        chunk = chunk.to(torch.float64)
        scale = (chunk.abs().amax(dim=1) / 127).clamp(min=1e-12)
        q.append(torch.floor(chunk / scale[:, None] + 0.5).clamp(-127, 127).to(torch.int8))
        scales.append(scale)
    return torch.cat(q), torch.cat(scales)


def quantize_rows_int4(w: Tensor, group_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """Float [N, K] -> (int4 values int8 [N, K], uint8 group scales [N, K/G], float64 row scales [N]).

    W[n, k] ~= row[n] * gs[n, g(k)] * w4[n, k]; row = max|W[n]| / (7 * 255) so the largest group uses gs
    near 255, and each gs is rounded up (ceil) so no weight of its group clips below -8 or above 7.
    """
    n, k = w.shape
    if k % group_size or group_size % 2:
        raise UserError(f"int4 group size {group_size} must be even and divide every matrix width (got K={k}); "
                        "choose e.g. --fpga-group-size 32, 64 or 128")
    w = w.detach().to(torch.float64)
    groups = w.reshape(n, k // group_size, group_size)
    g_max = groups.abs().amax(dim=2)  # [N, g]
    row = (g_max.amax(dim=1) / (7 * 255)).clamp(min=1e-12)  # [N]
    gs = torch.ceil(g_max / (7 * row[:, None])).clamp(1, 255)
    w4 = torch.floor(groups / (row[:, None, None] * gs[..., None]) + 0.5).clamp(-8, 7)
    return w4.reshape(n, k).to(torch.int8), gs.to(torch.uint8), row


def _multipliers(scales: Tensor) -> tuple[Tensor, Tensor]:
    m, s = fp.quantize_multipliers(scales)
    return m.to(torch.int32), s.to(torch.int32)


def _bias_int32(bias: Tensor, acc_scale: Tensor, name: str) -> Tensor:
    q = torch.floor(bias.detach().to(torch.float64) / acc_scale + 0.5)
    if float(q.abs().max()) >= 2**31:
        raise UserError(f"{name}: bias does not fit int32 at the accumulator scale; recalibrate with more prompts")
    return q.to(torch.int32)


def quantize_linear(name: str, weight: Tensor, bias: Tensor | None, in_scale: float, out_scale: Tensor,
                    bits: int, group_size: int) -> dict[str, Tensor]:
    """One linear layer -> its artifact tensors; out_scale [N] is the real scale of each output row."""
    if bits == 8:
        wq, row = quantize_rows_int8(weight)
        out = {f"{name}.weight": wq}
    else:
        w4, gs, row = quantize_rows_int4(weight, group_size)
        out = {f"{name}.weight_packed": fp.int4_pack(w4), f"{name}.group_scales": gs}
    acc_scale = in_scale * row  # [N] real value of one accumulator unit
    out[f"{name}.multiplier"], out[f"{name}.shift"] = _multipliers(acc_scale / out_scale.to(torch.float64))
    if bias is not None:
        out[f"{name}.bias"] = _bias_int32(bias, acc_scale, name)
    return out


def _pair(m_s: tuple[int, int]) -> Tensor:
    return torch.tensor(m_s, dtype=torch.int32)


def _act_scale(x: Tensor | float) -> float:
    return max(float(x), 1e-8) / 127


# ------------------------------------------------------------------------------------ whole model
def _norm(name: str, gamma: Tensor, in_scale: float, out_scale: float, eps: float) -> dict[str, Tensor]:
    """RMSNorm constants: int16 gamma and int32 [multiplier, shift, eps_term at the residual scale]."""
    c = fp.rmsnorm_setup(gamma.detach().float(), in_scale, out_scale, eps)
    if c["eps_term"] >= 2**31:
        raise UserError(f"{name}: eps term {c['eps_term']} does not fit int32; the residual scale is too fine")
    params = torch.tensor([c["multiplier"], c["shift"], c["eps_term"]], dtype=torch.int32)
    return {f"{name}.gamma": c["gamma_q"].to(torch.int16), f"{name}.params": params}


def _layer_scales(cfg, stats: dict[str, Tensor], i: int) -> dict[str, float]:
    """Real per-tensor scales of every int8 site of layer i (calibrated absmax / 127)."""
    p, q_size, kv = f"layers.{i}.", cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    w13_out = stats[p + "w13_out"]
    qk_in = {}
    if cfg.qk_norm:  # q and k leave wqkv at their own scales, then their norms bring them to "q" and "k"
        qk_in = {"q_in": _act_scale(stats[p + "qkv_out"][:q_size].max()),
                 "k_in": _act_scale(stats[p + "qkv_out"][q_size:q_size + kv].max())}
    return qk_in | {
        "attn_in": _act_scale(stats[p + "attn_in"].max()), "q": _act_scale(stats[p + "q_pair"]),
        "k": _act_scale(stats[p + "k_pair"]), "v": _act_scale(stats[p + "qkv_out"][q_size + kv:].max()),
        "wo_in": _act_scale(stats[p + "wo_in"].max()), "ffn_in": _act_scale(stats[p + "ffn_in"].max()),
        "gate": _act_scale(w13_out[: cfg.intermediate_size].max()),
        "up": _act_scale(w13_out[cfg.intermediate_size:].max()), "silu": _act_scale(stats[p + "silu"]),
        "w2_in": _act_scale(stats[p + "w2_in"].max()),
    }


def _quantize_layer(layer, cfg, sc: dict[str, float], res: float, i: int, bits: int, gs: int) -> dict[str, Tensor]:
    p, att, ffn = f"layers.{i}.", layer.attention, layer.feed_forward
    q_size, kv, inter = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
    q_out, k_out = sc.get("q_in", sc["q"]), sc.get("k_in", sc["k"])
    qkv_out = torch.cat([torch.full((q_size,), q_out), torch.full((kv,), k_out), torch.full((kv,), sc["v"])])
    w13_out = torch.cat([torch.full((inter,), sc["gate"]), torch.full((inter,), sc["up"])])
    to_res = lambda n: torch.full((n,), res, dtype=torch.float64)
    out = _norm(p + "attention_norm", layer.attention_norm.weight, res, sc["attn_in"], cfg.rms_norm_eps)
    out |= _norm(p + "ffn_norm", layer.ffn_norm.weight, res, sc["ffn_in"], cfg.rms_norm_eps)
    if cfg.qk_norm:  # per-head RMSNorm of q and k over head_dim: the same fixed-point norm, int8 in
        out |= _norm(p + "attention.q_norm", att.q_norm.weight, q_out, sc["q"], cfg.rms_norm_eps)
        out |= _norm(p + "attention.k_norm", att.k_norm.weight, k_out, sc["k"], cfg.rms_norm_eps)
    out |= quantize_linear(p + "attention.wqkv", att.wqkv.weight, att.wqkv.bias, sc["attn_in"], qkv_out, bits, gs)
    out |= quantize_linear(p + "attention.wo", att.wo.weight, att.wo.bias, sc["wo_in"], to_res(cfg.hidden_size),
                           bits, gs)
    out |= quantize_linear(p + "feed_forward.w13", ffn.w13.weight, None, sc["ffn_in"], w13_out, bits, gs)
    out |= quantize_linear(p + "feed_forward.w2", ffn.w2.weight, None, sc["w2_in"], to_res(cfg.hidden_size),
                           bits, gs)
    out[p + "attention.softmax"] = _pair(fp.softmax_setup(sc["q"] * sc["k"] / math.sqrt(cfg.head_dim)))
    out[p + "attention.pv"] = _pair(fp.quantize_multiplier(sc["v"] / fp.Q15_ONE / sc["wo_in"]))
    out[p + "feed_forward.silu_table"] = fp.silu_table(sc["gate"], sc["silu"])
    out[p + "feed_forward.hidden"] = _pair(fp.quantize_multiplier(sc["silu"] * sc["up"] / sc["w2_in"]))
    return out


def _quantize_ends(model: Transformer, stats: dict[str, Tensor], res: float) -> tuple[dict[str, Tensor], dict]:
    """Embedding rows (int8 -> residual scale), the final norm and the int8 LM head (-> int32 logits)."""
    cfg = model.config
    emb_q, emb_row = quantize_rows_int8(model.tok_embeddings.weight)
    out = {"tok_embeddings.weight": emb_q}
    out["tok_embeddings.multiplier"], out["tok_embeddings.shift"] = _multipliers(emb_row / res)
    head_in = _act_scale(stats["head_in"].max())
    logit_scale = max(float(stats["logits"]), 1e-8) / 2**LOGIT_BITS
    out |= _norm("norm", model.norm.weight, res, head_in, cfg.rms_norm_eps)
    rows = model.output.weight.shape[0]  # head_vocab_size rows for a distilled head-vocabulary draft
    out |= quantize_linear("output", model.output.weight, None, head_in,
                           torch.full((rows,), logit_scale, dtype=torch.float64), 8, 0)
    if cfg.head_vocab_size:
        out["output.token_ids"] = model.head_token_ids.to(torch.int32)
    if cfg.embed_rows:  # the embedding has the head's rows: token id -> row, looked up before the table
        out["tok_embeddings.token_rows"] = model.token_rows.to(torch.int32)
    if cfg.block_size:  # a block drafter's mask vectors: per-row int8 at the residual scale, as embedding rows are
        mask_q, mask_row = quantize_rows_int8(model.block_masks.detach())
        out["block_masks.weight"] = mask_q
        out["block_masks.multiplier"], out["block_masks.shift"] = _multipliers(mask_row / res)
    return out, {"head_in": head_in, "logits": logit_scale}


def quantize_model(model: Transformer, bits: int = 8, group_size: int = 128,
                   calibration: list[list[int]] | None = None, inplace: bool = False) -> tuple[dict, dict]:
    """Float model -> (artifact tensors by name, metadata with every real scale).

    The model is calibrated, smoothed (on a copy unless `inplace`), calibrated again, then quantized.
    Layers use `bits` (8 or 4); the embedding and LM head stay int8 (they are the most sensitive matrices
    and the LM head is read once per token either way).
    """
    cfg = model.config
    if bits not in (4, 8):
        raise UserError(f"FPGA weight bits must be 8 or 4, got {bits}")
    sequences = block_calibration(cfg, calibration or builtin_calibration(cfg.vocab_size))
    if not inplace:
        model = copy.deepcopy(model)
    smooth(model, calibrate(model, sequences))
    tensors, meta = quantize_calibrated(model, calibrate(model, sequences), bits, group_size)
    return tensors, meta | {"calibration_tokens": sum(len(s) for s in sequences)}


def quantize_calibrated(model: Transformer, stats: dict[str, Tensor], bits: int, group_size: int) -> tuple[dict, dict]:
    """A smoothed model and its calibration -> (artifact tensors, metadata); see `quantize_model`."""
    cfg = model.config
    res = max(float(stats["residual"]), 1e-6) / 2**RESIDUAL_BITS
    tensors, end_scales = _quantize_ends(model, stats, res)
    layer_scales = []
    for i, layer in enumerate(model.layers):
        sc = _layer_scales(cfg, stats, i)
        tensors |= _quantize_layer(layer, cfg, sc, res, i, bits, group_size)
        layer_scales.append(sc)
    meta = {"bits": bits, "group_size": group_size if bits == 4 else None, "residual_scale": res,
            "scales": {"layers": layer_scales, **end_scales}, "smoothing_alpha": SMOOTH_ALPHA}
    return tensors, meta

