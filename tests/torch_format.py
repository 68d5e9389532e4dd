"""A dict of tensors as `torch.save` writes it (its zip layout and the pickle it writes for plain CPU tensors), without
torch, for tests of a reader of vocab/specforge.pt in an environment that has no torch. tests/unit/test_torch_file.py
reads a file torch itself wrote the same way."""

from __future__ import annotations

import io
import pickle
import struct
import zipfile

import numpy as np

STORAGE_TYPES = {
    np.dtype(np.int64): "LongStorage",
    np.dtype(np.int32): "IntStorage",
    np.dtype(np.float64): "DoubleStorage",
    np.dtype(np.bool_): "BoolStorage",
}


def _text(value: str) -> bytes:
    data = value.encode()
    return pickle.BINUNICODE + struct.pack("<I", len(data)) + data


def _int(value: int) -> bytes:
    return pickle.BININT + struct.pack("<i", value)


def _tensor(name: str, key: int, array: np.ndarray) -> bytes:
    """`name: _rebuild_tensor_v2(storage, 0, (n,), (1,), False, OrderedDict())` over storage `key`, as torch has it."""
    storage = _text("storage") + f"ctorch\n{STORAGE_TYPES[array.dtype]}\n".encode() + _text(str(key)) + _text("cpu")
    return b"".join(
        [
            _text(name),
            b"ctorch._utils\n_rebuild_tensor_v2\n",
            pickle.MARK,
            pickle.MARK + storage + _int(array.size) + pickle.TUPLE + pickle.BINPERSID,
            _int(0) + _int(array.size) + pickle.TUPLE1 + _int(1) + pickle.TUPLE1 + pickle.NEWFALSE,
            b"ccollections\nOrderedDict\n" + pickle.EMPTY_TUPLE + pickle.REDUCE,
            pickle.TUPLE + pickle.REDUCE,
        ]
    )


def torch_saved(tensors: dict[str, np.ndarray]) -> bytes:
    """The bytes `torch.save({name: torch.from_numpy(array), ...})` writes, in substance, for 1-d int64, int32,
    float64 and bool arrays."""
    items = [_tensor(name, key, array) for key, (name, array) in enumerate(tensors.items())]
    pickled = pickle.PROTO + b"\x02" + pickle.EMPTY_DICT + pickle.MARK + b"".join(items) + pickle.SETITEMS + pickle.STOP
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", pickled)
        archive.writestr("archive/byteorder", "little")
        for key, array in enumerate(tensors.values()):
            archive.writestr(f"archive/data/{key}", np.ascontiguousarray(array).tobytes())
        archive.writestr("archive/version", "3\n")
    return out.getvalue()
