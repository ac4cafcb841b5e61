"""The XRT driver's host code, run against SimulatedXrt (no board here): contract, one launch per block."""

import sys

import numpy as np
import pytest
import torch

from dfvg.errors import UserError
from dfvg.fpga.xrt.driver import (
    DRAFT_KERNEL,
    KERNEL_ARGS,
    SimulatedXrt,
    XrtContractError,
    XrtDraftEngine,
    pack_weights,
    unpack_weights,
)

TO_DEVICE = SimulatedXrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE
FROM_DEVICE = SimulatedXrt.xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE


def _weights() -> dict:
    g = torch.Generator().manual_seed(0)
    return {"tok_embeddings.weight": torch.randint(-128, 128, (16, 8), dtype=torch.int8, generator=g),
            "layers.0.attention.wqkv.weight": torch.randint(-128, 128, (24, 8), dtype=torch.int8, generator=g),
            "layers.0.attention.wqkv.scale": torch.rand(24, generator=g)}


class RecordingKernel:
    """A deterministic stand-in for the emulator's block function; records what the device passed it."""

    def __init__(self):
        self.calls = []

    def __call__(self, weights, context, k):
        self.calls.append((weights, list(context), k))
        seed = int(weights["tok_embeddings.weight"].to(torch.int64).sum()) + sum(context)
        return [(seed + 7 * i) % 16 for i in range(k)]


@pytest.fixture
def xclbin(tmp_path):
    path = tmp_path / "dfvg_draft.xclbin"
    path.write_bytes(b"xclbin2\0" + bytes(56))
    return path


@pytest.fixture
def engine(xclbin):
    kernel = RecordingKernel()
    eng = XrtDraftEngine("simulated", kernel_fn=kernel, max_context=64, max_k=8)
    eng.load(xclbin)
    eng.upload_weights(_weights())
    eng.kernel_fn = kernel
    return eng


def test_pack_roundtrip_and_alignment():
    w = _weights()
    blob, index = pack_weights(w)
    assert all(off % 4096 == 0 for off in index["offset"])
    back = unpack_weights(blob, index)
    for name, t in w.items():
        np.testing.assert_array_equal(back[name], t.numpy())


def test_block_runs_with_one_launch_and_device_sees_the_weights(engine):
    drafts = engine.run_block([1, 2, 3, 4, 5], k=4)
    assert engine.launches == 1 and engine.xrt.launches == {DRAFT_KERNEL: 1}
    weights, context, k = engine.kernel_fn.calls[-1]
    assert context == [1, 2, 3, 4, 5] and k == 4 and len(drafts) == 4
    assert torch.equal(weights["layers.0.attention.wqkv.weight"], _weights()["layers.0.attention.wqkv.weight"])
    assert drafts == RecordingKernel()(_weights(), [1, 2, 3, 4, 5], 4)


def test_only_uncached_ids_are_sent_and_device_cache_holds_drafts(engine, monkeypatch):
    fed = []
    device_side = engine.xrt.run_draft_kernel
    monkeypatch.setattr(engine.xrt, "run_draft_kernel", lambda a: (fed.append((a["start_pos"], a["num_in"])),
                                                                   device_side(a)))
    first = engine.run_block([1, 2, 3], k=3)
    # accept the first draft, then a correction token: the device already cached first[0]
    context = [1, 2, 3, first[0], 9]
    engine.run_block(context, k=2)
    _, device_context, _ = engine.kernel_fn.calls[-1]
    assert device_context == context  # the kernel saw the full context, rebuilt from its cache
    assert engine.launches == 2
    engine.rollback(2)
    engine.run_block([1, 2, 5], k=1)
    assert engine.kernel_fn.calls[-1][1] == [1, 2, 5]
    assert fed == [(0, 3), (4, 1), (2, 1)]  # (start_pos, num_in): position 3 held draft 1 already


def test_many_blocks_count_one_launch_each(engine):
    context = [3]
    for _ in range(5):
        context = context + engine.run_block(context, k=4)[:2]
    assert engine.xrt.launches[DRAFT_KERNEL] == 5 == engine.launches


