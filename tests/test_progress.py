"""Progress is told to a listener only: the command line's spinner hears every trace, a
library call without one prints nothing."""

import threading

import memcalc
from memcalc.progress import announce, listening


def test_a_listener_hears_each_trace_of_an_estimate_and_nothing_is_printed(capsys):
    heard = []
    with listening(heard.append):
        report = memcalc.estimate("mlp", (16,), gpu="T4", model_args={"in_features": 16})
    traces = [text for text in heard if text.startswith("tracing the step at batch")]
    assert len(traces) >= 2 and f"batch {report.device.max_batch_size} " in " ".join(traces)
    memcalc.estimate("mlp", (16,), batch_size=2, model_args={"in_features": 16})
    assert capsys.readouterr() == ("", "")


def test_listeners_belong_to_their_own_context():
    heard, other = [], []

    def elsewhere():
        announce("from another thread")            # no listener there: nothing heard
        with listening(other.append):
            announce("its own")

    with listening(heard.append):
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
        announce("here")
    announce("after")
    assert heard == ["here"] and other == ["its own"]
