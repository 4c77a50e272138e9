"""The state seam, the validation helpers and the JSON conversion."""

from __future__ import annotations

import json

import numpy as np
import pytest

import service.audit as audit
from service.audit import (
    DictStateReader,
    InvalidInputError,
    InvalidParameterError,
    StateReader,
    is_float_tensor,
)
from service.audit._json import to_jsonable
from service.audit._validation import (
    as_bool_array,
    as_float_array,
    as_int_array,
    check_bool,
    check_choice,
    check_float,
    check_int,
)


class TestDictStateReader:
    def test_keys_in_insertion_order_and_read_only_views(self):
        source: dict[str, np.ndarray] = {
            "b": np.zeros(2),
            "a": np.ones((1, 2), dtype=np.float32),
        }
        reader = DictStateReader(source)
        assert reader.keys() == ["b", "a"]
        view = reader.get("a")
        assert view.dtype == np.float32
        with pytest.raises(ValueError, match="read-only"):
            view[0, 0] = 5.0
        source["b"][0] = 3.0  # the reader does not copy
        assert reader.get("b")[0] == 3.0

    def test_is_a_state_reader(self):
        assert isinstance(DictStateReader({}), StateReader)

    def test_errors(self):
        with pytest.raises(InvalidInputError, match="no tensor 'x'"):
            DictStateReader({}).get("x")
        with pytest.raises(InvalidInputError, match="names must be str"):
            DictStateReader({1: np.zeros(1)})  # type: ignore[dict-item]
        with pytest.raises(InvalidInputError, match="not a numeric array"):
            DictStateReader({"x": np.array([None, "a"], dtype=object)})

    def test_is_float_tensor(self):
        assert is_float_tensor(np.zeros(1, dtype=np.float16))
        assert is_float_tensor(np.zeros(1))
        assert not is_float_tensor(np.zeros(1, dtype=np.int64))
        assert not is_float_tensor(np.zeros(1, dtype=bool))

    def test_duplicate_global_names_rejected(self):
        class Repeating(DictStateReader):
            def keys(self):
                return ["w", "w"]

        with pytest.raises(InvalidInputError, match="not unique"):
            audit.aggregate_fedavg(Repeating({"w": np.zeros(1)}), [Repeating({})], [1])
        with pytest.raises(
            InvalidInputError, match="global_state: tensor 'w' is not a numeric array"
        ):
            audit.fedncl_divergences(_ObjectReader(), [_ObjectReader()])


class _ObjectReader:
    def keys(self):
        return ["w"]

    def get(self, name):
        return np.array([object()], dtype=object)


class TestValidationHelpers:
    def test_check_int(self):
        assert check_int("x", np.int32(3), min_value=0) == 3
        for bad in (True, 1.0, "1"):
            with pytest.raises(InvalidParameterError, match="x: expected an int"):
                check_int("x", bad)
        with pytest.raises(InvalidParameterError, match="x: must be <= 2"):
            check_int("x", 3, max_value=2)

    def test_check_float(self):
        assert check_float("x", 2) == 2.0
        with pytest.raises(InvalidParameterError, match="must be > 0"):
            check_float("x", 0.0, min_value=0.0, min_inclusive=False)
        with pytest.raises(InvalidParameterError, match="must be < 1"):
            check_float("x", 1.0, max_value=1.0, max_inclusive=False)
        with pytest.raises(InvalidParameterError, match="finite"):
            check_float("x", float("inf"))
        with pytest.raises(InvalidParameterError, match="expected a number"):
            check_float("x", np.bool_(True))

    def test_check_bool_and_choice(self):
        assert check_bool("x", np.bool_(False)) is False
        with pytest.raises(InvalidParameterError):
            check_bool("x", 0)
        assert check_choice("x", "a", ("a", "b")) == "a"
        with pytest.raises(InvalidParameterError, match="one of 'a', 'b'"):
            check_choice("x", 1, ("b", "a"))

    def test_arrays(self):
        assert as_int_array("x", [1.0, 2.0], ndim=1).dtype == np.int64
        with pytest.raises(InvalidInputError, match="expected integers, got booleans"):
            as_int_array("x", [True], ndim=1)
        with pytest.raises(InvalidInputError, match="integer values"):
            as_int_array("x", [np.nan], ndim=1)
        with pytest.raises(InvalidInputError, match="integer values"):
            as_int_array("x", [[None]], ndim=2)
        with pytest.raises(InvalidInputError, match="expected numbers"):
            as_float_array("x", np.array(["a"]), ndim=1)
        assert as_bool_array("x", [], ndim=1).shape == (0,)
        with pytest.raises(InvalidInputError, match="1-D"):
            as_bool_array("x", [[True]], ndim=1)


class TestJson:
    def test_converts_numpy_and_containers(self):
        value = {
            "a": np.float32(0.5),
            "b": np.int64(3),
            "c": np.array([[1, 2]]),
            "d": (np.bool_(True), None, "s"),
            1: [1.5],
        }
        converted = to_jsonable(value)
        assert converted == {"a": 0.5, "b": 3, "c": [[1, 2]], "d": [True, None, "s"], "1": [1.5]}
        json.dumps(converted, allow_nan=False)

    def test_rejects_non_finite_and_unknown(self):
        with pytest.raises(ValueError, match=r"\$\.x\[1\]: non-finite"):
            to_jsonable({"x": [1.0, float("nan")]})
        with pytest.raises(ValueError, match="has no JSON form"):
            to_jsonable({"x": object()})


def test_public_api_matches_all():
    exported = set(audit.__all__)
    public = {name for name in dir(audit) if not name.startswith("_")}
    submodules = {
        "accuracy_evidence",
        "aggregation",
        "anchor_mode",
        "aggregators",
        "audit_config",
        "block_consensus",
        "block_source",
        "blocks",
        "centroids",
        "class_null",
        "confident_errors",
        "config_groups",
        "detection",
        "detector_registry",
        "detectors",
        "error_evidence",
        "evidence",
        "evidence_abstention",
        "evidence_verdicts",
        "geometry_evidence",
        "geometry_null",
        "majority_memory",
        "noisy_set",
        "pass_workers",
        "pipeline",
        "pooling",
        "reliability",
        "round_detectors",
        "round_pass",
        "round_inputs",
        "schedules",
        "site_factor",
        "small_federation",
        "sorted_blocks",
        "state",
        "top_k",
        "verdict_types",
    }
    assert public - submodules == exported
    for name in exported:
        assert getattr(audit, name) is not None
