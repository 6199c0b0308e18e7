"""The adapters over a loader that yields on a GPU (``Loader(device="cuda:N")``), through the CuPy stand-in
(``gpu_libraries``): torch takes the device arrays through DLPack (no host copy), passing its current
stream, which CuPy makes wait for the copies; TensorFlow refuses with the reason. The torch here has no
CUDA, so its half of the hand-off stops where it needs CUDA; the real GPU is the ``gpu``-marked test."""
from __future__ import annotations

import numpy as np
import pytest

import dlstore
from dlstore.errors import DlstoreError
from dlstore.io import cuda
from dlstore.pipeline.bert import Bert
from dlstore.pipeline.loader import Loader
from tests.unit.test_memory import bert_file

torch = pytest.importorskip("torch", reason="the torch adapter's tests need torch")


def cpu_batches(path, n_batches=None):
    return [{k: v.copy() for k, v in b.items()}
            for b in Loader(dlstore.open_records(path), Bert(16, 4), 8, last_batch="PARTIAL")][:n_batches]


class TorchCudaStream:
    """What ``torch.cuda.current_stream()`` gives on a GPU: ``cuda_stream`` is the stream's pointer."""

    cuda_stream = 0x7000


@pytest.mark.skipif(torch.cuda.is_available(), reason="a torch with CUDA would take the stand-in's host memory for "
                    "device memory; test_torch_loader_yields_cuda_tensors_from_a_gpu_loader checks the real hand-off")
def test_torch_loader_hands_the_gpu_loaders_arrays_over_through_dlpack(tmp_path, monkeypatch, gpu_libraries):
    from dlstore.adapters.torch import TorchLoader

    cp = gpu_libraries.cupy
    path = bert_file(tmp_path, 37)
    want = cpu_batches(path)
    loader = Loader(dlstore.open_records(path), Bert(16, 4), 8, last_batch="PARTIAL", device="cuda:0")
    adapter = TorchLoader(loader)
    assert adapter.device == torch.device("cuda:0") and not adapter.to_cuda  # no copy of its own to make
    # This torch has no CUDA: from_dlpack reads the arrays' device (cuda:0) and stops asking for its stream.
    with pytest.raises((AssertionError, RuntimeError), match="CUDA"):
        next(iter(adapter))
    # As far as a torch with CUDA goes: the tensor is the device array's memory, and CuPy made torch's
    # stream wait for the copier's stream before handing it over.
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: TorchCudaStream())
    loader = Loader(dlstore.open_records(path), Bert(16, 4), 8, last_batch="PARTIAL", device="cuda:0")
    seen = 0
    for batch, w in zip(TorchLoader(loader), want):
        device_arrays = loader._copier._arrays[(loader._copier._next - 1) % loader._copier.sets]
        assert batch.keys() == w.keys()
        for name, tensor in batch.items():
            assert np.array_equal(tensor.numpy(), w[name])
            assert tensor.data_ptr() == device_arrays[name].data.ptr
        seen += 1
    assert seen == len(want) == 5
    handed = [e for e in cp.log if e[0] == "dlpack"]
    assert handed == [("dlpack", TorchCudaStream.cuda_stream)] * (5 * len(want[0]))  # one per array
    assert ("wait_event", TorchCudaStream.cuda_stream) in [e[:2] for e in cp.log]
    assert loader.stats()["device_copies"] == 5


def test_torch_loader_over_a_gpu_loader_keeps_its_device(tmp_path, gpu_libraries):
    from dlstore.adapters.torch import TorchLoader

    path = bert_file(tmp_path, 8)
    loader = Loader(dlstore.open_records(path), Bert(16, 4), 8, device="cuda:0")
    assert TorchLoader(loader, device="cuda:0").device == torch.device("cuda:0")
    assert TorchLoader(loader, device=torch.device("cuda", 0)).device == torch.device("cuda:0")
    for same in ("cuda", "cuda:local"):  # torch's current device (0 here), the local rank's (0 here)
        assert TorchLoader(loader, device=same).device == torch.device("cuda:0")
    for other in ("cuda:1", "cpu"):
        with pytest.raises(ValueError, match=f"^TorchLoader\\(device='{other}'\\) over a loader yielding on "
                                             "cuda:0: .*make the Loader with device="):
            TorchLoader(loader, device=other)


def test_torch_loader_on_the_cpu_is_unchanged(tmp_path):
    from dlstore.adapters.torch import TorchLoader

    path = bert_file(tmp_path, 16)
    want = cpu_batches(path)
    adapter = TorchLoader(Loader(dlstore.open_records(path), Bert(16, 4), 8, last_batch="PARTIAL"), device="cpu")
    got = [{k: t.clone().numpy() for k, t in b.items()} for b in adapter]
    assert len(got) == len(want) and all(np.array_equal(g[k], w[k]) for g, w in zip(got, want) for k in w)


def test_tensorflow_adapter_refuses_a_gpu_loader_saying_why(tmp_path, gpu_libraries):
    from dlstore.adapters.tensorflow import TensorFlowAdapter, as_tf_dataset

    path = bert_file(tmp_path, 8)
    loader = Loader(dlstore.open_records(path), Bert(16, 4), 8, device="cuda:0")
    for make in (as_tf_dataset, TensorFlowAdapter):
        with pytest.raises(DlstoreError) as e:
            make(loader)
        assert str(e.value).startswith("as_tf_dataset: the loader yields its batches on cuda:0")
        assert "TensorFlow GPU batches are not built" in str(e.value) and "\n" not in str(e.value)
    assert loader.stats()["device_copies"] == 0  # refused before anything was read


def test_the_stand_in_array_is_no_numpy_array_and_reports_a_cuda_device(gpu_libraries):
    # Else the tests above would pass through torch.from_numpy, not the DLPack path a CuPy array takes.
    a = gpu_libraries.cupy.asarray(np.arange(4))
    assert not isinstance(a, np.ndarray) and a.__dlpack_device__() == (2, 0)
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed"):
        np.asarray(a)


@pytest.mark.gpu
def test_torch_loader_yields_cuda_tensors_from_a_gpu_loader(tmp_path):
    missing = cuda.device_missing(cuda.cuda_facts(init=True))
    if missing or cuda.cuda_facts(init=True).cupy is None:
        pytest.skip(missing or "CuPy is not installed")
    if not torch.cuda.is_available():
        pytest.skip("this torch has no CUDA")
    from dlstore.adapters.torch import TorchLoader

    path = bert_file(tmp_path, 37)
    want = cpu_batches(path)
    loader = Loader(dlstore.open_records(path), Bert(16, 4), 8, last_batch="PARTIAL", device="cuda:0")
    got = []
    for batch in TorchLoader(loader):
        assert all(t.device == torch.device("cuda:0") for t in batch.values())
        got.append({k: t.cpu().numpy() for k, t in batch.items()})
    assert len(got) == len(want) and all(np.array_equal(g[k], w[k]) for g, w in zip(got, want) for k in w)
