"""Cost profiles: the machine a profile was measured on, and the runtime terms (heads, overheads)."""
import pytest

from hyperparallel.errors import SpecError
from hyperparallel.mpipe.profile import machine_differences, parse_profile


def test_profile_records_its_machine_and_bench_warns_for_another():
    from hyperparallel.bench.machine import profile_warning, this_machine
    here = this_machine("CPU")
    assert set(here) == {"cpu", "cores", "device", "mindspore"} and here["cores"] >= 1
    regions = [{"name": "llm", "layers": 2}]
    same = parse_profile({"regions": regions, "measured_on": here})
    assert profile_warning(same, "CPU", "x.yaml") is None
    other = parse_profile({"regions": regions, "measured_on": dict(here, cpu="Kunpeng 920", cores=192)})
    w = profile_warning(other, "CPU", "x.yaml")
    assert w.startswith("warning: the profile in x.yaml was measured on another machine") and "Kunpeng 920" in w
    assert machine_differences(other.measured_on, here) == [f"cpu: 'Kunpeng 920' != {here['cpu']!r}",
                                                            f"cores: 192 != {here['cores']!r}"]
    assert "does not say where it was measured" in profile_warning(parse_profile({"regions": regions}), "CPU", "r")
    with pytest.raises(SpecError, match=r"measured_on\.gpu"):
        parse_profile({"regions": regions, "measured_on": {"gpu": "x"}})


def test_runtime_terms_are_parsed_and_refused_when_bad():
    p = parse_profile({"regions": [{"name": "llm", "layers": 2, "head_forward_ms": 3.0}],
                       "action_overhead_ms": 1.25, "step_overhead_ms": 7.0})
    assert p.action_overhead_ms == 1.25 and p.step_overhead_ms == 7.0 and p.region("llm").head_forward_ms == 3.0
    with pytest.raises(SpecError, match=r"mpipe.profile.step_overhead_ms"):
        parse_profile({"regions": [{"name": "llm", "layers": 2}], "step_overhead_ms": -1})
    with pytest.raises(SpecError, match=r"regions\[0\].head_forward_ms"):
        parse_profile({"regions": [{"name": "llm", "layers": 2, "head_forward_ms": "x"}]})
