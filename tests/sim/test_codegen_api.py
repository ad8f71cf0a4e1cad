"""The device model as a code generator uses it: programs built in Python, origins, a NEFF that loads
without redoing the race analysis, and results that match numpy at scale."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from nxsim_progs import pipeline_program, pipeline_reference

from nxsat import sim
from nxsat.diagnostics import NxsatError
from nxsat.sim import neff


def _inputs(m: sim.Model, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"in{i}": rng.standard_normal(m.program.global_shape(t)).astype(t.dtype.np)
            for i, t in enumerate(m.program.inputs())}


def test_a_generated_pipeline_matches_numpy_and_its_roofline() -> None:
    steps = 300
    m = sim.load(sim.build_neff(pipeline_program(steps), sim.load_target("trn1")))
    assert len(m.linked.instrs) == 8 * steps + 2
    assert m.linked.templates < 200  # a loop body is linked once per distinct form, not per instruction
    ins = _inputs(m)
    np.testing.assert_array_equal(m.run(ins)[0].astype(np.float32), pipeline_reference(m, ins, steps))
    s, _ = m.profile()
    assert s["roofline"]["bound_ns"] <= s["latency_ns"] <= 1.5 * s["roofline"]["bound_ns"]  # double-buffered loads


def test_build_neff_does_not_modify_the_program() -> None:
    p = pipeline_program(4)
    before = copy.deepcopy(p)
    data = sim.build_neff(p, sim.load_target("trn1"))
    assert p == before and all(t.offset is None for t in p.tensors.values() if t.onchip)
    assert sim.build_neff(p, sim.load_target("trn1")) == data  # deterministic


def test_origins_reach_errors_the_disassembly_and_the_trace() -> None:
    p = pipeline_program(3)
    data = sim.build_neff(p, sim.load_target("trn1"))
    text, _ = sim.disassemble(data)
    assert ".origin step 2" in text and ".origin weights" in text
    assert sim.assemble(text, "again.nxs") == data  # origins survive the text form
    m = sim.load(data)
    doc = json.loads(m.trace(m.profile()[1]))
    assert {e["args"].get("origin") for e in doc["traceEvents"] if e["ph"] == "X"} >= {"step 0", "step 2"}
    bad = pipeline_program(3)
    bad.instrs[-1].waits = ()  # the last store no longer waits for VectorE: a race
    with pytest.raises(NxsatError) as e:
        sim.build_neff(bad, sim.load_target("trn1"))
    assert e.value.code == "NCC_EASM008" and "[from step 2]" in e.value.format()


def test_loading_skips_the_race_analysis_unless_asked_but_refuses_tampering() -> None:
    data = sim.build_neff(pipeline_program(4), sim.load_target("trn1"))
    fast = sim.load(data)
    assert fast.linked.vc is None and fast.manifest["verified_by"] == sim.runtime.__version__
    assert sim.load(data, verify=True).linked.vc is not None
    # A byte of the program changed: the member checksum refuses it, no analysis needed.
    box = neff.unpack(data)
    at = data.index(b"q4    dma")
    damaged = data[:at] + b"q5" + data[at + 2:]
    with pytest.raises(NxsatError) as e:
        sim.load(damaged)
    assert e.value.code == "NCC_ENEF002"
    # Rewritten with its checksums fixed, a racy program still loads structurally; --verify and a NEFF
    # that claims another verifier catch the race.
    text = box.members[neff.PROGRAM_MEMBER].decode()
    racy = text.replace("q4    dma            y[0, :, :], zs[:, 0, :], wait=ad>=1, signal=st",
                        "q4    dma            y[0, :, :], zs[:, 0, :], signal=st", 1)
    assert racy != text
    manifest = dict(box.manifest)
    members = [(e["name"], box.members[e["name"]]) for e in manifest.pop("members")]
    members[0] = (neff.PROGRAM_MEMBER, racy.encode())
    forged = neff.pack(manifest, members)
    sim.load(forged)
    with pytest.raises(NxsatError) as e:
        sim.load(forged, verify=True)
    assert e.value.code == "NCC_EASM007"  # the store reads zs before any write is ordered before it
    manifest["verified_by"] = "0.0.1"
    with pytest.raises(NxsatError) as e:
        sim.load(neff.pack(manifest, members))
    assert e.value.code == "NCC_EASM007"


def test_verify_flag_on_the_command_line(tmp_path) -> None:
    from nxsat.cli import main

    path = tmp_path / "p.neff"
    path.write_bytes(sim.build_neff(pipeline_program(4), sim.load_target("trn1")))
    assert main(["profile", str(path), "--verify", "--json"]) == 0
    assert main(["run", str(path), "--verify"]) == 0


@pytest.mark.slow
def test_a_hundred_thousand_instructions_build_load_and_profile() -> None:
    """The scale the backend works at (the benchmark, bench/sim_scale.py, goes to a million)."""
    p = pipeline_program(12_500)
    m = sim.load(sim.build_neff(p, sim.load_target("trn1")))
    s, _ = m.profile()
    assert s["instructions"] == 100_002
    assert s["roofline"]["bound_ns"] <= s["latency_ns"] <= 1.5 * s["roofline"]["bound_ns"]  # double-buffered loads


def test_the_host_thread_count_changes_no_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Matmul groups and transcendental functions over large tiles run on the host's threads; each
    thread computes what one call alone would, so the results are identical for any count."""
    from nxsat.sim import numerics as nm

    m = sim.load(sim.build_neff(pipeline_program(20), sim.load_target("trn1")))
    ins = _inputs(m)
    x = (np.random.default_rng(1).standard_normal(nm.PARALLEL_MIN + 7) * 8).astype(np.float32)
    got = {}
    for n in ("1", "3"):
        monkeypatch.setenv("NXSAT_SIM_THREADS", n)
        assert nm.threads() == int(n)
        got[n] = (m.run(ins)[0], [nm.ACTIVATIONS[f](x) for f in nm.ACTIVATIONS])
    np.testing.assert_array_equal(got["1"][0].view(np.uint16), got["3"][0].view(np.uint16))
    np.testing.assert_array_equal(got["1"][0].astype(np.float32), pipeline_reference(m, ins, 20))
    for f, a, b in zip(nm.ACTIVATIONS, got["1"][1], got["3"][1]):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f


def test_build_model_is_what_loading_its_bytes_gives() -> None:
    """The compile driver profiles the model build_model returns instead of parsing its own NEFF
    back: the two must be the same program, profile and results."""
    p = pipeline_program(6)
    data, built = sim.build_model(p, sim.load_target("trn1"))
    loaded = sim.load(data, verify=True)
    assert data == sim.build_neff(p, sim.load_target("trn1"))
    assert built.text == loaded.text and built.manifest == loaded.manifest
    # the program itself prints as the text the NEFF holds (built in Python, it has no line numbers)
    assert sim.format_program(built.program, built.target.psum_bank_bytes) == loaded.text
    assert [(c.stream, c.op.name, c.attrs) for c in built.linked.instrs] == \
        [(c.stream, c.op.name, c.attrs) for c in loaded.linked.instrs]
    assert built.profile()[0] == loaded.profile()[0]
    ins = _inputs(loaded)
    np.testing.assert_array_equal(built.run(ins)[0].view(np.uint16), loaded.run(ins)[0].view(np.uint16))
