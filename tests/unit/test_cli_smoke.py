"""``python -m hyperparallel`` itself, one subprocess per command: the other tests call the CLI in process
(``helpers.run_main``), so here each command's output and exit status through the interpreter must equal the
in-process call's (the entry point, ``__main__``, and what run_main stands in for)."""
import pytest

from helpers import recipe, run_cli, run_main

TINY = recipe("tiny_mllm.yaml")

CASES = {
    "plan": ("plan", recipe("llm_pipeline.yaml")),
    "check": ("check", recipe("llm_pipeline.yaml")),
    "simulate": ("simulate", recipe("mllm_encoder_heavy.yaml"), "--schedule", "1f1b", "--schedule", "transpose"),
    "tune": ("tune", TINY, "--set", "mpipe.profile.regions.0.layers=0"),   # refused: names the field
    "train": ("train", TINY, "--steps", "0"),                               # refused before any launch
    "profile": ("profile", TINY, "--compile", "graph"),
    "bench": ("bench", TINY, "--compile", "graph"),
    "data check": ("data", "check", TINY),                                   # synthetic data: nothing to scan
    "ckpt": ("ckpt", "/nonexistent/save_dir"),
    "usage": ("plan",),                                                      # argparse's own exit 2
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_interpreter_and_the_in_process_call_agree(name):
    args = CASES[name]
    sub, inproc = run_cli(*args, timeout=180), run_main(*args)
    assert (sub.returncode, sub.stdout, sub.stderr) == (inproc.returncode, inproc.stdout, inproc.stderr), name
    assert "Traceback" not in sub.stderr, sub.stderr
    if sub.returncode:
        assert sub.returncode == 2 and sub.stderr.strip(), name
        assert sub.stderr.splitlines()[-1].startswith(("error: ", "hyperparallel")), sub.stderr
    else:
        assert sub.stdout.strip(), name
