"""``nxsat compile`` as a user meets it: the NEFF runs and reproduces XLA, the report has its fields, the
flags behave as neuronx-cc documents them, and bad input is one coded line with nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from harness import DATA

from nxsat import sim
from nxsat.cli import main

MLP = DATA / "jax" / "mlp.hlo"


def _run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_compile_writes_a_neff_that_reproduces_xla(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "mlp.neff"
    rep = tmp_path / "r.json"
    code, text, _ = _run(capsys, "compile", str(MLP), "-o", str(out), "--report", str(rep), "--logfile", "")
    assert code == 0 and "latency" in text and "roofline" in text
    ref = np.load(DATA / "jax" / "mlp.npz")
    m = sim.load_file(out, verify=True)
    got = m.run({k: ref[k] for k in ref.files if k.startswith("in")})
    np.testing.assert_allclose(got[0], ref["out0"], rtol=1e-5, atol=1e-5 * np.abs(ref["out0"]).max())
    r = json.loads(rep.read_text())
    for key in ("latency_us", "roofline_us", "stages", "egraph", "extraction", "precision", "engines", "instructions",
                "hbm_bytes", "spill_bytes", "sbuf_peak_bytes"):
        assert key in r, key
    assert {"nodes", "classes", "iterations", "stop_reason"} <= set(r["egraph"])
    assert r["latency_us"] >= r["roofline_us"] > 0
    assert set(r["stages"]) >= {"frontend", "canonicalize", "saturate", "extract", "precision", "device-forms", "lower",
                                "schedule", "neff", "simulate"}
    assert m.manifest["compile_flags"][:2] == ["-o", str(out)]


def test_compiling_twice_gives_the_same_bytes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a, b = tmp_path / "a.neff", tmp_path / "b.neff"
    for p in (a, b):
        assert _run(capsys, "compile", str(MLP), "-o", str(p), "--logfile", "", "-O1", "--auto-cast", "matmult")[0] == 0
    # the flags (and so the NEFFs) differ only in the output name: compile again with the same one
    c = tmp_path / "c.neff"
    for _ in range(2):
        assert _run(capsys, "compile", str(MLP), "-o", str(c), "--logfile", "")[0] == 0
        data = c.read_bytes()
    assert _run(capsys, "compile", str(MLP), "-o", str(c), "--logfile", "")[0] == 0
    assert c.read_bytes() == data


def test_auto_cast_matmult_casts_tensor_engine_operands_only(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rep = tmp_path / "r.json"
    _run(capsys, "compile", str(MLP), "-o", str(tmp_path / "x.neff"), "--report", str(rep), "--logfile", "",
         "--auto-cast", "matmult", "--auto-cast-type", "fp16", "--auto-cast-type", "bf16", "--precision", "policy")
    r = json.loads(rep.read_text())
    assert r["precision"]["auto_cast_type"] == "bf16"  # the right-most flag wins
    assert r["precision"]["ops_by_type"].get("bf16") == 2  # the two dots; everything else stays f32
    assert r["precision"]["ops_by_type"].get("f32", 0) > 0
    assert r["decisions"]["precision"] == "policy"


def test_precision_by_cost_reports_each_choice(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """-O2's default: each dot is offered in bf16 and the extraction keeps the cheaper; the report lists both
    prices per dot and the summary line says how many were narrowed."""
    rep = tmp_path / "r.json"
    code, out, _ = _run(capsys, "compile", str(MLP), "-o", str(tmp_path / "x.neff"), "--report", str(rep),
                        "--logfile", "", "--auto-cast", "matmult")
    r = json.loads(rep.read_text())
    casts = r["extraction"]["casts"]
    assert code == 0 and len(casts) == 2 and r["decisions"]["offered"] == 2
    for c in casts:
        assert c["chosen"] in ("bf16", "f32") and c["bf16_us"] > 0 and c["f32_us"] > 0
    assert r["decisions"]["narrowed"] == sum(c["chosen"] == "bf16" for c in casts)
    assert f"by cost: {r['decisions']['narrowed']} of 2 dots and convolutions in bf16" in out


def test_flags_from_neuron_cc_flags(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    monkeypatch.setenv("NEURON_CC_FLAGS", "--auto-cast all --auto-cast-type fp16")
    rep = tmp_path / "r.json"
    _run(capsys, "compile", str(MLP), "-o", str(tmp_path / "x.neff"), "--report", str(rep), "--logfile", "",
         "--auto-cast-type", "bf16")
    r = json.loads(rep.read_text())
    assert r["auto_cast"] == "all" and r["auto_cast_type"] == "bf16"


def test_deprecated_o1_warns_and_means_o1(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rep = tmp_path / "r.json"
    code, _, err = _run(capsys, "compile", str(MLP), "-o", str(tmp_path / "x.neff"), "--report", str(rep),
                        "--logfile", "", "--enable-experimental-O1")
    assert code == 0 and "NCC_WARG001" in err
    assert json.loads(rep.read_text())["optlevel"] == 1


@pytest.mark.parametrize("argv,code_,text", [
    (["--target", "trn1", "--logical-nc-config", "2"], "NCC_EARG001", "not valid for trn1"),
    (["--target", "inf1"], "NCC_EARG002", "neuron-cc"),
    (["--target", "trn9"], "NCC_EARG002", "unknown target"),
])
def test_impossible_flags_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture, argv: list[str], code_: str,
                                      text: str) -> None:
    out = tmp_path / "x.neff"
    code, _, err = _run(capsys, "compile", str(MLP), "-o", str(out), "--logfile", "", *argv)
    assert code == 2 and code_ in err and text in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def _hlo(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "m.hlo"
    p.write_text(body)
    return p


def test_a_model_over_device_memory(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    p = _hlo(tmp_path, "HloModule big\nENTRY e {\n  p = f32[65536,65536,2] parameter(0)\n"
                       "  ROOT n = f32[65536,65536,2] negate(p)\n}\n")
    out = tmp_path / "x.neff"
    code, _, err = _run(capsys, "compile", str(p), "-o", str(out), "--logfile", "")
    assert code == 1 and "NCC_EOOM001" in err and "bytes" in err and not out.exists()


def test_an_operator_the_device_cannot_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    p = _hlo(tmp_path, "HloModule m\nENTRY e {\n  p = f32[4,4] parameter(0)\n"
                       "  ROOT c = f32[4,4] cholesky(p), lower=true\n}\n")
    out = tmp_path / "x.neff"
    code, _, err = _run(capsys, "compile", str(p), "-o", str(out), "--logfile", "")
    assert code == 1 and "NCC_EUOC002" in err and "m.hlo:4" in err and not out.exists()


def test_an_unwritable_output_fails_before_compiling(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code, _, err = _run(capsys, "compile", str(MLP), "-o", str(tmp_path / "no" / "x.neff"), "--logfile", "")
    assert code == 1 and "NCC_EFIL002" in err
    code, _, err = _run(capsys, "compile", str(MLP), "-o", str(MLP), "--logfile", "")
    assert code == 1 and "NCC_EFIL002" in err and MLP.read_text().startswith("HloModule")


def test_the_report_says_what_forwarding_did(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = DATA / "models" / "resnet_small.hlo"
    lines = {}
    for flags in ((), ("--disable-forwarding",)):
        code, text, _ = _run(capsys, "compile", str(model), "-o", str(tmp_path / "x.neff"), "--logfile", "", *flags)
        assert code == 0
        lines[flags] = next(line for line in text.splitlines() if line.strip().startswith("forwarding"))
    assert "loads read values still in SBUF" in lines[()] and not lines[()].split()[1].startswith("0")
    assert lines[("--disable-forwarding",)].split(None, 1)[1] == "off (--disable-forwarding)"


def test_workdir_dumps_every_stage(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    wd = tmp_path / "wd"
    assert _run(capsys, "compile", str(MLP), "-o", str(tmp_path / "x.neff"), "--logfile", "", "--workdir",
                str(wd))[0] == 0
    names = sorted(os.listdir(wd))
    assert names == ["01-input.hlo", "02-canonical.hlo", "03-egraph.json", "04-extracted.hlo", "04-extraction.json",
                     "05-precision.hlo", "05-precision.json", "06-forwarded.json", "06-lowered.json",
                     "07-program.nxs", "08-profile.json"]
    assert (wd / "07-program.nxs").read_text().startswith(".isa 1.1")


def test_help_explains_every_option(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["compile", "--help"])
    text = capsys.readouterr().out
    for flag in ("--framework", "--target", "--model-type", "--auto-cast", "--auto-cast-type",
                 "--enable-mixed-precision-accumulation", "--enable-saturate-infinity", "--optlevel",
                 "--distribution-strategy", "--logical-nc-config", "--num-parallel-jobs", "--output", "--logfile",
                 "--verbose", "--workdir", "--report", "--disable-forwarding"):
        assert flag in text, flag


def test_a_compile_leaves_nothing_alive() -> None:
    """The first compile in a process (the one that imports egglog) frees its whole graph: egglog's
    Python API keeps the frames that import it, so nxsat loads only its bindings."""
    code = ("import gc, sys\n"
            "from nxsat.driver import CompileOptions, compile_model\n"
            "from nxsat.backend.graph import Inst\n"
            "def f():\n"
            f"    compile_model({str(MLP)!r}, CompileOptions())\n"
            "f(); gc.collect()\n"
            "print(sum(isinstance(o, Inst) for o in gc.get_objects()), 'egglog' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["0", "False"]


def test_the_instruction_graph_is_freed_without_the_cycle_collector() -> None:
    """Graph.release breaks the graph's cycles: with the collector off, reference counting alone frees
    every instruction (mobilenet_v2's compile no longer spends 15 s in a collection)."""
    code = ("import gc\n"
            "from nxsat.driver import CompileOptions, compile_model\n"
            "from nxsat.backend.graph import Buf, Inst\n"
            "gc.disable()\n"
            f"compile_model({str(MLP)!r}, CompileOptions())\n"
            "print(sum(isinstance(o, (Inst, Buf)) for o in gc.get_objects()))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["0"]


@pytest.mark.parametrize("flags,extractor", [(["-O1"], "greedy"), (["-O2"], "dag"), (["-O3"], "ilp"),
                                             (["-O3", "--extractor", "dag"], "dag"),
                                             (["--extractor", "smallest"], "smallest")])
def test_each_level_has_its_extractor_and_the_flag_overrides_it(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                flags: list[str], extractor: str) -> None:
    rep = tmp_path / "r.json"
    code, _, _ = _run(capsys, "compile", str(DATA / "jax" / "transformer_layer.hlo"), "-o", str(tmp_path / "t.neff"),
                      "--report", str(rep), "--logfile", "", "--auto-cast", "matmult", *flags)
    assert code == 0
    ex = json.loads(rep.read_text())["extraction"]
    assert ex["extractor"] == extractor and ex["enodes"] > 0 and ex["cost_us"] > 0
    assert ex["cost_us"] <= ex["input_cost_us"] or extractor == "smallest"
    assert ("ilp" in ex) == (extractor == "ilp") and (extractor != "ilp" or ex["ilp"]["status"] == "optimal")


def test_o3_measures_its_candidates_and_keeps_the_fastest(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """-O3 compiles its extraction (and -O2's, where it differs) under four load lookaheads and then, at the
    best of them, with the weights on queues of their own, and -O2's schedules (critical-path order, half the
    prefetch share); it
    simulates each and keeps the fastest: never slower than -O2, and the report lists what it tried."""
    reports = {}
    for level in (2, 3):
        rep = tmp_path / f"r{level}.json"
        code, out, _ = _run(capsys, "compile", str(DATA / "jax" / "transformer_layer.hlo"), "-o",
                            str(tmp_path / f"t{level}.neff"), "--report", str(rep), "--logfile", "", "--auto-cast",
                            "matmult", f"-O{level}")
        assert code == 0
        reports[level] = json.loads(rep.read_text())
    # -O2: its program under the default schedule, it and the streaming one (loads far ahead, weights apart)
    # in critical-path order, the streaming one also in time, and again with its loads longest chain first
    # and the stalls timed, then in program order (its weights fit in the prefetch share: not with half of
    # it), and -O1's program, which differs (its precision policy casts every dot; -O2 leaves four in fp32
    # by cost), as -O1 schedules it and writing in place
    tried2 = reports[2]["search"]["tried"]
    assert [(t["lookahead"], t["weight_queues"], t["critical"], t.get("timed", False), t.get("loads_by_rank", False))
            for t in tried2 if t["program"] == "dag"] == \
        [(48, 0, False, False, False), (48, 0, True, False, False), (4800, 8, True, False, False),
         (4800, 8, True, True, False), (4800, 8, True, True, True), (4800, 8, False, False, False)]
    assert [(t["program"], t.get("write_in_place", True)) for t in tried2 if t["program"] != "dag"] == \
        [("-O1 (greedy)", False), ("-O1 (greedy)", True)]
    assert reports[2]["latency_us"] == min(t["latency_us"] for t in reports[2]["search"]["tried"])
    search = reports[3]["search"]
    tried = [t["latency_us"] for t in search["tried"]]
    assert {t["lookahead"] for t in search["tried"]} == {24, 48, 96, 4800}
    # per program: four lookaheads, the best of the first three with the weights apart, and -O2's schedules:
    # the streaming one, both in critical-path order, the streaming one also in time (twice: the second
    # with its loads longest chain first), and the streaming one with half the prefetch share
    per_program = [(t["lookahead"], t["weight_queues"], t["critical"], t.get("timed", False))
                   for t in search["tried"] if t["program"] == "ilp"]
    assert len(per_program) == 12
    assert per_program[-7:] == [(4800, 8, False, False), (48, 0, True, False), (4800, 8, True, False),
                                (4800, 8, True, True), (4800, 8, True, True), (4800, 8, False, False),
                                (4800, 8, False, True)]
    assert per_program[-8][0] in (24, 48, 96) and per_program[-8][1] == 8
    assert sum(w > 0 for _, w, _, _ in per_program) == 7
    assert reports[3]["latency_us"] == tried[search["chosen"]] == min(tried) <= reports[2]["latency_us"]
    assert "schedules tried, the fastest kept" in out


def test_o2_streams_weights_that_do_not_fit_with_half_the_prefetch_share_too() -> None:
    """BERT-2's weights (over 100 MB) do not fit in the prefetch share of SBUF: -O2 measures its streaming
    schedule once more with half the share, in time, then that one with the weights it converts in a ring of
    their own, and keeps the fastest of the eight (the ring's may not fit: the work's tiles then lack the
    ring's share; the report says why). Compiled in fp32, nothing is converted and the ring is not tried."""
    from nxsat import driver
    from nxsat.backend.schedule import PREFETCH_SBUF_FRACTION

    rep = driver.compile_model(str(DATA / "bert" / "bert_base_l2.hlo"), driver.CompileOptions(
        target="trn1", optlevel=2, auto_cast="matmult")).report
    tried = rep["search"]["tried"]
    half = PREFETCH_SBUF_FRACTION / 2
    assert [(t["lookahead"], t["weight_queues"], t["critical"], t.get("timed", False), t.get("prefetch"),
             t.get("ring")) for t in tried] == [
        (48, 0, False, False, None, None), (48, 0, True, False, None, None), (4800, 8, True, False, None, None),
        (4800, 8, True, True, None, None), (4800, 8, True, True, None, None), (4800, 8, False, False, None, None),
        (4800, 8, False, True, half, None), *((4800, 8, False, True, half, r) for r in driver.RING_SHARES)]
    assert all(t["latency_us"] is not None or t["failed"] == "NCC_EOOM001" for t in tried[-2:])
    assert rep["latency_us"] == min(t["latency_us"] for t in tried if t["latency_us"] is not None)
    # in fp32 nothing is converted: the ring would be empty, its schedule the one before it, so it is not tried
    fp32 = driver.compile_model(str(DATA / "bert" / "bert_base_l2.hlo"), driver.CompileOptions(
        target="trn1", optlevel=2)).report["search"]["tried"]
    assert len(fp32) == 7 and not any(t.get("ring") for t in fp32) and fp32[-1].get("prefetch") == half


def test_o2_measures_o1s_program_where_it_differs() -> None:
    """-O2 compiles -O1's program too (its saturation budget, its greedy extraction, the policy's precision)
    where it differs from its own, under -O1's schedule and writing in place as -O2 does, and keeps the
    fastest: never slower than -O1 (convnet: -O1's program is another, here slower; unet_diffusers': 0.06 us
    faster than -O2's own)."""
    from nxsat import driver

    path = str(DATA / "jax" / "convnet.hlo")
    o1, o2 = (driver.compile_model(path, driver.CompileOptions(target="trn1", optlevel=n, auto_cast="matmult"))
              for n in (1, 2))
    tried = o2.report["search"]["tried"]
    # its own schedules, the program with every convolution channels-first (measured: faster here) under the
    # two fastest of them, -O1's both ways
    assert [t["program"] for t in tried] == ["dag"] * (len(tried) - 4) + ["channels-first"] * 2 \
        + ["-O1 (greedy)"] * 2 and len(tried) in (9, 10)
    key = ("lookahead", "weight_queues", "critical", "timed", "prefetch")
    own = sorted((t for t in tried if t["program"] == "dag"), key=lambda t: t["latency_us"])
    assert [[t.get(k) for k in key] for t in tried[-4:-2]] == [[t.get(k) for k in key] for t in own[:2]]
    assert [t.get("write_in_place", True) for t in tried[-2:]] == [False, True]
    assert tried[-2]["latency_us"] == o1.report["latency_us"]
    assert o2.report["latency_us"] == min(t["latency_us"] for t in tried) <= o1.report["latency_us"]
    # -O3 weighs every program -O2 does, -O1's included, so it is never slower than -O2 (unet_diffusers:
    # -O2 kept -O1's program, 324.6 us, where -O3's own ran 324.7)
    o3 = driver.compile_model(path, driver.CompileOptions(target="trn1", optlevel=3, auto_cast="matmult"))
    tried3 = o3.report["search"]["tried"]
    assert "-O1 (greedy)" in [t["program"] for t in tried3]
    assert o3.report["latency_us"] == min(t["latency_us"] for t in tried3 if t["latency_us"]) <= o2.report["latency_us"]
    # the report says who chose the kept program's precision: mlp under `all` keeps -O1's program (7.319 us
    # against -O2's own 7.576), whose precision is the policy's
    res = driver.compile_model(str(DATA / "jax" / "mlp.hlo"), driver.CompileOptions(auto_cast="all"))
    search = res.report["search"]
    assert search["tried"][search["chosen"]]["program"] == "-O1 (greedy)"
    assert res.report["decisions"]["precision"] == "policy"


def test_an_unknown_extractor_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        main(["compile", str(MLP), "-o", str(tmp_path / "m.neff"), "--extractor", "fastest"])
    assert e.value.code != 0 and not (tmp_path / "m.neff").exists()
    assert "fastest" in capsys.readouterr().err


def test_the_progress_line_says_the_exact_extractor_may_take_a_while() -> None:
    import io

    from nxsat.driver import CompileOptions, compile_model
    from nxsat.progress import Progress

    for level, shown in ((3, True), (2, False)):
        buf = io.StringIO()
        compile_model(str(MLP), CompileOptions(optlevel=level), progress=Progress(buf, enabled=True, interval=0))
        assert ("extract (exact ILP: up to 60 s)" in buf.getvalue()) == shown


@pytest.mark.parametrize("auto_cast", ["none", "matmult"])
def test_the_roofline_uses_the_type_tensore_multiplies_in(tmp_path: Path, auto_cast: str) -> None:
    """A bf16 model compiled with --auto-cast none multiplies in bf16: its roofline is held to the bf16
    peak, not the flag's fp32 one (which put a 2048^3 bf16 dot's latency at 0.9 of its "roofline");
    an fp32 model under --auto-cast none stays fp32."""
    from nxsat.driver import CompileOptions, compile_model

    for dtype, want in (("bf16", "bf16"), ("f32", "f32" if auto_cast == "none" else "bf16")):
        src = tmp_path / f"{dtype}.hlo"
        src.write_text(f"HloModule d\n\nENTRY main {{\n  a = {dtype}[512,512] parameter(0)\n"
                       f"  b = {dtype}[512,512] parameter(1)\n  ROOT d = {dtype}[512,512] dot(a, b), "
                       "lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n")
        r = compile_model(str(src), CompileOptions(auto_cast=auto_cast)).report
        t = sim.load_target("trn1")
        assert r["roofline"]["matmul_precision"] == want
        assert r["roofline"]["compute_us"] == round(2 * 512**3 / t.peak_flops(want) / 1000, 3)
        assert r["latency_over_roofline"] >= 1.0


def test_the_roofline_counts_the_rows_a_gather_reads_of_a_table() -> None:
    """tests/data/jax/embedding: a f32[100, 16] table only a gather of 3 x 5 ids reads. The compulsory bytes
    are the 15 rows gathered (960 B), the ids (60 B) and the f32[3, 16] output (192 B), not the whole
    table's 6,400 B (which put BERT-2's roofline above its simulated latency)."""
    from nxsat.driver import CompileOptions, compile_model

    r = compile_model(str(DATA / "jax" / "embedding.hlo"), CompileOptions()).report
    assert r["roofline"]["compulsory_hbm_bytes"] == 15 * 16 * 4 + 3 * 5 * 4 + 3 * 16 * 4
    assert r["latency_us"] >= r["roofline_us"]


def test_two_extractions_of_one_program_compare_equal() -> None:
    """-O3 compiles -O2's program too only when it is another program: names, the order of independent
    instructions and a constant written twice do not make one."""
    from nxsat import dtypes as dt
    from nxsat.builder import Builder
    from nxsat.driver import _structure

    def program(op: str = "exponential", twice: bool = False, swap: bool = False):  # noqa: ANN202
        b = Builder("m")
        p = b.param(dt.F32, (4,))
        two = b.op("broadcast", [b.constant(2.0, dt.F32)], shape=(4,), dimensions=())
        e = b.op(op, [p])
        if twice:  # the same constant again, for a second reader
            e = b.op("add", [e, b.op("broadcast", [b.constant(2.0, dt.F32)], shape=(4,), dimensions=())])
        else:
            e = b.op("add", [e, two])
        return b.module(b.op("multiply", [two, e] if swap else [e, two]))

    assert _structure(program()) == _structure(program(twice=True))
    assert _structure(program()) != _structure(program("tanh"))
    assert _structure(program()) != _structure(program(swap=True))


def test_a_searched_schedule_that_does_not_fit_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A schedule the search tries may not fit on chip (loads far ahead holding the SBUF the work at hand
    needs: gemma3 generic at lookahead 4,800); it is reported as failed and the others are kept. The
    compile's own first schedule failing is the compile's failure."""
    import nxsat.backend as backend
    from nxsat import driver
    from nxsat.diagnostics import NxsatError, error

    res = _compile_where_schedules_fail(monkeypatch, lambda options: options.lookahead > 1000)
    tried = res.report["search"]["tried"]
    assert [t.get("failed") for t in tried] == [None, None] + ["NCC_EOOM001"] * 4
    assert res.report["search"]["chosen"] in (0, 1)
    assert res.report["latency_us"] == min(tried[0]["latency_us"], tried[1]["latency_us"])

    def always(lw, target, flags, options):  # noqa: ANN001, ANN202
        raise error("NCC_EOOM001", "the working set does not fit on chip (test)")

    monkeypatch.setattr(backend, "schedule_graph", always)
    with pytest.raises(NxsatError):
        driver.compile_model(str(DATA / "jax" / "mlp.hlo"),
                             driver.CompileOptions(target="trn1", optlevel=2, auto_cast="matmult"))


def _compile_where_schedules_fail(monkeypatch: pytest.MonkeyPatch, fails):  # noqa: ANN001, ANN202
    """mlp.hlo at -O2 with the schedules ``fails(options)`` says do not fit on chip."""
    import nxsat.backend as backend
    from nxsat import driver
    from nxsat.diagnostics import error

    real = backend.schedule_graph

    def schedule(lw, target, flags, options):  # noqa: ANN001, ANN202
        if fails(options):
            raise error("NCC_EOOM001", "the working set does not fit on chip (test)")
        return real(lw, target, flags, options)

    monkeypatch.setattr(backend, "schedule_graph", schedule)
    return driver.compile_model(str(DATA / "jax" / "mlp.hlo"),
                                driver.CompileOptions(target="trn1", optlevel=2, auto_cast="matmult"))


def test_a_schedule_that_does_not_fit_tries_again_with_half_the_prefetch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loads issued far ahead hold SBUF: a schedule that finds no room is tried again with half the share
    of SBUF prefetching may fill (before its forwarding is undone), and the report says so."""
    from nxsat.extract.plan import PREFETCH_SBUF_FRACTION

    res = _compile_where_schedules_fail(
        monkeypatch, lambda options: options.lookahead > 1000 and options.prefetch == PREFETCH_SBUF_FRACTION)
    tried = res.report["search"]["tried"]
    assert not any(t.get("failed") for t in tried)
    far = [t for t in tried if t["lookahead"] > 1000]
    assert far and all(t["prefetch"] == PREFETCH_SBUF_FRACTION / 2 for t in far)
    assert all("prefetch" not in t for t in tried if t["lookahead"] <= 1000)


def test_parallel_jobs_build_the_same_program(monkeypatch: pytest.MonkeyPatch) -> None:
    """--num-parallel-jobs builds a program's schedules in forked processes: the NEFF, the search and the
    latency are those of one job at a time, at -O2 and -O3 (every schedule shares one lowering). Two
    CPUs assumed, so that the jobs fork on any machine."""
    from nxsat import driver

    monkeypatch.setattr(driver, "_cpus", lambda: 2)
    forked = []
    real = driver._Jobs.run
    monkeypatch.setattr(driver._Jobs, "run", lambda self, *a: forked.append(self.jobs) or real(self, *a))

    path = str(DATA / "jax" / "convnet.hlo")
    for level in (2, 3):
        one, many = (driver.compile_model(path, driver.CompileOptions(target="trn1", optlevel=level,
                                                                      auto_cast="matmult", num_parallel_jobs=j))
                     for j in (1, 2))
        assert one.neff == many.neff
        assert one.report["search"] == many.report["search"] and len(one.report["search"]["tried"]) >= 3
        assert one.report["latency_us"] == many.report["latency_us"]
    assert 1 in forked and 2 in forked  # one job at a time, then two at once


def test_parallel_jobs_run_in_other_processes_and_only_the_fastest_is_finished() -> None:
    """The jobs run in forked processes (where the platform forks), their outcomes in order; a job's
    user-facing error comes back as the error, its stage times are added to the parent's. The fastest
    (the first on a tie) is finished by the process that measured it, from what that one kept; this
    process runs ``meanwhile`` while they work (one at a time, before them)."""
    import multiprocessing

    from nxsat import driver
    from nxsat.diagnostics import NxsatError, error
    from nxsat.progress import Progress

    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork on this platform: the jobs run one at a time")
    st = driver._Stages(None, Progress(enabled=False))
    latency = {0: 5.0, 1: 3.0, 2: 1.0, 3: 3.0, 4: 2.0}

    def job(k: int):  # noqa: ANN202
        st.run("schedule", lambda: None)
        if k == 2:
            raise error("NCC_EOOM001", "the working set does not fit on chip (test)")
        return driver.Outcome({"latency_ns": latency[k], "k": k, "pid": os.getpid()}, {}, []), (k, os.getpid())

    def finish(kept):  # noqa: ANN001, ANN202
        return kept, os.getpid()

    ran = []
    with driver._Jobs(st, job, finish, 2) as jobs:
        outs = jobs.run([0, 1, 2, 3], lambda: ran.append(os.getpid()))
        outs += jobs.run([4])
        assert [o.summary["k"] for o in outs if not isinstance(o, NxsatError)] == [0, 1, 3, 4]
        assert all(o.summary["pid"] != os.getpid() for o in outs if not isinstance(o, NxsatError))
        assert isinstance(outs[2], NxsatError) and outs[2].code == "NCC_EOOM001"
        assert jobs.fastest() == 4
        (k, measured_by), finished_by = jobs.finish(4)
        assert k == 4 and measured_by == finished_by == outs[4].summary["pid"]
    assert ran == [os.getpid()]
    assert "schedule" in st.seconds
    with driver._Jobs(st, job, finish, 1) as jobs:
        assert [(o.summary["k"], o.summary["pid"]) for o in jobs.run([0, 1, 3], lambda: ran.append(0))] == \
            [(k, os.getpid()) for k in (0, 1, 3)]
        assert jobs.fastest() == 1  # 1 and 3 tie: the first
        assert jobs.finish(1) == ((1, os.getpid()), os.getpid())
    assert ran == [os.getpid(), 0]  # one at a time in this process: meanwhile first


def test_a_program_too_large_to_compile_again_is_scheduled_once_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """Above SEARCH_MAX_INSTRUCTIONS, -O2 and -O3 schedule the program once, the default way, in this
    process (no worker forked for one schedule of a graph that may be gigabytes), and finish it as -O1
    does: the same NEFF as -O1's schedule of the same program would be, with the search reporting one."""
    from nxsat import driver

    monkeypatch.setattr(driver, "_cpus", lambda: 2)
    monkeypatch.setattr(driver, "SEARCH_MAX_INSTRUCTIONS", 10)
    forked = []
    real = driver._Jobs.run
    monkeypatch.setattr(driver._Jobs, "run", lambda self, *a: forked.append(self.jobs) or real(self, *a))
    for level in (2, 3):
        res = driver.compile_model(str(MLP), driver.CompileOptions(target="trn1", optlevel=level,
                                                                   num_parallel_jobs=2))
        tried = res.report["search"]["tried"]
        assert len(tried) == 1 and tried[0]["lookahead"] == 48 and res.neff
        assert res.report["latency_us"] == tried[0]["latency_us"]
    assert forked == [1, 1]


def test_a_forked_job_that_fails_unexpectedly_is_an_internal_error_naming_it() -> None:
    """A worker's exception that is not a user-facing error comes back as an internal error naming it, and
    the workers are stopped (killed: one may be busy) when the parent leaves on an exception."""
    import multiprocessing

    from nxsat import driver
    from nxsat.progress import Progress

    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork on this platform")
    st = driver._Stages(None, Progress(enabled=False))

    def job(k: int):  # noqa: ANN202
        if k == 1:
            return 1 // 0
        return driver.Outcome({"latency_ns": 1.0}, {}, []), None

    jobs = driver._Jobs(st, job, lambda kept: kept, 2)
    with pytest.raises(RuntimeError, match="in a forked job: ZeroDivisionError"), jobs:
        jobs.run([0, 1, 2, 3])
    assert jobs.workers == []


def test_a_process_killed_outright_is_said_to_be_the_hosts_memory() -> None:
    """A forked process that is killed (SIGKILL: the kernel's out-of-memory killer, most likely: mobilenet_v2's
    training step peaks near 20 GB) is a user-facing error naming the host's memory and
    ``--num-parallel-jobs 1``, whether it was a schedule's worker or the race check; killed by another
    signal, an internal error naming the signal."""
    import multiprocessing
    import signal

    from nxsat import driver
    from nxsat.diagnostics import NxsatError
    from nxsat.progress import Progress

    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork on this platform")
    st = driver._Stages(None, Progress(enabled=False))

    def job(k: int):  # noqa: ANN202
        os.kill(os.getpid(), signal.SIGKILL)

    jobs = driver._Jobs(st, job, lambda k: k, 2)
    with pytest.raises(NxsatError, match="killed .SIGKILL.*memory") as caught, jobs:
        jobs.run([0, 1])
    assert caught.value.code == "NCC_EOOM002" and "--num-parallel-jobs 1" in str(caught.value.hint)
    with pytest.raises(NxsatError, match="race check's process was killed"):
        driver._in_background(lambda: os.kill(os.getpid(), signal.SIGKILL))()
    with pytest.raises(RuntimeError, match="without a report .signal 15."):
        driver._in_background(lambda: os.kill(os.getpid(), signal.SIGTERM))()


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_race_in_the_compiled_program_is_refused_checked_beside_or_not(monkeypatch: pytest.MonkeyPatch,
                                                                         jobs: int) -> None:
    """The race check runs in a forked process beside the encoding and the simulation where a second CPU is
    free (two jobs), else before them: either way a program with a race (here: its semaphore waits dropped
    before linking) is refused with the verifier's error, and nothing is returned."""
    import dataclasses
    import multiprocessing

    from nxsat import driver
    from nxsat.diagnostics import NxsatError
    from nxsat.sim import verify

    if jobs > 1 and "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork on this platform: the race check runs in the link")
    monkeypatch.setattr(driver, "_cpus", lambda: 2)
    real, background = verify.link, driver._in_background
    beside = []

    def unsynchronized(prog, target, races=True):  # noqa: ANN001, ANN202
        prog = dataclasses.replace(prog, instrs=[dataclasses.replace(i, waits=()) for i in prog.instrs])
        return real(prog, target, races)

    monkeypatch.setattr(verify, "link", unsynchronized)
    monkeypatch.setattr(driver, "_in_background", lambda fn: beside.append(True) or background(fn))
    for level in (1, 2):  # -O2: the fastest schedule, finished in the worker that measured it
        with pytest.raises(NxsatError) as e:
            driver.compile_model(str(MLP), driver.CompileOptions(target="trn1", optlevel=level,
                                                                 num_parallel_jobs=jobs))
        assert e.value.code in ("NCC_EASM007", "NCC_EASM008"), e.value.format()
        if level == 1:  # (a worker's own calls are not seen here)
            assert beside == [True] * (jobs > 1)


def test_a_background_check_brings_back_what_it_raised() -> None:
    """``_in_background``: a user-facing error comes back as itself, any other as an internal error naming
    it, and a check that passes returns nothing; each runs in another process."""
    import multiprocessing

    from nxsat import driver
    from nxsat.diagnostics import NxsatError, error

    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork on this platform")
    parent = os.getpid()

    def coded() -> None:
        assert os.getpid() != parent
        raise error("NCC_EASM008", "race (test)")

    with pytest.raises(NxsatError, match="race"):
        driver._in_background(coded)()
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        driver._in_background(lambda: 1 // 0)()
    driver._in_background(lambda: None)()


DONATED = """HloModule donated, input_output_alias={ {0}: (0, {}, may-alias), {1}: (1, {}, may-alias) }

ENTRY main {
  w = f32[64,64] parameter(0)
  x = f32[64,64] parameter(1)
  y = f32[64,64] dot(w, x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT t = (f32[64,64], f32[64,64], f32[64,64]) tuple(w, y, w)
}
"""


def test_an_output_that_returns_its_donated_parameter_moves_nothing(tmp_path: Path) -> None:
    """input_output_alias: output 0 returns parameter 0, whose buffer the caller donated to it, so the NEFF
    declares it as that input (no copy, no compulsory bytes); output 1 aliases parameter 1 but is a new
    value (a separate buffer: may-alias allows it), and output 2 returns w without an alias (copied)."""
    from nxsat.driver import CompileOptions, compile_model

    src = tmp_path / "donated.hlo"
    src.write_text(DONATED)
    res = compile_model(str(src), CompileOptions())
    r, m = res.report, sim.load(res.neff, verify=True)
    outs = m.program.outputs()
    assert [t.alias for t in outs] == ["w", None, None]
    copies = [i for i in m.program.instrs if i.opcode == "dma" and i.operands[0].tensor == outs[2].name]
    assert len(copies) == 1 and not any(a.tensor == outs[0].name for i in m.program.instrs for a in i.operands)
    assert m.manifest["outputs"][0]["alias"] == "w" and "alias" not in m.manifest["outputs"][1]
    # compulsory: w and x read, outputs 1 and 2 written; output 0 is w's own buffer
    assert r["roofline"]["compulsory_hbm_bytes"] == 4 * 64 * 64 * 4
    rng = np.random.default_rng(0)
    w, x = rng.standard_normal((64, 64), np.float32), rng.standard_normal((64, 64), np.float32)
    got = m.run({"w": w, "x": x})
    np.testing.assert_array_equal(got[0], w)
    np.testing.assert_array_equal(got[2], w)
    np.testing.assert_allclose(got[1], w @ x, rtol=1e-5, atol=1e-4)


def test_a_forked_check_does_not_wait_for_an_e_graph_the_parent_left_as_garbage() -> None:
    """An e-graph that is garbage at the fork frees its tables through egglog's thread pool, which a forked
    process does not have: a child whose first garbage collection found one waited forever, and so did the
    compile for its report (the suite hung in the test above). What exists at the fork is frozen for the
    child (``driver._forking``). Run in a process of its own with a time limit: a regression hangs."""
    import signal

    code = """
import gc
from nxsat import driver
from nxsat.rules.egraph import eb

class Holder:
    pass

h = Holder()
h.me, h.eg = h, eb.EGraph()  # a cycle: only the collector frees it
del h
driver._in_background(gc.collect)()
print("reported")
"""
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the process and the child it waits for
        p.communicate()
        pytest.fail("the forked check never reported")
    assert p.returncode == 0 and out.strip() == "reported", err[-2000:]


def test_the_report_says_what_the_latency_is_made_of(tmp_path, capsys) -> None:
    """The compile report's critical path adds up to the latency and names the model's operators; the text
    report prints it."""
    from nxsat.driver import CompileOptions, compile_model, format_report

    r = compile_model(str(DATA / "jax" / "mlp.hlo"), CompileOptions()).report
    p = r["critical_path"]
    assert sum(p["by_engine_ns"].values()) == pytest.approx(r["latency_us"] * 1000, abs=0.5)  # us to 3 places
    assert p["steps"] > 1 and 0 < len(p["operators"]) <= 4
    text = (DATA / "jax" / "mlp.hlo").read_text()
    assert all(f"{o['operator']} = " in text for o in p["operators"] if o["operator"]), p["operators"]
    line = next(x for x in format_report(r).splitlines() if x.startswith("  critical path "))
    assert "%" in line and "longest" in line
