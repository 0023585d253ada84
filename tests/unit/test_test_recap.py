"""tools/test_recap.py: after a failed suite, the failed and errored tests and why, read from pytest's JUnit report."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RECAP = os.path.join(HERE, "..", "..", "tools", "test_recap.py")

FAILING = '''
import pytest

@pytest.fixture(scope="module")
def launched():
    raise AssertionError("msrun launch failed: rank 2 failed: RuntimeError: Recv failed.")

def test_a(launched):
    pass

def test_b(launched):
    pass

def test_c():
    assert 1 + 1 == 3, "arithmetic"

def test_ok():
    pass
'''


def test_recap_names_every_failed_and_errored_test_and_why(tmp_path):
    (tmp_path / "test_sample.py").write_text(FAILING)
    report = tmp_path / "r.xml"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                          str(tmp_path / "test_sample.py")], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 1, run.stdout[-2000:]
    out = subprocess.run([sys.executable, RECAP, str(report)], capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert lines[0] == "== test recap: 3 failed or errored ==", out
    assert any(l.startswith("ERROR ") and l.endswith("::test_a") for l in lines), out
    assert any(l.startswith("ERROR ") and "::test_b: as " in l for l in lines), out   # the same fixture failure once
    assert any(l.startswith("FAILURE ") and l.endswith("::test_c") for l in lines), out
    assert "rank 2 failed: RuntimeError: Recv failed." in out and "arithmetic" in out
    assert "test_ok" not in out


def test_recap_without_a_report_says_so(tmp_path):
    out = subprocess.run([sys.executable, RECAP, str(tmp_path / "missing.xml")], capture_output=True, text=True,
                         check=True).stdout
    assert out.startswith("test recap: no report to read")
