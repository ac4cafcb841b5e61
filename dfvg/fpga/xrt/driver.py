"""The real board path: an XRT host driver for the DFVG draft kernel, plus a contract-checking simulator.

UNTESTED ON HARDWARE. No Alveo board, XRT install or Vitis-built xclbin exists in this project; the host
code below follows XRT's Python bindings (`pyxrt`, shipped with XRT under /opt/xilinx/xrt, not on PyPI)
and is exercised only against `SimulatedXrt`, which offers the same surface and enforces XRT's rules.

Owns: `XrtDraftEngine` (load xclbin once, upload weights once, ONE kernel launch per k-token draft block),
the weight-buffer layout, and `SimulatedXrt`. Does not own the kernel's arithmetic: the simulated device
calls an injected `kernel_fn(weights, context, k) -> k ids` (the bit-exact emulator's block function).

Kernel `dfvg_draft` signature (argument index: name):
    0 weights     bo, packed tensors, each 4 KiB aligned       1 weight_index  bo, WEIGHT_INDEX_DTYPE rows
    2 kv_state    bo, device-only: int32 token id per cached position, then the K/V spill area
    3 tokens_in   bo, int32 [num_in]                           4 tokens_out    bo, int32 [k]
    5 num_in      scalar: ids fed this block                   6 start_pos     scalar: first position fed
    7 k           scalar: draft tokens to produce
The device feeds tokens_in at positions start_pos.., drafts k tokens and keeps the first k - 1 of them
in its cache (the last draft is returned, not fed), so a fully accepted block feeds 2 ids next time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from dfvg.errors import UserError

DRAFT_KERNEL = "dfvg_draft"
KERNEL_ARGS = (("weights", "bo"), ("weight_index", "bo"), ("kv_state", "bo"), ("tokens_in", "bo"),
               ("tokens_out", "bo"), ("num_in", "scalar"), ("start_pos", "scalar"), ("k", "scalar"))
WEIGHT_INDEX_DTYPE = np.dtype([("name", "S64"), ("offset", "<i8"), ("nbytes", "<i8"), ("dtype", "<i4"),
                               ("ndim", "<i4"), ("shape", "<i8", (4,))])
DTYPE_CODES = {np.dtype(np.int8): 0, np.dtype(np.int16): 1, np.dtype(np.int32): 2, np.dtype(np.float32): 3,
               np.dtype(np.float16): 4}
ALIGN = 4096  # AXI bursts and host pages: every tensor starts on a 4 KiB boundary


def load_pyxrt():
    """Import XRT's Python bindings, or say in one line why they are not there."""
    try:
        import pyxrt
    except ImportError as exc:
        raise UserError("pyxrt is not importable: it ships with XRT (run `source /opt/xilinx/xrt/setup.sh`; "
                        "`pip install xrt` is an unrelated package); use backend='simulated' without a board"
                        ) from exc
    return pyxrt