def _raw(xclbin):
    """A bare simulated device with the draft kernel opened: host code written by hand."""
    sim = SimulatedXrt(RecordingKernel())
    dev = sim.device(0)
    uuid = dev.load_xclbin(sim.xclbin(str(xclbin)))
    kernel = sim.kernel(dev, uuid, DRAFT_KERNEL)
    blob, index = pack_weights(_weights())
    bos = []
    for arg, data in enumerate([blob, index.view(np.uint8)]):
        bo = sim.bo(dev, max(data.nbytes, 4096), sim.bo.normal, kernel.group_id(arg))
        bo.write(data, 0)
        bo.sync(TO_DEVICE, data.nbytes, 0)
        bos.append(bo)
    bos.append(sim.bo(dev, 4096, sim.bo.device_only, kernel.group_id(2)))
    bos += [sim.bo(dev, 4096, sim.bo.normal, kernel.group_id(i)) for i in (3, 4)]
    return sim, dev, kernel, bos


def test_launch_before_sync_to_device(xclbin):
    sim, dev, kernel, bos = _raw(xclbin)
    bos[3].write(np.array([5, 6], dtype=np.int32), 0)
    with pytest.raises(XrtContractError, match="not synced TO_DEVICE"):
        kernel(*bos, 2, 0, 3)
    bos[3].sync(TO_DEVICE, 8, 0)
    run = kernel(*bos, 2, 0, 3)
    with pytest.raises(XrtContractError, match=r"run.wait"):
        bos[4].sync(FROM_DEVICE, 12, 0)
    run.wait()
    with pytest.raises(XrtContractError, match="before sync FROM_DEVICE"):
        bos[4].read(12, 0)
    bos[4].sync(FROM_DEVICE, 12, 0)
    assert bos[4].read(12, 0).view(np.int32).tolist() == RecordingKernel()(_weights(), [5, 6], 3)


def test_wrong_arguments_and_device_only_buffers(xclbin):
    sim, dev, kernel, bos = _raw(xclbin)
    with pytest.raises(XrtContractError, match="takes 8 arguments"):
        kernel(*bos, 1, 0)
    with pytest.raises(XrtContractError, match="integer scalar"):
        kernel(*bos, 1, 0, bos[0])
    with pytest.raises(XrtContractError, match="buffer allocated"):
        kernel(bos[0], bos[1], None, bos[3], bos[4], 1, 0, 1)
    with pytest.raises(XrtContractError, match="bank"):
        kernel(bos[1], bos[0], *bos[2:], 1, 0, 1)
    with pytest.raises(XrtContractError, match="device-only"):
        bos[2].write(b"\0" * 4, 0)
    assert sim.launches == {}


def test_double_xclbin_load_and_alloc_before_load(xclbin):
    sim, dev, _, _ = _raw(xclbin)
    with pytest.raises(XrtContractError, match="one xclbin per device"):
        dev.load_xclbin(sim.xclbin(str(xclbin)))
    with pytest.raises(XrtContractError, match="before an xclbin"):
        sim.bo(sim.device(1), 4096, sim.bo.normal, 0)
    engine = XrtDraftEngine(sim, device_index=0)
    with pytest.raises(XrtContractError, match="one xclbin per device"):
        engine.load(xclbin)


def test_engine_usage_errors(engine, xclbin, tmp_path):
    with pytest.raises(UserError, match="twice"):
        engine.load(xclbin)
    with pytest.raises(UserError, match="max_context"):
        engine.run_block(list(range(60)), k=8)
    fresh = XrtDraftEngine("simulated", kernel_fn=RecordingKernel())
    with pytest.raises(UserError, match="xclbin not found"):
        fresh.load(tmp_path / "missing.xclbin")
    fresh.load(xclbin)
    with pytest.raises(UserError, match="before upload_weights"):
        fresh.run_block([1], k=1)
    with pytest.raises(UserError, match="dtype"):
        fresh.upload_weights({"w": torch.zeros(2, dtype=torch.float64)})


def test_xclbin_with_a_different_kernel_signature(xclbin):
    sim = SimulatedXrt(RecordingKernel(), signatures={DRAFT_KERNEL: KERNEL_ARGS[:-1]})
    with pytest.raises(UserError, match="takes 7 arguments, this driver passes 8"):
        XrtDraftEngine(sim).load(xclbin)


def test_missing_pyxrt_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyxrt", None)  # makes `import pyxrt` raise ImportError
    with pytest.raises(UserError) as err:
        XrtDraftEngine("pyxrt")
    assert "pyxrt is not importable" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(UserError, match="unknown XRT backend"):
        XrtDraftEngine("opencl")
