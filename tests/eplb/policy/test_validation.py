"""Every invalid input raises ValueError naming the bad value and what is valid."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_npu.eplb.policy import available_policies, get_policy

D, S, E, L = 4, 3, 10, 2


def _load() -> np.ndarray:
    return np.arange(L * E, dtype=float).reshape(L, E) + 1.0


def _valid_old() -> np.ndarray:
    return get_policy("default").rebalance(_load(), num_ranks=D, slots_per_rank=S)


def test_registry_names() -> None:
    names = available_policies()
    assert {"default", "swift", "flashlb"} <= set(names)
    for name in names:
        assert get_policy(name).name == name


def test_unknown_policy_lists_valid_names() -> None:
    with pytest.raises(ValueError) as err:
        get_policy("bogus")
    msg = str(err.value)
    assert "bogus" in msg
    for name in available_policies():
        assert name in msg


@pytest.mark.parametrize("load, needle", [
    (np.ones(E), "ndim=1"),
    (np.ones((1, 1, L, E)), "ndim=4"),
    (np.ones((L, 0)), "non-empty"),
    (np.array([["a", "b"]]), "numeric"),
])
def test_bad_load_shape(load: np.ndarray, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        get_policy("default").rebalance(load, num_ranks=D, slots_per_rank=S)


@pytest.mark.parametrize("bad, needle", [(np.nan, "finite"), (np.inf, "finite"), (-1.0, ">= 0")])
def test_bad_load_values(policy_name: str, bad: float, needle: str) -> None:
    load = _load()
    load[1, 3] = bad
    with pytest.raises(ValueError, match=needle) as err:
        get_policy(policy_name).rebalance(load, num_ranks=D, slots_per_rank=S)
    assert "[1, 3]" in str(err.value)  # names where


def test_too_few_slots() -> None:
    with pytest.raises(ValueError) as err:
        get_policy("flashlb").rebalance(_load(), num_ranks=3, slots_per_rank=3)
    msg = str(err.value)
    assert "9 < num_experts = 10" in msg and "slots_per_rank >= 4" in msg


def test_more_slots_per_rank_than_experts() -> None:
    with pytest.raises(ValueError, match="slots_per_rank = 11 > num_experts = 10"):
        get_policy("swift").rebalance(_load(), num_ranks=1, slots_per_rank=11)


@pytest.mark.parametrize("ranks, slots, needle", [
    (0, S, "num_ranks must be a positive integer"),
    (-2, S, "num_ranks must be a positive integer"),
    (2.5, S, "num_ranks must be a positive integer, got 2.5"),
    (True, S, "num_ranks must be a positive integer, got True"),
    (D, 0, "slots_per_rank must be a positive integer"),
    (D, "3", "slots_per_rank must be a positive integer, got '3'"),
])
def test_bad_geometry(ranks: object, slots: object, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        get_policy("default").rebalance(_load(), num_ranks=ranks, slots_per_rank=slots)


def test_numpy_int_geometry_accepted() -> None:
    out = get_policy("default").rebalance(_load(), num_ranks=np.int64(D),
                                          slots_per_rank=np.int32(S))
    assert out.shape == (L, D * S)


def test_old_wrong_shape(policy_name: str) -> None:
    old = _valid_old()[:, :-1]
    with pytest.raises(ValueError, match=r"\[L, D\*S\] = \[2, 12\], got \(2, 11\)"):
        get_policy(policy_name).rebalance(_load(), D, S, old_phy2log=old)


def test_old_id_out_of_range() -> None:
    old = _valid_old()
    old[0, 0] = E
    with pytest.raises(ValueError, match="expert id 10; valid ids are 0..9"):
        get_policy("swift").rebalance(_load(), D, S, old_phy2log=old)
    old[0, 0] = -1
    with pytest.raises(ValueError, match="expert id -1"):
        get_policy("swift").rebalance(_load(), D, S, old_phy2log=old)


def test_old_missing_expert() -> None:
    old = np.tile(np.arange(S * D) % (E - 1), (L, 1))  # expert 9 never placed
    with pytest.raises(ValueError, match="layer 0 is missing expert 9"):
        get_policy("flashlb").rebalance(_load(), D, S, old_phy2log=old)


def test_old_duplicate_on_rank() -> None:
    old = np.tile(np.arange(D * S) % E, (L, 1))  # rank 3 = [9, 0, 1]; 0, 1 also on rank 0
    old[1, 3 * S + 1] = 9  # rank 3 of layer 1 becomes [9, 9, 1]; nothing goes missing
    with pytest.raises(ValueError, match="layer 1 rank 3 holds expert 9 twice"):
        get_policy("budget").rebalance(_load(), D, S, old_phy2log=old)


def test_old_non_integer() -> None:
    old = _valid_old().astype(float)
    old[0, 0] += 0.5
    with pytest.raises(ValueError, match="integer expert ids"):
        get_policy("flashlb").rebalance(_load(), D, S, old_phy2log=old)
    # integral floats are fine
    out = get_policy("flashlb").rebalance(_load(), D, S, old_phy2log=_valid_old().astype(float))
    assert out.dtype == np.int64


@pytest.mark.parametrize("history, needle", [
    (np.ones((2, L, E + 1)), r"history must have shape \[H, L, E\] = \[H, 2, 10\].*\(2, 2, 11\)"),
    (np.ones((L, E)), r"history must have shape \[H, L, E\]"),
    (np.full((1, L, E), -2.0), r"history must be >= 0, got -2.0 at index \[0, 0, 0\]"),
    (np.full((1, L, E), np.nan), "history must be finite"),
])
def test_bad_history(policy_name: str, history: np.ndarray, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        get_policy(policy_name).rebalance(_load(), D, S, history=history)


@pytest.mark.parametrize("deadline", [0, -1.0, float("nan"), "1", True])
def test_bad_deadline(deadline: object) -> None:
    with pytest.raises(ValueError, match="deadline_s must be a positive number of seconds or "
                                         "None, got"):
        get_policy("lookahead").rebalance(_load(), D, S, deadline_s=deadline)


def test_history_as_a_list_of_windows() -> None:
    windows = [_load(), 2 * _load()]
    a = get_policy("lookahead").rebalance(_load(), D, S, history=windows)
    b = get_policy("lookahead").rebalance(_load(), D, S, history=np.stack(windows))
    assert np.array_equal(a, b)