def pack_weights(named: Mapping[str, object]) -> tuple[np.ndarray, np.ndarray]:
    """Named tensors (torch or numpy) -> (uint8 blob, WEIGHT_INDEX_DTYPE table). Order: sorted names."""
    arrays = {name: _as_numpy(name, t) for name, t in sorted(named.items())}
    index = np.zeros(len(arrays), dtype=WEIGHT_INDEX_DTYPE)
    offset = 0
    for row, (name, a) in zip(index, arrays.items(), strict=True):
        row["name"], row["offset"], row["nbytes"] = name.encode(), offset, a.nbytes
        row["dtype"], row["ndim"] = DTYPE_CODES[a.dtype], a.ndim
        row["shape"][: a.ndim] = a.shape
        offset += -(-a.nbytes // ALIGN) * ALIGN
    blob = np.zeros(max(offset, ALIGN), dtype=np.uint8)
    for row, a in zip(index, arrays.values(), strict=True):
        blob[row["offset"]: row["offset"] + a.nbytes] = a.reshape(-1).view(np.uint8)
    return blob, index


def unpack_weights(blob: np.ndarray, index: np.ndarray) -> dict[str, np.ndarray]:
    """Inverse of `pack_weights` (what the device sees): name -> array view into `blob`."""
    dtypes = {code: dt for dt, code in DTYPE_CODES.items()}
    out = {}
    for row in index:
        raw = blob[row["offset"]: row["offset"] + row["nbytes"]]
        out[row["name"].decode()] = raw.view(dtypes[int(row["dtype"])]).reshape(row["shape"][: row["ndim"]])
    return out


def _as_numpy(name: str, tensor: object) -> np.ndarray:
    a = tensor.detach().cpu().numpy() if hasattr(tensor, "detach") else np.asarray(tensor)
    if a.dtype not in DTYPE_CODES or a.ndim > 4 or len(name.encode()) > 64:
        raise UserError(f"weight {name!r}: need dtype int8/int16/int32/float16/float32, <= 4 dims and a name "
                        f"of <= 64 bytes; got {a.dtype}, {a.ndim} dims")
    return np.ascontiguousarray(a)


class XrtDraftEngine:
    """Host side of the board's draft engine: the same block interface as the bit-exact emulator.

    UNTESTED ON HARDWARE (see the module docstring). Typical use:
        engine = XrtDraftEngine("pyxrt")              # or XrtDraftEngine("simulated", kernel_fn=...)
        engine.load("build/dfvg_draft.xclbin")        # once
        engine.upload_weights(int8_state_dict)        # once, into HBM
        draft_ids = engine.run_block(context_ids, k)  # ONE kernel launch per block
        engine.close()
    """

    def __init__(self, backend: str | object = "pyxrt", kernel_fn: Callable | None = None, device_index: int = 0,
                 max_context: int = 2048, max_k: int = 16, kv_spill_bytes: int = 0) -> None:
        if backend == "pyxrt":
            self.xrt = load_pyxrt()
        elif backend == "simulated":
            if kernel_fn is None:
                raise UserError("backend='simulated' needs kernel_fn(weights, context, k) -> list of k ids")
            self.xrt = SimulatedXrt(kernel_fn)
        elif isinstance(backend, str):
            raise UserError(f"unknown XRT backend {backend!r}; use 'pyxrt' or 'simulated'")
        else:
            self.xrt = backend
        self.device = self.xrt.device(device_index)
        self.max_context, self.max_k, self.kv_spill_bytes = max_context, max_k, kv_spill_bytes
        self.kernel = self.weights_bo = None
        self.launches, self.last_launch_s = 0, 0.0  # last_launch_s: measured launch + wait on this host
        self._device_tokens: list[int] = []  # host mirror of the ids whose K/V the device holds

    def load(self, xclbin_path: str | Path) -> None:
        """Load the xclbin (once), find the draft kernel, check its signature, allocate the block buffers."""
        path = Path(xclbin_path)
        if not path.is_file():
            raise UserError(f"xclbin not found: {path}; build it with the Vitis flow under fpga/ (needs AMD "
                            "tools) or use backend='simulated'")
        if self.kernel is not None:
            raise UserError("XrtDraftEngine.load called twice: one xclbin per device and engine")
        xclbin = self.xrt.xclbin(str(path))
        found = {k.get_name(): k for k in xclbin.get_kernels()}
        if DRAFT_KERNEL not in found:
            raise UserError(f"{path} has no kernel {DRAFT_KERNEL!r} (has {sorted(found)}); wrong xclbin")
        if found[DRAFT_KERNEL].get_num_args() != len(KERNEL_ARGS):
            raise UserError(f"{path}: {DRAFT_KERNEL} takes {found[DRAFT_KERNEL].get_num_args()} arguments, this "
                            f"driver passes {len(KERNEL_ARGS)}; rebuild the xclbin from this checkout")
        uuid = self.device.load_xclbin(xclbin)
        self.kernel = self.xrt.kernel(self.device, uuid, DRAFT_KERNEL)
        self.kv_bo = self._alloc(2, 4 * self.max_context + self.kv_spill_bytes, self.xrt.bo.device_only)
        self.tokens_in_bo = self._alloc(3, 4 * self.max_context)
        self.tokens_out_bo = self._alloc(4, 4 * self.max_k)

    def upload_weights(self, named: Mapping[str, object]) -> int:
        """Pack, write and sync the weights to the board's HBM once; returns the bytes uploaded."""
        if self.kernel is None:
            raise UserError("upload_weights before load(xclbin): load the bitstream first")
        blob, index = pack_weights(named)
        self.weights_bo = self._write_synced(0, blob)
        self.index_bo = self._write_synced(1, index.view(np.uint8))
        self._device_tokens = []
        return blob.nbytes + index.nbytes

    def run_block(self, context_token_ids: list[int], k: int) -> list[int]:
        """Draft k tokens after `context_token_ids` with ONE kernel launch; returns the k ids.

        Only the ids the device has not cached are sent: the longest prefix shared with what the device
        holds stays (at least one id is always fed, so the kernel has a position to draft from).
        """
        if self.weights_bo is None:
            raise UserError("run_block before upload_weights: upload the draft weights first")
        if not context_token_ids or not 1 <= k <= self.max_k:
            raise UserError(f"run_block needs a non-empty context and 1 <= k <= {self.max_k}; got k={k}")
        if len(context_token_ids) + k - 1 > self.max_context:
            raise UserError(f"context {len(context_token_ids)} + k {k} exceeds max_context={self.max_context}")
        start = min(self._shared_prefix(context_token_ids), len(context_token_ids) - 1)
        ids = np.asarray(context_token_ids[start:], dtype=np.int32)  # [num_in]
        sync = self.xrt.xclBOSyncDirection
        self.tokens_in_bo.write(ids, 0)
        self.tokens_in_bo.sync(sync.XCL_BO_SYNC_BO_TO_DEVICE, ids.nbytes, 0)
        t0 = time.perf_counter()
        run = self.kernel(self.weights_bo, self.index_bo, self.kv_bo, self.tokens_in_bo, self.tokens_out_bo,
                          len(ids), start, k)
        state = run.wait()
        self.last_launch_s = time.perf_counter() - t0
        self.launches += 1
        if state != self.xrt.ert_cmd_state.ERT_CMD_STATE_COMPLETED:
            raise RuntimeError(f"{DRAFT_KERNEL} ended in state {state}; check `xbutil examine` on the board")
        self.tokens_out_bo.sync(sync.XCL_BO_SYNC_BO_FROM_DEVICE, 4 * k, 0)
        drafts = np.asarray(self.tokens_out_bo.read(4 * k, 0)).view(np.int32).tolist()  # [k]
        self._device_tokens = list(context_token_ids) + drafts[:-1]
        return drafts

    def rollback(self, num_valid: int) -> None:
        """Positions >= num_valid no longer hold valid K/V (the drafter's rollback contract)."""
        del self._device_tokens[max(0, num_valid):]

    def close(self) -> None:
        """Drop the buffers and the kernel handle (XRT frees them when the last reference goes)."""
        self.kernel = self.weights_bo = self.index_bo = self.kv_bo = self.tokens_in_bo = self.tokens_out_bo = None
        self._device_tokens = []

    def _shared_prefix(self, context: list[int]) -> int:
        pairs = enumerate(zip(self._device_tokens, context, strict=False))
        return next((i for i, (a, b) in pairs if a != b), min(len(self._device_tokens), len(context)))

    def _alloc(self, arg: int, nbytes: int, flags: object = None):
        flags = self.xrt.bo.normal if flags is None else flags
        return self.xrt.bo(self.device, max(nbytes, ALIGN), flags, self.kernel.group_id(arg))

    def _write_synced(self, arg: int, data: np.ndarray):
        bo = self._alloc(arg, data.nbytes)
        bo.write(data, 0)
        bo.sync(self.xrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE, data.nbytes, 0)
        return bo


class XrtContractError(RuntimeError):
    """The host broke a rule that real XRT would punish with stale data, a hang or a crash."""


_SyncDirection = SimpleNamespace(XCL_BO_SYNC_BO_TO_DEVICE=0, XCL_BO_SYNC_BO_FROM_DEVICE=1)  # pyxrt's values
_CmdState = SimpleNamespace(ERT_CMD_STATE_COMPLETED=4)  # pyxrt.ert_cmd_state


class SimulatedXrt:
    """Stands in for the `pyxrt` module and enforces its contract; the kernel's result comes from `kernel_fn`.

    Enforced: buffers are allocated (after an xclbin is loaded, in the bank the kernel port uses) before
    use; host writes are synced TO_DEVICE before a launch reads them; kernel results are synced
    FROM_DEVICE (after run.wait()) before the host reads them; device-only buffers are never touched by
    the host; one xclbin per device; kernel arguments match the kernel signature. `launches` counts
    launches per kernel name.
    """

    xclBOSyncDirection = _SyncDirection
    ert_cmd_state = _CmdState

    def __init__(self, kernel_fn: Callable, signatures: Mapping[str, tuple] | None = None) -> None:
        self.kernel_fn = kernel_fn
        self.signatures = dict(signatures or {DRAFT_KERNEL: KERNEL_ARGS})
        self.launches: dict[str, int] = {}
        self._devices: dict[int, _SimDevice] = {}
        self._weights_cache: tuple | None = None

    def device(self, index: int = 0) -> _SimDevice:
        return self._devices.setdefault(index, _SimDevice(self, index))

    def xclbin(self, path: str) -> _SimXclbin:
        return _SimXclbin(Path(path), self.signatures)

    def kernel(self, device: _SimDevice, uuid: str, name: str) -> _SimKernel:
        if device.xclbin is None or device.xclbin.uuid != uuid:
            raise XrtContractError(f"kernel {name!r} opened on device {device.index} without its xclbin loaded")
        if name not in self.signatures:
            raise XrtContractError(f"xclbin has no kernel {name!r}")
        return _SimKernel(self, device, name)

    def run_draft_kernel(self, a: dict) -> None:
        """The device side of `dfvg_draft` (see the module docstring), with `kernel_fn` as the datapath."""
        num_in, start, k = int(a["num_in"]), int(a["start_pos"]), int(a["k"])
        log = a["kv_state"].dev[: a["kv_state"].nbytes // 4 * 4].view(np.int32)  # token id per position
        if num_in < 1 or start < 0 or 4 * num_in > a["tokens_in"].nbytes or 4 * k > a["tokens_out"].nbytes \
                or start + num_in + k - 1 > log.size:
            raise XrtContractError(f"out-of-bounds device access: num_in={num_in} start_pos={start} k={k}")
        log[start: start + num_in] = a["tokens_in"].dev[: 4 * num_in].view(np.int32)
        drafts = [int(t) for t in self.kernel_fn(self._weights(a), log[: start + num_in].tolist(), k)]
        if len(drafts) != k or not all(0 <= t < 2**31 for t in drafts):
            raise XrtContractError(f"kernel_fn returned {len(drafts)} ids (need {k} non-negative int32 ids)")
        a["tokens_out"].dev[: 4 * k] = np.asarray(drafts, dtype=np.int32).view(np.uint8)
        a["tokens_out"].dev_dirty = _union(a["tokens_out"].dev_dirty, (0, 4 * k))
        log[start + num_in: start + num_in + k - 1] = drafts[:-1]

    def _weights(self, a: dict) -> dict:
        """Decode the weight buffers as the device sees them (cached until either buffer is re-synced)."""
        import torch

        key = (id(a["weights"]), a["weights"].version, id(a["weight_index"]), a["weight_index"].version)
        if self._weights_cache is None or self._weights_cache[0] != key:
            raw = a["weight_index"].dev
            rows = raw[: raw.size // WEIGHT_INDEX_DTYPE.itemsize * WEIGHT_INDEX_DTYPE.itemsize]
            index = rows.view(WEIGHT_INDEX_DTYPE)
            index = index[index["name"] != b""]  # the table ends at the first empty name (zero padding)
            named = unpack_weights(a["weights"].dev, index)
            self._weights_cache = (key, {n: torch.from_numpy(t.copy()) for n, t in named.items()})
        return self._weights_cache[1]


class _SimDevice:
    def __init__(self, sim: SimulatedXrt, index: int) -> None:
        self.sim, self.index, self.xclbin = sim, index, None

    def load_xclbin(self, xclbin: _SimXclbin) -> str:
        if self.xclbin is not None:
            raise XrtContractError(f"device {self.index} already has an xclbin loaded: one xclbin per device")
        self.xclbin = xclbin
        return xclbin.uuid


class _SimXclbin:
    def __init__(self, path: Path, signatures: Mapping[str, tuple]) -> None:
        if not path.is_file():
            raise RuntimeError(f"failed to open xclbin {path}")  # what pyxrt.xclbin raises
        self.uuid = f"sim-{abs(hash(path.read_bytes())):x}"
        arity = {name: len(sig) for name, sig in signatures.items()}
        self._kernels = [SimpleNamespace(get_name=lambda n=name: n, get_num_args=lambda a=a: a)
                         for name, a in arity.items()]  # pyxrt.xclbin.xclbinkernel's two getters

    def get_kernels(self) -> list:
        return self._kernels


class _SimKernel:
    def __init__(self, sim: SimulatedXrt, device: _SimDevice, name: str) -> None:
        self.sim, self.device, self.name, self.signature = sim, device, name, sim.signatures[name]

    def group_id(self, arg: int) -> int:
        """Memory bank of argument `arg`: each buffer port on its own HBM pseudo-channel (bank = index)."""
        if not 0 <= arg < len(self.signature) or self.signature[arg][1] != "bo":
            raise XrtContractError(f"{self.name} argument {arg} is not a buffer argument")
        return arg

    def __call__(self, *args: object) -> _SimRun:
        if len(args) != len(self.signature):
            raise XrtContractError(f"{self.name} takes {len(self.signature)} arguments "
                                   f"({', '.join(n for n, _ in self.signature)}); got {len(args)}")
        for i, (arg, (name, kind)) in enumerate(zip(args, self.signature, strict=True)):
            self._check_arg(i, name, kind, arg)
        named = {name: arg for arg, (name, _) in zip(args, self.signature, strict=True)}
        self.sim.launches[self.name] = self.sim.launches.get(self.name, 0) + 1
        self.sim.run_draft_kernel(named)
        outputs = [bo for bo in args if isinstance(bo, _SimBo)]
        for bo in outputs:
            bo.busy = True
        return _SimRun(outputs)

    def _check_arg(self, i: int, name: str, kind: str, arg: object) -> None:
        if kind == "scalar":
            if isinstance(arg, bool | _SimBo) or not isinstance(arg, int | np.integer):
                raise XrtContractError(f"{self.name} argument {i} ({name}) must be an integer scalar")
            return
        if not isinstance(arg, _SimBo) or arg.device is not self.device:
            raise XrtContractError(f"{self.name} argument {i} ({name}) must be a buffer allocated on this device")
        if arg.group != self.group_id(i):
            raise XrtContractError(f"buffer for {name} is in bank {arg.group}, the port is on bank {i}")
        if arg.host_dirty is not None:
            raise XrtContractError(f"buffer {name} was written by the host but not synced TO_DEVICE before launch")


class _SimRun:
    def __init__(self, outputs: list) -> None:
        self.outputs = outputs

    def wait(self, timeout_ms: int = 0) -> int:
        for bo in self.outputs:
            bo.busy = False
        return _CmdState.ERT_CMD_STATE_COMPLETED


class _SimBo:
    """A buffer object with separate host and device copies, so a missing sync gives stale data AND an error."""

    normal, device_only = 0, 268435456

    def __init__(self, device: _SimDevice, nbytes: int, flags: int, group: int) -> None:
        if device.xclbin is None:
            raise XrtContractError("buffer allocated before an xclbin was loaded (no memory topology yet)")
        self.device, self.nbytes, self.flags, self.group = device, int(nbytes), flags, group
        self.dev = np.zeros(self.nbytes, dtype=np.uint8)
        self.host = None if flags == self.device_only else np.zeros(self.nbytes, dtype=np.uint8)
        self.host_dirty = self.dev_dirty = None  # (lo, hi) byte ranges not yet synced
        self.busy, self.version = False, 0

    def write(self, data: object, offset: int) -> None:
        raw = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
        lo, hi = self._range("write", raw.size, offset)
        self.host[lo:hi] = raw
        self.host_dirty = _union(self.host_dirty, (lo, hi))

    def read(self, size: int, offset: int) -> np.ndarray:
        lo, hi = self._range("read", size, offset)
        if self.dev_dirty is not None and self.dev_dirty[0] < hi and lo < self.dev_dirty[1]:
            raise XrtContractError("host read of a buffer the kernel wrote, before sync FROM_DEVICE (stale data)")
        return self.host[lo:hi].view(np.int8).copy()

    def sync(self, direction: int, size: int | None = None, offset: int = 0) -> None:
        lo, hi = self._range("sync", self.nbytes - offset if size is None else size, offset)
        if direction == _SyncDirection.XCL_BO_SYNC_BO_TO_DEVICE:
            self.dev[lo:hi], self.version = self.host[lo:hi], self.version + 1
            self.host_dirty = _minus(self.host_dirty, (lo, hi))
        elif direction == _SyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE:
            if self.busy:
                raise XrtContractError("sync FROM_DEVICE while the kernel run is still going: call run.wait()")
            self.host[lo:hi] = self.dev[lo:hi]
            self.dev_dirty = _minus(self.dev_dirty, (lo, hi))
        else:
            raise XrtContractError(f"unknown sync direction {direction!r}")

    def _range(self, what: str, size: int, offset: int) -> tuple[int, int]:
        if self.host is None:
            raise XrtContractError(f"host {what} of a device-only buffer")
        if offset < 0 or size < 0 or offset + size > self.nbytes:
            raise XrtContractError(f"{what} of [{offset}, {offset + size}) outside a {self.nbytes}-byte buffer")
        return offset, offset + size


SimulatedXrt.bo = _SimBo  # a class attribute, as `pyxrt.bo` is a class


def _union(a: tuple | None, b: tuple) -> tuple:
    return b if a is None else (min(a[0], b[0]), max(a[1], b[1]))


def _minus(dirty: tuple | None, synced: tuple) -> tuple | None:
    """What stays unsynced; a sync that covers only part of the dirty range leaves it all dirty."""
    return None if dirty is None or (synced[0] <= dirty[0] and dirty[1] <= synced[1]) else dirty
