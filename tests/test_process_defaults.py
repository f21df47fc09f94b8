"""A pre-flight leaves the caller's multiprocessing default as it was: the training script's
own ``set_start_method`` afterwards still works."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import multiprocessing
    import memcalc

    if __name__ == "__main__":
        memcalc.estimate("mlp", (64,), device="cpu", isolate=True,
                         model_args=dict(in_features=64, hidden=64, depth=1))
        memcalc.plan("mlp", (64,), gpu="T4", model_args=dict(in_features=64, hidden=64, depth=1))
        assert multiprocessing.get_start_method(allow_none=True) is None
        multiprocessing.set_start_method("spawn")
        print("set")
""")


def test_the_start_method_is_still_the_callers_to_set():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("set")


def test_a_module_reference_leaves_sys_path_as_it_was(tmp_path, monkeypatch):
    """Naming a model as package.module:callable imports it from the current directory; the
    caller's sys.path is the same after the call (the directory stayed first)."""
    import memcalc

    (tmp_path / "my_net.py").write_text(
        "from torch import nn\n\ndef build():\n    return nn.Linear(16, 4)\n")
    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    report = memcalc.estimate("my_net:build", (16,), device="cpu")
    assert report.device.method == "traced"
    assert sys.path == before
