"""The tensors of a `torch.save` file of plain CPU tensors, read without torch: the hand-off's vocab/specforge.pt is
checked where the verifier runs, and the pipeline does not install torch.

torch.save writes a zip archive: `{archive}/data.pkl`, a pickle whose tensors are `torch._utils._rebuild_tensor_v2(
storage, offset, size, stride, ...)` over storages named by persistent ids `("storage", torch.<Type>Storage, key,
location, numel)`, and each storage's bytes in `{archive}/data/{key}`, in the order `{archive}/byteorder` names. Only
those globals are let in, as torch's own `weights_only` load lets in only what it knows: anything else is refused,
never run (a pickle can name any function to call).
"""

from __future__ import annotations

import collections
import io
import pickle
import zipfile
from typing import Any

import numpy as np

STORAGES = {
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
    "DoubleStorage": np.float64,
    "FloatStorage": np.float32,
    "HalfStorage": np.float16,
}


class _StorageType:
    def __init__(self, name: str) -> None:
        self.dtype = np.dtype(STORAGES[name])


def _rebuild_tensor_v2(
    storage: np.ndarray, offset: int, size: tuple[int, ...], stride: tuple[int, ...], *_: Any
) -> np.ndarray:
    """The tensor `storage[offset:]` viewed at `size` and `stride` (in elements), copied out of its storage."""
    strides = tuple(step * storage.itemsize for step in stride)
    return np.lib.stride_tricks.as_strided(storage[offset:], shape=size, strides=strides).copy()


class _Unpickler(pickle.Unpickler):
    def __init__(self, archive: zipfile.ZipFile, folder: str, byteorder: str) -> None:
        super().__init__(io.BytesIO(archive.read(f"{folder}/data.pkl")))
        self.archive, self.folder, self.byteorder = archive, folder, byteorder

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor_v2
        if module == "torch" and name in STORAGES:
            return _StorageType(name)
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a file of plain tensors")

    def persistent_load(self, pid: Any) -> np.ndarray:
        kind, storage_type, key, _location, numel = pid
        if kind != "storage" or not isinstance(storage_type, _StorageType):
            raise pickle.UnpicklingError(f"persistent id {pid!r} is not a tensor's storage")
        dtype = storage_type.dtype.newbyteorder("<" if self.byteorder == "little" else ">")
        values = np.frombuffer(self.archive.read(f"{self.folder}/data/{key}"), dtype=dtype)
        if len(values) != numel:
            raise pickle.UnpicklingError(f"storage {key} holds {len(values)} values, its id says {numel}")
        return values.astype(storage_type.dtype)  # native order


def read_tensors(data: bytes) -> dict[str, np.ndarray]:
    """A saved dict of tensors, by name, as numpy arrays of their dtypes. ValueError when it is not one."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        [pickled] = [name for name in archive.namelist() if name.endswith("/data.pkl")]
        folder = pickled.rsplit("/", 1)[0]
        byteorder = "little"
        if f"{folder}/byteorder" in archive.namelist():
            byteorder = archive.read(f"{folder}/byteorder").decode()
        loaded = _Unpickler(archive, folder, byteorder).load()
    except (zipfile.BadZipFile, pickle.UnpicklingError, ValueError, KeyError, TypeError, EOFError) as e:
        raise ValueError(f"not a torch file of plain tensors: {e}") from e
    if not isinstance(loaded, dict) or not all(isinstance(v, np.ndarray) for v in loaded.values()):
        raise ValueError(f"not a dict of tensors but a {type(loaded).__name__}")
    return {str(name): tensor for name, tensor in loaded.items()}
