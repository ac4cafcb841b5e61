"""Each integer op of the draft datapath as a run of its RTL kernel: operands -> beats -> simulation -> result.

Every function mirrors one function of `fixed_point.py` / `integer_model.py` and returns the same
integers, computed by the simulated RTL (tests/test_rtl_ops.py checks each at the shipped draft's sizes).
Padding rows/columns with zeros is the only thing done here to the operands; the kernels do the rest.
Tile shapes (`Tiles`) are the design's choice: P output lanes x W elements per beat for the GEMVs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dfvg.fpga.rtlsim.icarus import Icarus, lanes, records, write_hex

IDENTITY = (1 << 14, 14)  # requant32 with M = 2**14, S = 14 passes an accumulator through unchanged


@dataclass(frozen=True)
class Tiles:
    """Beat widths of the simulated design: GEMV P lanes x W elements, norm/softmax/SwiGLU lanes."""

    p: int = 64
    w: int = 64
    lanes: int = 16


def as_np(t) -> np.ndarray:
    """A tensor or array-like as an int64 numpy array (operands of the testbenches)."""
    return t.cpu().numpy().astype(np.int64) if isinstance(t, torch.Tensor) else np.asarray(t, dtype=np.int64)


def _pad(a: np.ndarray, rows: int, cols: int) -> np.ndarray:
    out = np.zeros((rows, cols), dtype=np.int64)
    out[: a.shape[0], : a.shape[1]] = a
    return out


def _up(n: int, m: int) -> int:
    return -(-n // m) * m


@dataclass
class GemvJobs:
    """J jobs x @ w.T sharing one weight matrix w [N, K], with per-row requantization constants.

    res [J, N]: residual added by requant32; valid [J]: rows of each job the argmax may pick (the rest
    read as INT32_MIN); w4/gs: int4 weights [N, K] in [-8, 7] with uint8 group scales [N, K/G] instead of w.
    """

    x: np.ndarray
    w: np.ndarray | None
    mult: np.ndarray
    shift: np.ndarray
    bias: np.ndarray | None = None
    res: np.ndarray | None = None
    valid: np.ndarray | None = None
    gs: np.ndarray | None = None
    x_w: int = 8
    acc_w: int = 32


def _weight_beats(jobs: GemvJobs, t: Tiles, n_pad: int, k_pad: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(w bytes [tiles*B, ...], group scales [tiles*B, P], flags [tiles*B]) in tile-major beat order."""
    beats = k_pad // t.w
    w = _pad(as_np(jobs.w), n_pad, k_pad).reshape(n_pad // t.p, t.p, beats, t.w).transpose(0, 2, 1, 3)
    w = w.reshape(-1, t.p * t.w)  # [tiles * B, P*W]
    last = np.tile(np.arange(beats) == beats - 1, n_pad // t.p)
    if jobs.gs is None:
        return w, np.zeros((w.shape[0], t.p), dtype=np.int64), last.astype(np.int64)
    group = k_pad // jobs.gs.shape[1] if jobs.gs.shape[1] else k_pad
    gs = _pad(as_np(jobs.gs), n_pad, jobs.gs.shape[1])[:, (np.arange(beats) * t.w) // group]  # [N, B]
    gs = gs.reshape(n_pad // t.p, t.p, beats).transpose(0, 2, 1).reshape(-1, t.p)
    glast = np.tile(((np.arange(beats) + 1) * t.w) % group == 0, n_pad // t.p)
    nib = w & 0xF
    return nib[:, 0::2] | (nib[:, 1::2] << 4), gs, last + 2 * glast


def gemv(sim: Icarus, op: str, jobs: GemvJobs, t: Tiles) -> dict[str, np.ndarray]:
    """Run the jobs through gemv_tile / gemv_int4 -> requant (y8 [J, N]), requant32 (y32 [J, N]) and the
    argmax over each job's int32 rows (index, value: 'argmax' [J, 2])."""
    x = as_np(jobs.x)
    n_jobs, k = x.shape
    n = (jobs.gs if jobs.w is None else jobs.w).shape[0]
    n_pad, k_pad = _up(n, t.p), _up(k, t.w)
    tiles, beats = n_pad // t.p, k_pad // t.w
    w, gs, flags = _weight_beats(jobs, t, n_pad, k_pad)
    xb = np.repeat(_pad(x, n_jobs, k_pad).reshape(n_jobs, 1, beats, t.w), tiles, axis=1).reshape(-1, t.w)
    rep = lambda a: np.tile(a, (n_jobs,) + (1,) * (a.ndim - 1))  # noqa: E731  same weights for every job
    beat_bytes = records((xb, "<i4"), (rep(w), "i1" if jobs.gs is None else "u1"), (rep(gs), "u1"),
                         (rep(flags)[:, None], "u1"))
    row = lambda a, fill: _pad(np.broadcast_to(as_np(a if a is not None else fill), (n,))[None], 1, n_pad)  # noqa: E731
    res = _pad(as_np(jobs.res), n_jobs, n_pad) if jobs.res is not None else np.zeros((n_jobs, n_pad), np.int64)
    valid = as_np(jobs.valid) if jobs.valid is not None else np.full(n_jobs, n)
    tile_rows = np.clip(valid[:, None] - np.arange(tiles)[None] * t.p, 0, t.p).reshape(-1, 1)
    consts = records((np.tile(row(jobs.bias, 0), (n_jobs, 1)).reshape(-1, t.p), "<i4"),
                     (np.tile(row(jobs.mult, 0), (n_jobs, 1)).reshape(-1, t.p), "<u2"),
                     (np.tile(row(jobs.shift, 0), (n_jobs, 1)).reshape(-1, t.p), "u1"),
                     (res.reshape(-1, t.p), "<i4"), (tile_rows, "<u2"),
                     (np.tile(np.arange(tiles) == tiles - 1, n_jobs)[:, None], "u1"),
                     (np.zeros((n_jobs * tiles, 1)), "u1"))
    params = {"P": t.p, "W": t.w, "X_W": jobs.x_w, "ACC_W": jobs.acc_w, "INT4": int(jobs.gs is not None)}
    out = sim.run(op, "gemv", params, {"beats": n_jobs * tiles * beats, "tiles": n_jobs * tiles,
                                          "jobs": n_jobs}, beat_bytes, consts, macs=n_jobs * n * k)
    result = {"y32": lanes(out["C"], 32).reshape(n_jobs, n_pad)[:, :n]}
    if out["B"]:
        result["y8"] = lanes(out["B"], 8).reshape(n_jobs, n_pad)[:, :n]
    result["argmax"] = np.array([[int(v) for v in m.split()] for m in out["M"]], dtype=np.int64).reshape(-1, 2)
    return result


def rmsnorm(sim: Icarus, op: str, x, gamma, params: tuple[int, int, int], t: Tiles) -> np.ndarray:
    """int32 rows [R, D] -> int8 [R, D]: `integer_model.rmsnorm_wide` (and, on int8 rows, `fp.rmsnorm`)."""
    x = as_np(x)
    rows, d = x.shape
    if d % t.lanes:
        raise ValueError(f"rmsnorm: D={d} is not a multiple of the {t.lanes} lanes")
    gamma = np.broadcast_to(as_np(gamma), (rows, d))
    beats = records((x.reshape(-1, t.lanes), "<i4"), (gamma.reshape(-1, t.lanes), "<i2"))
    mult, shift, eps = params
    out = sim.run(op, "norm", {"D": d, "W": t.lanes, "SEED_FILE": sim.luts / "rsqrt_seed.hex"},
                  {"beats": rows * d // t.lanes, "mult": mult, "shift": shift, "eps": eps}, beats)
    return lanes(out["Y"], 8).reshape(rows, d)


def softmax(sim: Icarus, op: str, scores, row_max, valid, mult_shift: tuple[int, int], t: Tiles) -> np.ndarray:
    """Scores [R, L] whose first valid[r] entries are kept, with their max row_max [R] (argmax_stream) ->
    Q0.15 probabilities [R, L]: `fp.softmax_q15(scores, M, S, keep)` for a prefix mask."""
    s = as_np(scores)
    rows, length = s.shape
    l_pad = _up(max(length, 1), t.lanes)
    keep = np.arange(l_pad)[None] < as_np(valid)[:, None]
    smax = np.repeat(as_np(row_max), l_pad // t.lanes)[:, None]
    beats = records((_pad(s, rows, l_pad).reshape(-1, t.lanes), "<i4"), (smax, "<i4"),
                    (keep.reshape(-1, t.lanes), "u1"))
    params = {"L": l_pad, "W": t.lanes, "EXP_FILE": sim.luts / "exp2.hex", "SEED_FILE": sim.luts / "recip_seed.hex"}
    out = sim.run(op, "softmax", params, {"beats": rows * l_pad // t.lanes, "mult": mult_shift[0],
                                             "shift": mult_shift[1]}, beats)
    return lanes(out["Y"], 16, signed=False).reshape(rows, l_pad)[:, :length]


def rope(sim: Icarus, op: str, x, cos_q, sin_q) -> np.ndarray:
    """int8 rows [R, hd] rotated by Q1.14 cos/sin [R, hd/2] -> int8 [R, hd] (`fp.rope_apply`); one beat a row."""
    x = as_np(x)
    half = x.shape[1] // 2
    beats = records((x[:, :half], "i1"), (x[:, half:], "i1"), (as_np(cos_q), "<i2"), (as_np(sin_q), "<i2"))
    out = sim.run(op, "rope", {"W": half}, {"beats": x.shape[0]}, beats)
    return lanes(out["Y"], 8).reshape(x.shape)


def swiglu(sim: Icarus, op: str, gate, up, table, mult_shift: tuple[int, int], t: Tiles) -> np.ndarray:
    """int8 gate, up [R, I] -> int8 [R, I]: `requantize(lut_apply(gate, table) * up, M, S)`."""
    gate, up = as_np(gate), as_np(up)
    rows, inter = gate.shape
    i_pad = _up(inter, t.lanes)
    lut = sim.luts / f"silu_{abs(hash(tuple(as_np(table).tolist())))}.hex"
    if not lut.is_file():
        write_hex(lut, torch.as_tensor(as_np(table)), 8)
    beats = records((_pad(gate, rows, i_pad).reshape(-1, t.lanes), "i1"),
                    (_pad(up, rows, i_pad).reshape(-1, t.lanes), "i1"))
    out = sim.run(op, "swiglu", {"W": t.lanes, "LUT_FILE": lut},
                  {"beats": rows * i_pad // t.lanes, "mult": mult_shift[0], "shift": mult_shift[1]}, beats)
    return lanes(out["Y"], 8).reshape(rows, i_pad)[:, :inter]


def topk(sim: Icarus, op: str, x, k: int) -> tuple[np.ndarray, np.ndarray]:
    """int32 rows [R, N] -> (indices [R, k], values [R, k]) from topk_stream: `fp.topk_lowest(x, k)` and the
    values it picks, largest first, the lower index first on ties. One value per beat, rows back to back."""
    x = as_np(x)
    rows, n = x.shape
    if n < k:
        raise ValueError(f"topk: a row of {n} entries has no {k} best")
    out = sim.run(op, "topk", {"K": k, "IDX_W": max(1, (n - 1).bit_length())},
                  {"beats": rows * n, "n": n}, records((x.reshape(-1, 1), "<i4")))
    ranked = np.array([[int(f) for f in line.split()] for line in out["T"]], dtype=np.int64).reshape(rows, k, 3)
    return ranked[..., 1], ranked[..., 2]
