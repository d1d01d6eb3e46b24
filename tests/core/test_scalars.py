"""``scalar_outputs``: the one rule by which every summary sink picks scalar step outputs."""

from __future__ import annotations

import numpy as np

from monitored import scalar_outputs


def test_numbers_and_one_element_numeric_arrays_are_scalars_as_they_are() -> None:
    one = np.array([2.0])
    outputs = {
        "int": 3,
        "float": 0.5,
        "np_float": np.float32(1.5),
        "np_int": np.int64(7),
        "np_uint": np.uint8(1),
        "zero_d": np.array(4.0),
        "one": one,
        "flag": True,
        "np_flag": np.bool_(False),
        "bool_array": np.array([True]),
        "vector": np.arange(3.0),
        "empty": np.zeros(0),
        "complex": np.complex64(1j),
        "text": "x",
        "nested": {"a": 1.0},
        "none": None,
    }
    picked = scalar_outputs(outputs)
    assert list(picked) == ["int", "float", "np_float", "np_int", "np_uint", "zero_d", "one"]
    assert picked["one"] is one, "values as they are (a device array stays on its device)"


def test_outputs_that_are_not_a_mapping_have_no_scalars() -> None:
    assert scalar_outputs(None) == {}
    assert scalar_outputs(np.float32(1.0)) == {}
    assert scalar_outputs({1: 2.0}) == {}, "only named outputs"


def test_an_array_like_with_a_numeric_dtype_and_one_element_is_a_scalar() -> None:
    class DeviceArray:  # what a CuPy array offers the rule
        dtype = np.dtype("float32")
        size = 1

    value = DeviceArray()
    assert scalar_outputs({"loss": value}) == {"loss": value}
