"""Random specs: each either derives a plan that passes the checker or is refused with a one-line error."""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyperparallel.mpipe import SpecError, check, derive, parse_profile
from hyperparallel.mpipe.schedule import BACKWARDS, ORDERS, OWNERS, SPILLS

NAMES = ["vision", "projector", "llm"]


@st.composite
def specs(draw):
    P = draw(st.integers(1, 8))
    M = draw(st.integers(1, 32))
    V = draw(st.sampled_from([1, 1, 2, 3, 4]))
    n = draw(st.integers(1, 3))
    names = NAMES[-n:] if n < 3 else NAMES
    regions = [{"name": r, "layers": draw(st.integers(1, 20)), "trainable": draw(st.booleans()),
                "forward_ms": draw(st.floats(0, 5)), "backward_ms": 1.0, "weight_ms": 0.5} for r in names]
    if draw(st.booleans()):
        parts = []
        for r in names[:-1]:
            kind = draw(st.sampled_from(["place", "transpose", "pipe", "bogus"]))
            item = {"region": r, "skeleton": kind}
            if kind == "place":
                item["device"] = draw(st.integers(0, 9))
            elif kind == "transpose":
                item.update(owners=draw(st.sampled_from(OWNERS)), backward=draw(st.sampled_from(BACKWARDS)),
                            spill=draw(st.sampled_from(SPILLS)))
            parts.append(item)
        parts.append({"region": names[-1], "skeleton": "pipe", "order": draw(st.sampled_from(ORDERS + ("zz",)))})
        schedule = parts
    else:
        name = draw(st.sampled_from(ORDERS + ("transpose",)))
        if name == "transpose":
            opts = [f"owners={draw(st.sampled_from(OWNERS))}", f"backward={draw(st.sampled_from(BACKWARDS))}",
                    f"spill={draw(st.sampled_from(SPILLS))}", f"order={draw(st.sampled_from(ORDERS))}"]
            name += "(" + ",".join(opts) + ")"
        schedule = name
    return P, M, V, regions, schedule


@settings(max_examples=320, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
def test_random_specs_derive_valid_plans_or_are_refused(spec):
    P, M, V, regions, schedule = spec
    try:
        plan = derive(parse_profile({"regions": regions}), schedule, P, M, V)
    except SpecError as e:
        msg = str(e)
        assert "\n" not in msg and ":" in msg, msg
        return
    assert check(plan) == [], (P, M, V, schedule)
