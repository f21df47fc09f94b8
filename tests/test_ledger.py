from memcalc.trace.categories import MemoryCategory as C
from memcalc.trace.ledger import MemoryLedger, Phase


def test_peak_and_breakdown_are_replayed_from_events():
    ledger = MemoryLedger()
    weights = ledger.allocate(100, Phase.SETUP, 0, "", C.PARAMETER)
    act = ledger.allocate(50, Phase.FORWARD, 1, "layer", C.TEMPORARY)
    scratch = ledger.allocate(30, Phase.FORWARD, 1, "layer", C.TEMPORARY)
    ledger.free(scratch)
    grad = ledger.allocate(100, Phase.BACKWARD, 1, "", C.TEMPORARY)  # peak: 100+50+100
    ledger.free(act)
    ledger.allocate(10, Phase.OPTIMIZER, 1, "", C.OPTIMIZER_STATE)
    # roles learned after the peak still apply to it
    act.category, grad.category = C.ACTIVATION, C.GRADIENT
    assert ledger.peak_bytes == 250
    assert ledger.live_bytes == 210
    assert ledger.peak_record() is grad
    at_peak = ledger.bytes_by_category_at_peak()
    assert at_peak[C.PARAMETER] == 100 and at_peak[C.ACTIVATION] == 50
    assert at_peak[C.GRADIENT] == 100 and at_peak[C.TEMPORARY] == 0
    assert sum(at_peak.values()) == ledger.peak_bytes
    assert ledger.activation_bytes_by_module_at_peak() == {"layer": 50}
    assert scratch.freed and not weights.freed


def test_empty_ledger_has_no_peak():
    ledger = MemoryLedger()
    assert ledger.peak_record() is None
    assert sum(ledger.bytes_by_category_at_peak().values()) == 0


def test_a_ledger_without_skipped_workspaces_has_the_peak_a_replay_at_capacity_sees():
    ledger = MemoryLedger()
    ledger.allocate(100, Phase.SETUP, 0, "", C.PARAMETER)
    act = ledger.allocate(50, Phase.FORWARD, 1, "conv", C.ACTIVATION)
    workspace = ledger.allocate(80, Phase.FORWARD, 1, "conv", C.WORKSPACE, optional=True)
    ledger.free(workspace)                                   # peak with it: 230
    grad = ledger.allocate(60, Phase.BACKWARD, 1, "", C.GRADIENT)   # without it: 210
    ledger.free(act)
    assert ledger.peak_bytes == 230 and ledger.peak_record() is workspace
    kept = ledger.without(frozenset({workspace.record_id}))
    assert kept.peak_bytes == 210 and kept.peak_record() is grad
    at_peak = kept.bytes_by_category_at_peak()
    assert at_peak[C.WORKSPACE] == 0 and sum(at_peak.values()) == 210
    assert ledger.without(frozenset()) is ledger and ledger.peak_bytes == 230


def test_an_empty_records_free_is_a_free():
    ledger = MemoryLedger()
    record = ledger.allocate(0, Phase.BACKWARD, 1, "embedding", C.TEMPORARY)
    ledger.free(record)
    allocated, freed = ledger.events
    assert not allocated.is_free and freed.is_free
    assert ledger.peak_bytes == 0 and ledger.records_live_at_peak() == []
