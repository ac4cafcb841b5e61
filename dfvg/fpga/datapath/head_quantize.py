"""Quantizer for a feature head (dfvg.feature_head) on the FPGA datapath: its body as any draft, plus its ends.

What this module owns: calibrating a head on the target's own features, the number formats of what the head
adds to its body (the features in, `fuse`, `predict`), and `quantize_features`, the one rounding that turns
the target's float features into the int8 the board receives (the GPU computes it before the PCIe copy, so
1 byte per feature crosses, not 2). The body's layers, final norm and LM head are `quantize.py`'s, unchanged:
smoothing, int8/int4 weights, 32-bit residual.

Number formats (real = q * scale):
- features f and the head's own predictions f^: int8 with one static scale per channel (`feature_scales`,
  calibrated max |f_j| over the target's features and the head's predictions / 127). One format for both,
  since a block's second draft reads f^ where the first read f.
- the token's embedding at fuse's input: the body's int8 row (its own scale) requantized to one scale
  (the table's largest row scale), so both halves of fuse's input are int8 at fixed scales.
- fuse [d, H + d]: int8 rows of W * s_in (each input channel's scale folded into its column, so the channel
  scales cost nothing at run time) -> the int32 residual stream at the body's residual scale.
- predict [H, d]: reads the last layer's int32 residual, shifted per row to `predict_bits` (16: one
  DSP48 multiplier per int16 x int8 product; 8: the int8 path) like `rmsnorm_wide`'s leading-one shift,
  and requantizes straight into the feature scales: f^ leaves predict in the format fuse reads.
fuse and predict stay int8 with either body width (1.8 M weights, 6 % of the head's; like the LM head).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor

from dfvg.distill.feature import UNROLL, shifted, target_features
from dfvg.errors import UserError
from dfvg.feature_head import FeatureHead
from dfvg.fpga.datapath import fixed_point as fp
from dfvg.fpga.datapath.quantize import calibrate, quantize_calibrated, quantize_linear, quantize_rows_int8, smooth
from dfvg.model import Transformer

RESIDUAL_TOP_BIT = 32  # the residual is int32: a row's shift before predict is at most 32 - (bits - 1)


def quantize_features(features: Tensor, scales: Tensor) -> Tensor:
    """Float features [..., H] -> int8 at per-channel `scales` [H]: sat(floor(f / s + 1/2)), computed in
    float64 so every machine rounds alike (on a GPU: before the copy to the board)."""
    q = torch.floor(features.to(torch.float64) / scales.to(features.device, torch.float64) + 0.5)
    return q.clamp(-127, 127).to(torch.int8)


def calibration_features(target: Transformer, sequences: list[list[int]]) -> list[Tensor]:
    """The target's final-norm features f [L, H] of each calibration sequence (float32, teacher forced)."""
    device = target.tok_embeddings.weight.device
    return [target_features(target, torch.tensor([seq], device=device),
                            torch.arange(len(seq), device=device)[None])[0].float().cpu() for seq in sequences]


def _feed_head(head: FeatureHead, sequences: list[list[int]], features: list[Tensor], seen: dict) -> None:
    """Run the head as it drafts: pass 0 on the target's features, pass 1 on its own predictions (the second
    draft of a block reads f^), recording max |feature| per channel over both inputs and the predictions. A block
    feature head drafts in one pass: each sequence then ends with its mask rows, reading zero features."""
    device, masks = head.fuse.weight.device, head.body.config.mask_ids
    head.body.setup_cache(1, max(len(s) for s in sequences) + len(masks))
    for seq, feats in zip(sequences, features, strict=True):
        ids = torch.tensor([seq + masks], device=device)
        positions = torch.arange(len(seq) + len(masks), device=device)[None]
        inputs = F.pad(shifted(feats.to(device, head.fuse.weight.dtype)[None]), (0, 0, 0, len(masks)))
        for _ in range(1 if masks else UNROLL):
            _, predicted = head(ids, positions, inputs)
            for value in (inputs, predicted):
                top = value.detach().float().abs().reshape(-1, value.shape[-1]).amax(dim=0).cpu()
                seen["features"] = torch.maximum(seen.get("features", top), top)
            inputs = shifted(predicted)


