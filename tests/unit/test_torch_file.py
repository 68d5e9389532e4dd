"""vocab/specforge.pt read without torch (regen.torch_file): a file torch 2.14.1 wrote (`torch.save` of a d2t and a
t2d tensor, tests/data/), the same written by tests/torch_format.py, and what is not a file of plain tensors, which
is refused and never run."""

from __future__ import annotations

import io
import pickle
import zipfile

import numpy as np
import pytest

from regen.torch_file import read_tensors
from tests.conftest import ROOT
from tests.torch_format import torch_saved

D2T = np.array([0, 1, 1, 3, 5], dtype=np.int64)
T2D = np.array([1, 0, 1, 0, 1, 1, 0, 0, 1, 0], dtype=bool)


def test_a_file_torch_saved_reads_as_its_tensors() -> None:
    """torch.save({"d2t": torch.from_numpy(D2T), "t2d": torch.from_numpy(T2D)}) with torch 2.14.1."""
    tensors = read_tensors((ROOT / "tests" / "data" / "specforge-torch-2.14.1.pt").read_bytes())
    assert sorted(tensors) == ["d2t", "t2d"]
    assert tensors["d2t"].dtype == np.int64 and tensors["d2t"].tolist() == D2T.tolist()
    assert tensors["t2d"].dtype == np.bool_ and tensors["t2d"].tolist() == T2D.tolist()


def test_the_tests_torch_format_reads_as_torch_s_own() -> None:
    real = read_tensors((ROOT / "tests" / "data" / "specforge-torch-2.14.1.pt").read_bytes())
    made = read_tensors(torch_saved({"d2t": D2T, "t2d": T2D}))
    assert made.keys() == real.keys() and all(np.array_equal(made[k], real[k]) for k in real)


class Called(Exception):
    pass


def _called() -> None:
    raise Called("a pickle's function was run")


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"torch's bytes", id="not-a-zip"),
        pytest.param(b"PK\x05\x06" + b"\0" * 18, id="an-empty-zip"),
        pytest.param("pickle-naming-a-function", id="a-pickle-naming-a-function"),
        pytest.param("a-list", id="not-a-dict"),
    ],
)
def test_what_is_not_a_file_of_plain_tensors_is_refused(body: bytes | str) -> None:
    if isinstance(body, str):
        payload = pickle.dumps(_called if body != "a-list" else [1, 2], protocol=2)
        if body != "a-list":  # a reduce that would call it on load
            payload = b"\x80\x02c" + f"{__name__}\n_called\n".encode() + b")R."
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as archive:
            archive.writestr("archive/data.pkl", payload)
        body = out.getvalue()
    with pytest.raises(ValueError, match="not a"):
        read_tensors(body)
