"""The shared checks of ``hyperparallel.errors``: one message per rule, whichever layer refuses."""
import math

import pytest

from hyperparallel.errors import SpecError, is_number, is_whole, number, whole


@pytest.mark.parametrize("value,least,strict,msg", [
    (-1, 0.0, False, "k: must be a number >= 0, got -1"),
    (0, 0.0, True, "k: must be a number > 0, got 0"),
    (0.5, 1.0, False, "k: must be a number >= 1, got 0.5"),
    (True, 0.0, False, "k: must be a number >= 0, got True"),
    ("1e-4", 0.0, False, "k: must be a number >= 0, got '1e-4'"),
    (None, 0.0, True, "k: must be a number > 0, got None"),
    (math.nan, 0.0, True, "k: must be a finite number > 0, got nan"),
    (-math.inf, 0.0, False, "k: must be a finite number >= 0, got -inf"),
])
def test_number_refuses_naming_the_key_and_the_bound(value, least, strict, msg):
    with pytest.raises(SpecError) as e:
        number("k", value, least, strict)
    assert str(e.value) == msg and e.value.field == "k"


def test_number_returns_a_float_at_the_bound_and_whole_refuses_what_number_takes():
    assert number("k", 0) == 0.0 and isinstance(number("k", 3), float)
    assert number("k", 1e-9, 0.0, strict=True) == 1e-9
    assert (is_number(2), is_number(2.5), is_number(True), is_number("2")) == (True, True, False, False)
    assert (is_whole(2), is_whole(2.0), is_whole(False)) == (True, False, False)
    assert whole("k", 2) == 2
    for bad, msg in ((2.0, "k: must be a whole number >= 1, got 2.0"), (0, "k: must be a whole number >= 1, got 0")):
        with pytest.raises(SpecError) as e:
            whole("k", bad)
        assert str(e.value) == msg