@torch.inference_mode()
def quantize_feature_head(head: FeatureHead, sequences: list[list[int]], features: list[Tensor], bits: int = 8,
                          group_size: int = 128, predict_bits: int = 16) -> tuple[dict[str, Tensor], dict]:
    """A float head, calibration token sequences and the target's features on them -> (tensors, metadata).

    The body is calibrated on the head's own inputs (fused features and embeddings, not embeddings alone),
    smoothed on a copy, calibrated again and quantized by `quantize_calibrated`; then fuse, predict and the
    embedding's requantization to fuse's input are added (module docstring)."""
    if predict_bits not in (8, 16):
        raise UserError(f"the head's predict input must be 8 or 16 bits wide, got {predict_bits}")
    head = copy.deepcopy(head).float()
    seen: dict[str, Tensor] = {}
    smooth(head.body, calibrate(head.body, sequences, lambda: _feed_head(head, sequences, features, seen)))
    stats = calibrate(head.body, sequences, lambda: _feed_head(head, sequences, features, seen))
    tensors, meta = quantize_calibrated(head.body, stats, bits, group_size)
    feature_scales = (seen["features"].to(torch.float64) / 127).clamp(min=1e-8)
    res = meta["residual_scale"]
    tensors |= _fuse_tensors(head, feature_scales, res)
    tensors |= _predict_tensors(head, feature_scales, res, predict_bits)
    meta |= {"feature_head": {"target_hidden_size": head.target_hidden_size, "predict_bits": predict_bits,
                              "feature_bits": 8, "feature_scales": feature_scales.tolist()},
             "calibration_tokens": sum(len(s) for s in sequences)}
    return tensors, meta


def _fuse_tensors(head: FeatureHead, feature_scales: Tensor, res: float) -> dict[str, Tensor]:
    """fuse with its input scales folded in, and the embedding rows' requantization to fuse's input scale."""
    _, emb_row = quantize_rows_int8(head.body.tok_embeddings.weight)  # the body's int8 rows and their scales
    masks = head.body.block_masks.detach() if head.body.config.block_size else None  # a block head's mask rows
    mask_q, mask_row = quantize_rows_int8(masks) if masks is not None else (None, emb_row[:0])
    embed_scale = float(torch.cat([emb_row, mask_row]).max())
    d = head.body.config.hidden_size
    out = {}
    out["fuse.embed_multiplier"], out["fuse.embed_shift"] = (t.to(torch.int32) for t in
                                                             fp.quantize_multipliers(emb_row / embed_scale))
    if masks is not None:  # int8 rows at their own scales, requantized to fuse's input as the embedding rows are
        out["fuse.mask_rows"] = mask_q
        out["fuse.mask_multiplier"], out["fuse.mask_shift"] = (t.to(torch.int32) for t in
                                                               fp.quantize_multipliers(mask_row / embed_scale))
    in_scales = torch.cat([feature_scales, torch.full((d,), embed_scale, dtype=torch.float64)])
    folded = head.fuse.weight.detach().to(torch.float64) * in_scales[None, :]
    out |= quantize_linear("fuse", folded, None, 1.0, torch.full((d,), res, dtype=torch.float64), 8, 0)
    return out


def _predict_tensors(head: FeatureHead, feature_scales: Tensor, res: float, predict_bits: int) -> dict[str, Tensor]:
    """predict, requantizing into the feature scales; its input's per-row shift lowers each row's shift."""
    out = quantize_linear("predict", head.predict.weight, None, res, feature_scales, 8, 0)
    largest_row_shift = RESIDUAL_TOP_BIT - (predict_bits - 1)
    if int(out["predict.shift"].min()) < largest_row_shift:
        raise UserError("predict's requantization shift is too small for a 32-bit residual row: the head's "
                        "feature scales are far finer than its residual's; recalibrate with more prompts")
    out["predict.input_bits"] = torch.tensor([predict_bits], dtype=torch.int32)
    return out
