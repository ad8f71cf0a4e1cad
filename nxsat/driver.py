"""The compile driver: a model file in, a NEFF and its report out, through named stages.

Each stage is a step with a contract (``STAGES``), timed, shown on the progress line, and dumped to
``--workdir`` when asked, so a user can see what each step did:

    frontend      text -> IR; every instruction's shape checked            01-input.hlo
    canonicalize  calls inlined, conditionals if-converted, static loops unrolled   02-canonical.hlo
    saturate      the model type's rules (and at -O2/-O3 the precision set) in the e-graph,
                  bounded by the -O level                                            03-egraph.json
    extract       the program the extractor chooses by the device cost model: which
                  layout, which precision                                  04-extracted.hlo/04-extraction.json
    precision     --auto-cast as a policy where the extraction did not choose (-O1,
                  --precision policy): casts as explicit converts                    05-precision.hlo/.json
    partition     weights split across a logical core's physical cores where it pays  05-partition.hlo/.json
    device-forms  operators in the forms the backend tiles best (weight gradients as dots;
                  reshapes after elementwise chains; casts of constants at compile time;
                  constant dot operands K-major, constant kernels HWIO)              05-device-forms.hlo
    lower         operators -> an instruction graph on tiles                         06-lowered.json
    forward       loads of what a store just wrote from SBUF read it on chip; the
                  stores and scratch tensors left unread go                           06-forwarded.json
    schedule      streams, queues, SBUF/PSUM placement, semaphores                   07-program.nxs
    neff          the device program checked (placement, deadlock, accumulation) and
                  encoded                                                            (the output)
    simulate      the NEFF's program replayed on the timing model: latency          08-profile.json
    races         no race and no read before a write (beside the two above, forked, where
                  a second CPU is free; nothing is written before it passes)

``rules`` never imports later stages: the driver takes the saturated e-graph from
``rules.saturate_module`` and runs the extractor itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import json
import math
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import cache, partial
from pathlib import Path
from typing import Any, NamedTuple

from nxsat.collector import no_cycle_collection
from nxsat.diagnostics import NxsatError, Warnings, error
from nxsat.extract import EXTRACTORS
from nxsat.io import atomic_write
from nxsat.ir import Module, TensorType, restart_names
from nxsat.progress import Progress

AUTO_CAST = ("none", "matmult", "all")
AUTO_CAST_TYPES = ("bf16", "fp16", "tf32", "fp8_e4m3")
# -O3's search (docs/compiling.md): each candidate program (-O3's extraction, and -O2's when it differs)
# scheduled with the scheduler's load lookahead, half, twice and a hundred times it, then at the best of
# those with the weights' loads on queues of their own, and with -O2's streaming schedule; each simulated,
# the fastest kept. A program of more instructions than the limit is compiled once (mobilenet_v2's
# training step: minutes each). A hundred times: loads go ahead as far as the prefetch share of SBUF
# allows, so a model streaming its weights keeps streaming through each layer's attention and its start.
# -O2 measures four schedules of its program, the default and that streaming one (the weights on queues
# of their own), each in program order and in critical-path order, and keeps the fastest (measured: the
# streaming one, gemma3 under transformer 9,503.7 -> 8,868.8 us, BERT-12 2,238.3 -> 2,001.1; but resnet50
# 1,097.2 -> 1,102.1, attention_s2048 2,091.6 -> 2,121.7: not a default; critical-path order, gpt_decoder
# under transformer 58.5 -> 51.4 us, mha_block 18.1 -> 16.4, but resnet_small 45.3 -> 45.9 alone); and where
# the model's weights do not fit in the prefetch share and the streaming schedule ran with the whole of it,
# a fifth: it again with half the share
SEARCH_LOOKAHEAD_FACTORS = (1.0, 0.5, 2.0, 100.0)
SEARCH_WEIGHT_QUEUES = 8  # of the 12 load queues (measured: gemma3 9,503.7 -> 9,165.7 us; 4: 9,210.7, 6: 9,232.8)
SEARCH_MAX_INSTRUCTIONS = 200_000
SEARCH_ROOMS = (0.55, 0.7)  # -O3's shares of SBUF for loads ahead by the program's profile (ScheduleOptions.room)
# -O3's further prefetch shares for the streaming schedule in time, in program order (-O2's takes half of
# PREFETCH_SBUF_FRACTION): ResNet-50 under unet-inference, -O2's program, 584.1 us at 0.3, 582.8 at 0.4,
# 574.0 at 0.5, 594.9 at 0.6 (generic 646.9, 654.2, 664.8): no share wins everywhere, so -O3 measures them
SEARCH_TIMED_SHARES = (0.4, 0.5)
# The share of SBUF the converted weights stream through (ScheduleOptions.ring) in -O2's schedule in time
# with half the prefetch share; -O3 measures the others too. ResNet-50 at 0.35, 0.4, 0.45: 540.3, 532.7,
# 533.7 us under unet-inference, 602.6, 590.6, 610.3 generic (without a ring 563.4 and 640.2), when the
# weights were converted on an engine; converted by the DMA, generic 598.6 -> 567.0 with the ring and
# unet-inference 509.4 without it (512.2 with). How much SBUF the ring may take before the work's tiles no
# longer fit beside it is the model's, and the larger share wins up to there (ResNet-50 under unet-inference
# 509.5, 493.7, 473.4 us at 0.4, 0.5, 0.6, the work spilled at 0.62; generic 555.9 and 542.3 at 0.4 and 0.5,
# spilled at 0.55): -O2 measures two shares, -O3 two more. 0.4 was the fastest ring on none of the eleven
# models of bench/model_types.py under any of the three types (BERT-12 1,487.4, 1,487.4, 1,485.3 us at 0.4,
# 0.5, 0.6; gpt2_extract under transformer 219.2 and 248.2 at 0.4 and 0.5, where it keeps a schedule
# without a ring, 208.7)
RING_SHARES = (0.5, 0.6)
SEARCH_RINGS = (0.3, 0.4)  # -O3's further shares
# -O2 also measures -O1's program up to this size: a second build costs a few seconds there (gemma3_1b,
# 98k instructions, 36 -> 51 s of compile for a program 14% slower than -O2's)
LEVEL1_CHECK_INSTRUCTIONS = 50_000


@dataclass(frozen=True)
class Stage:
    name: str
    contract: str


STAGES = (
    Stage("frontend", "the model's text as IR, every instruction's shape checked"),
    Stage("canonicalize", "the same values, with no call, fusion or conditional, and static loops unrolled"),
    Stage("saturate", "an e-graph holding the program and everything the rules prove equal to it"),
    Stage("extract", "one program from the e-graph (the extractor's choice): its layouts and, at -O2/-O3, the "
          "precision of its dots and convolutions"),
    Stage("precision", "the --auto-cast policy where the extraction did not choose: casts as explicit converts, "
          "inputs and outputs kept"),
    Stage("partition", "the same values; weights whose split pays are sharded over the logical core's "
          "physical cores, their results joined by all-gathers or sharded outputs"),
    Stage("device-forms", "the same values; convolutions that are weight gradients (more taps than outputs) "
          "as one contraction per output position; elementwise chains read through a reshape computed "
          "before it; casts of constants done at compile time; constants only dots read stored with their "
          "contraction outermost, constant convolution kernels with their output channels innermost"),
    Stage("lower", "every operator as instructions on tiles, with their dependences"),
    Stage("forward", "the same program; a load of what a store just wrote from SBUF is an on-chip copy, and "
          "stores and scratch tensors nothing reads any more are gone"),
    Stage("schedule", "a device program: streams, queues, placed tiles, semaphores"),
    Stage("neff", "the device program checked (placement, no deadlock, accumulation groups, every output "
          "written) and encoded"),
    Stage("simulate", "the NEFF's program replayed on the timing model: latency, utilization, memory"),
    Stage("races", "the device program's happens-before order checked: no race, no read before a write (in a "
          "forked process beside the simulation where a second CPU is free; the time is the wait for it)"),
)


@dataclass
class CompileOptions:
    """The compile flags (docs/compiling.md)."""

    framework: str | None = None
    target: str = "trn1"
    model_type: str = "generic"
    auto_cast: str = "none"
    auto_cast_type: str = "bf16"
    mixed_precision_accumulation: bool = True
    saturate_infinity: bool = False
    optlevel: int = 2
    distribution_strategy: str | None = None
    lnc: int | None = None
    num_parallel_jobs: int = 8
    extractor: str | None = None
    # who decides the precision of TensorE operations at -O2/-O3: the extraction by cost (the precision
    # rule sets), or the policy pass (what -O1 always runs; the baseline the cost model must beat)
    precision: str = "cost"
    # channels-first convolution regions where the cost model prices them faster (the layout set; at -O2/-O3
    # the program with every convolution channels-first is measured against that choice), the model's own
    # layout, or every convolution channels-first
    layout: str = "cost"
    # loads of values still in SBUF read them there (backend/forward.py); off: every value goes through HBM
    forward: bool = True
    disabled_rules: tuple[str, ...] = ()  # rules left out of saturation (what one buys: nxsat rules stats --savings)
    workdir: str | None = None
    relay_constants: str | None = None
    fill_elided_constants: int | None = None  # a seed: elided constants get random values
    flags: tuple[str, ...] = ()  # the flags as given, recorded in the NEFF

    def check(self) -> None:
        if self.auto_cast not in AUTO_CAST:
            raise error("NCC_EARG002", f"--auto-cast {self.auto_cast}: one of {', '.join(AUTO_CAST)}")
        if self.auto_cast_type not in AUTO_CAST_TYPES:
            raise error("NCC_EARG002", f"--auto-cast-type {self.auto_cast_type}: one of {', '.join(AUTO_CAST_TYPES)}")
        if self.optlevel not in (1, 2, 3):
            raise error("NCC_EARG002", f"-O{self.optlevel}: the levels are 1, 2 and 3")
        if self.extractor is not None and self.extractor not in EXTRACTORS:
            raise error("NCC_EARG002", f"--extractor {self.extractor}: one of {', '.join(EXTRACTORS)}")
        if self.precision not in PRECISION_MODES:
            raise error("NCC_EARG002", f"--precision {self.precision}: one of {', '.join(PRECISION_MODES)}")
        if self.layout not in LAYOUT_MODES:
            raise error("NCC_EARG002", f"--layout {self.layout}: one of {', '.join(LAYOUT_MODES)}")
        if self.num_parallel_jobs < 1:
            raise error("NCC_EARG002", "--num-parallel-jobs must be at least 1")
        if self.disabled_rules:
            from nxsat.rules.catalog import catalog

            catalog().find(self.disabled_rules)  # NCC_ERUL003 with a suggestion for a misspelt name


@dataclass
class CompileResult:
    neff: bytes
    report: dict[str, Any]
    warnings: Warnings = field(default_factory=Warnings)
    model: Any = None  # with keep_model: the simulator's model of those bytes (sim.Model), not read back


class _Stages:
    """Runs stages: times each, shows it, dumps what it made when a workdir is given."""

    def __init__(self, workdir: str | None, progress: Progress) -> None:
        self.seconds: dict[str, float] = {}
        self.workdir = Path(workdir) if workdir else None
        self.progress = progress
        if self.workdir is not None:
            self.workdir.mkdir(parents=True, exist_ok=True)

    def run(self, name: str, fn: Callable[[], Any], label: str = "") -> Any:
        """Run stage ``name``; the progress line shows ``label`` when given (what makes it long)."""
        assert any(s.name == name for s in STAGES), name
        self.progress.stage(label or name)
        t0 = time.perf_counter()
        out = fn()
        self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - t0, 4)  # a retry adds
        return out

    def dump(self, filename: str, text: Callable[[], str | bytes] | str | bytes) -> None:
        """Write a stage's result into the workdir; ``text`` may be a function, called only then."""
        if self.workdir is not None:
            atomic_write(self.workdir / filename, text() if callable(text) else text)


def compile_model(path: str, opts: CompileOptions, progress: Progress | None = None,
                  keep_model: bool = False) -> CompileResult:
    """Compile the model at ``path`` for ``opts.target``: the NEFF bytes and the report, and with
    ``keep_model`` the simulator's model the NEFF stage built from the same program (to run it without
    parsing the bytes again: mobilenet_v2's take 45 s)."""
    from nxsat import sim
    from nxsat.backend import device_forms
    from nxsat.backend.partition import partition
    from nxsat.backend.precision import TENSOR_OPS, apply_precision
    from nxsat.backend.schedule import DEFAULT_SCHEDULE, LEVEL1_SCHEDULE, LOOKAHEAD, ScheduleOptions
    from nxsat.extract import ILP_SECONDS, LEVEL_EXTRACTOR, extract
    from nxsat.frontend import load
    from nxsat.modelinfo import model_info
    from nxsat.passes import canonicalize
    from nxsat.printer import to_hlo_text as print_module
    from nxsat.rules import saturate_module

    opts.check()
    restart_names()  # the nodes it makes named as in any other compile of this model
    if opts.target == "inf1":
        raise error("NCC_EARG002", "inf1 (NeuronCore-v1) models are compiled by neuron-cc, not neuronx-cc; nxsat "
                    "compiles for trn1, trn1n, inf2 and trn2", hint="nxsat assemble/run still take inf1 programs")
    target = sim.load_target(opts.target, opts.lnc)
    progress = progress or Progress(enabled=False)
    st = _Stages(opts.workdir, progress)
    warnings = Warnings()

    options: dict[str, Any] = {}
    if opts.relay_constants:
        options["relay_constants"] = opts.relay_constants
    module: Module = st.run("frontend", lambda: load(path, opts.framework, **options))
    if opts.fill_elided_constants is not None:
        from nxsat.passes import fill_elided_constants

        module = fill_elided_constants(module, opts.fill_elided_constants)
    warnings.extend(module.warnings)
    st.dump("01-input.hlo", lambda: print_module(module, large_constants=False))
    canonical = st.run("canonicalize", lambda: canonicalize(module))
    st.dump("02-canonical.hlo", lambda: print_module(canonical, large_constants=False))
    # -O2 and -O3 choose the precision of dots and convolutions by cost (a precision rule set) where the
    # auto-cast type has one; the policy pass does it otherwise (-O1, --precision policy, tf32)
    by_cost = precision_by_cost(opts)
    sat = st.run("saturate", lambda: saturate_module(canonical, opts.model_type, opts.optlevel, canonical=True,
                                                     allow_approximate=bool(by_cost), extra_sets=by_cost,
                                                     without=opts.disabled_rules + _left_out(opts, by_cost)))
    rep = sat.report
    sizes = sat.egraph.sizes()
    egraph = {"nodes": sizes.nodes, "classes": sizes.classes, "iterations": len(rep.iterations),
              "stop_reason": rep.stop_reason, "model_type_rules": _model_type_matches(opts.model_type, rep.matches)}
    st.dump("03-egraph.json", lambda: json.dumps({**egraph, "rules": rep.rules, "matches": rep.matches},
                                                 indent=1, sort_keys=True))
    extractor = opts.extractor or LEVEL_EXTRACTOR[opts.optlevel]
    cost = _cost_model(target, opts, by_cost)
    chosen = st.run("extract", lambda: extract(sat.egraph, sat.loaded, extractor, cost),
                    f"extract (exact ILP: up to {ILP_SECONDS:g} s)" if extractor == "ilp" else "")
    candidates = [(extractor, chosen, by_cost)]
    search = opts.optlevel == 3 and opts.extractor is None
    streaming = opts.optlevel == 2  # -O2 weighs the streaming schedule against the default one

    precise: dict[tuple[int, bool], tuple[Module, Any]] = {}  # by extraction and mode: applied once

    def precise_of(ch: Any, by: tuple[str, ...]) -> tuple[Module, Any]:
        """Extraction ``ch`` with its precision applied: chosen by cost (``by``: the precision sets the
        e-graph ran, whose casts it holds) or by the policy."""
        key = (id(ch), bool(by))
        if key not in precise:
            precise[key] = st.run("precision", lambda: apply_precision(
                ch.module, opts.auto_cast, opts.auto_cast_type, opts.mixed_precision_accumulation,
                opts.saturate_infinity, () if by else TENSOR_OPS))
        return precise[key]

    def level(n: int, layout: str | None = None) -> tuple[Any, tuple[str, ...]]:
        """Level ``n``'s extraction (its saturation budget, extractor and precision) of this model (with
        ``layout``: under that --layout)."""
        lo = dataclasses.replace(opts, optlevel=n, layout=layout or opts.layout)
        by = precision_by_cost(lo)
        sat_n = st.run("saturate", lambda: saturate_module(canonical, opts.model_type, n, canonical=True,
                                                           allow_approximate=bool(by), extra_sets=by,
                                                           without=opts.disabled_rules + _left_out(lo, by)))
        return st.run("extract", lambda: extract(sat_n.egraph, sat_n.loaded, LEVEL_EXTRACTOR[n],
                                                 _cost_model(target, lo, by))), by

    other = None
    if search:
        # -O3 also weighs -O2's program (its budget, its extractor), so it is never slower than -O2
        other, _ = level(2)
        if _structure(other.module) != _structure(chosen.module):
            candidates.append((f"-O2 ({LEVEL_EXTRACTOR[2]})", other, by_cost))

    def build(ch: Any, by: tuple[str, ...], plan: Plan | Any, to_beat: float = math.inf,
              meanwhile: Callable[[int], object] | None = None) -> list[tuple[Any, _Built | NxsatError]]:
        """The program of extraction ``ch`` (precision by cost with ``by``, else the policy's) scheduled
        as ``plan`` asks (or with the one ScheduleOptions ``plan`` is): the report's pieces of each schedule,
        or the error that stopped it, and the NEFF of the fastest where it is faster than ``to_beat``
        (``meanwhile``: work for this process while others run the schedules, given the lowered program's
        instructions)."""
        extracted = ch.module
        st.dump("04-extraction.json", lambda: json.dumps(ch.to_json(), indent=1))
        st.dump("04-extracted.hlo", lambda: print_module(extracted, large_constants=False))
        narrowed, prec = precise_of(ch, by)
        st.dump("05-precision.hlo", lambda: print_module(narrowed, large_constants=False))
        st.dump("05-precision.json", lambda: json.dumps({**prec.to_json(), "decisions": prec.decisions}, indent=1))
        parted, sharding = st.run("partition", lambda: partition(narrowed, target, matmul_precision(opts)))
        if sharding.ranks > 1:
            st.dump("05-partition.hlo", lambda: print_module(parted, large_constants=False))
            st.dump("05-partition.json", lambda: json.dumps(sharding.to_json(), indent=1))
        formed = st.run("device-forms", lambda: device_forms(parted, target))
        if formed is not parted:
            st.dump("05-device-forms.hlo", lambda: print_module(formed, large_constants=False))
        found = Warnings()
        # Lowering to the timing replay build millions of long-lived objects and no cyclic garbage (the
        # instruction graph's cycles are broken when it is dropped): the cycle collector stays paused until
        # they are freed. Its passes over them cost mobilenet_v2's compile about 20 s.
        with no_cycle_collection():
            outcomes = _backend(st, formed, target, opts, found, plan, keep_model, to_beat, meanwhile)
        return [(schedule, out if isinstance(out, NxsatError) else _Built(ch, prec, sharding, found, *out))
                for schedule, out in outcomes]

    # The schedules -O2 and -O3 measure (SEARCH_* above), each simulated; the fastest kept (the first on a tie).
    # The schedules of one program share its lowering, and those a plan asks for at once run in parallel.
    measured = search or streaming
    workdir, st.workdir = st.workdir, (None if measured else st.workdir)
    tried: list[dict[str, Any]] = []
    runs: list[tuple[Any, tuple[str, ...], Any]] = []  # (extraction, precision sets, schedule)
    best: _Built | None = None
    pick = 0

    def measure(name: str, ch: Any, by: tuple[str, ...], plan: Plan | Any,
                meanwhile: Callable[[int], object] | None = None) -> None:
        nonlocal best, pick
        if measured:
            progress.stage(f"search: {name}'s schedules")
        for schedule, built in build(ch, by, plan, best.summary["latency_ns"] if best else math.inf, meanwhile):
            runs.append((ch, by, schedule))
            if isinstance(built, NxsatError):
                # a schedule the search tries may not fit (loads far ahead holding SBUF the work at hand
                # needs: gemma3 generic at lookahead 4,800): skipped. The first schedule's failure is the
                # compile's.
                if best is None or built.code != "NCC_EOOM001":
                    raise built
                tried.append({"program": name, **schedule.to_json(), "latency_us": None, "failed": built.code,
                              "why": str(built.message)})
                continue
            lat = built.summary["latency_ns"]
            tried.append({"program": name, **built.summary["schedule"], "latency_us": round(lat / 1000, 3)})
            if best is None or lat < best.summary["latency_ns"]:
                best, pick = built, len(runs) - 1
        assert best is None or best.data is not None, "the fastest schedule is the one the backend finished"

    stream = ScheduleOptions(round(LOOKAHEAD * SEARCH_LOOKAHEAD_FACTORS[-1]), SEARCH_WEIGHT_QUEUES)
    windows = [DEFAULT_SCHEDULE] + [ScheduleOptions(round(LOOKAHEAD * f)) for f in SEARCH_LOOKAHEAD_FACTORS[1:]]
    # critical-path order, and the streaming one also in time (ScheduleOptions.timed): ResNet-50 769.4 ->
    # 706.1 us, mha_block under transformer 14.5 -> 11.3 (BERT-12 keeps the untimed one: 1,560.7 against 1,630.9)
    # and that one with the loads too taken longest chain first, and the clock counting the stalls the
    # simulator does (ScheduleOptions.loads_by_rank, .stalls): resnet_small under unet-inference 21.7 ->
    # 20.4 us, unet_diffusers 167.7 -> 167.1, unet_tiny 34.0 -> 33.8, transformer_layer generic 25.4 -> 25.2;
    # on the other models of bench/model_types.py and bench/zoo.py a schedule before it is as fast or faster
    by_rank = replace(stream, critical=True, timed=True, loads_by_rank=True, stalls=True)
    critical = [replace(DEFAULT_SCHEDULE, critical=True), replace(stream, critical=True),
                replace(stream, critical=True, timed=True), by_rank]
    # loads far ahead fill SBUF in program order, and the work at hand finds room later: resnet50 under
    # unet-inference streams in 709.8 us with half the share, 790.1 with the whole (BERT-12: 1,813.8 and 1,711.5)
    half_stream = replace(stream, prefetch=stream.prefetch / 2)
    # and in time, in program order: ResNet-50 under unet-inference 655.6 -> 632.6 us (in critical-path order
    # its tiles live longer: 670.9, 5.6 MB of spill)
    timed_half = replace(half_stream, timed=True)
    # -O3's: loads ahead while the program's SBUF up to their use stays within a share (ScheduleOptions.room):
    # ResNet-50 under unet-inference 656.7 us at -O2, 635.4 with 0.7 and 641.3 with 0.55 (its weights stream
    # during the stem); BERT-12 1,711.5 with the prefetch share, 1,723.3 and 1,787.6 with these
    rooms = [replace(stream, room=r) for r in SEARCH_ROOMS]
    shares = [replace(timed_half, prefetch=p) for p in SEARCH_TIMED_SHARES]
    # and with the weights it converts in a ring of their own (ResNet-50 generic 598.6 -> 567.0 us; RING_SHARES)
    rings = [replace(timed_half, ring=r) for r in RING_SHARES]
    more_rings = [replace(timed_half, ring=r) for r in SEARCH_RINGS]

    def streams_weights() -> bool:
        """The model's inputs and constants do not all fit in the prefetch share: what it holds ahead matters."""
        held = sum(p.type.nbytes for p in canonical.entry.params) + \
            sum(n.type.nbytes for n in canonical.entry.post_order() if n.op == "constant")
        return held > stream.prefetch * target.partitions * target.sbuf_bytes

    def streams_converted() -> bool:
        """As :func:`streams_weights`, and TensorE multiplies fp32 inputs or constants in a narrower type:
        weights the program converts as it loads them, which the ring takes (without them its schedule is
        the one without a ring; gemma3's fp32 constants are tables, its weights bf16)."""
        return streams_weights() and matmul_precision(opts) not in ("f32", "tf32") and any(
            _held(o).dtype.name == "f32" for n in canonical.entry.post_order() if n.op in ("dot", "convolution")
            for o in n.operands if _held(o) is not None)

    def search_plan(n: int, done: list[tuple[Any, Any]]) -> list[Any]:
        """-O3's: the load windows; then the weights apart at the best window and with every load far
        ahead (-O2's streaming schedules, with the whole and half the prefetch share, and its critical-path
        ones: -O3 is never slower than -O2; where the weights stream, by the program's profile and at more
        shares in time), the windows compared without the
        streaming one (BERT-12: 4,800 won without the weights apart, 2,034.7 us, and lost with them,
        2,001.1, to 24 with them, 1,991.7). A program too large to compile again: its default only."""
        if not done:
            return windows if n <= SEARCH_MAX_INSTRUCTIONS else [DEFAULT_SCHEDULE]
        if len(done) == len(windows):
            found_la = {s.lookahead: _latency(out) for s, out in done if s.lookahead != stream.lookahead}
            return [ScheduleOptions(min(found_la, key=lambda k: found_la[k]), SEARCH_WEIGHT_QUEUES), stream, *critical,
                    half_stream, timed_half, *(rooms + shares if streams_weights() else []),
                    *([*rings, *more_rings] if streams_converted() else [])]
        return []

    def streaming_plan(n: int, done: list[tuple[Any, Any]]) -> list[Any]:
        """-O2's: the default schedule, it and the streaming one in critical-path order, the streaming one
        also in time; then the streaming one in program order and, where the weights do not all fit in the
        prefetch share, with half of it in time and that one again with the converted weights in a ring of
        their own at two shares of SBUF (RING_SHARES): up to ten at once, on as many CPUs as there are.
        (The streaming one with half the share in program order won on none
        of the eleven models of bench/model_types.py in either family once the schedules in time were
        measured: -O3 still tries it; gemma3_1b under transformer keeps the streaming one in program order,
        7,973.9 us against 8,916.9 without it.)"""
        if done:
            return []
        if n > SEARCH_MAX_INSTRUCTIONS:
            return [DEFAULT_SCHEDULE]
        return [DEFAULT_SCHEDULE, *critical, stream, *([timed_half] if streams_weights() else []),
                *(rings if streams_converted() else [])]

    @cache
    def level1() -> tuple[Any, tuple[str, ...], frozenset[str]]:
        """-O1's extraction of this model, its precision sets and its program's structure, made once."""
        low, by1 = level(1)
        return low, by1, _structure(precise_of(low, by1)[0])

    def level1_meanwhile(n: int) -> None:
        """-O1's program, made while the first program's schedules run in other processes (BERT-12: 0.47 s
        that ran alone after them, the second core idle), where -O1's program will be weighed (the lowered
        program is small enough)."""
        if measured and opts.extractor is None and n <= LEVEL1_CHECK_INSTRUCTIONS:
            level1()

    measure(*candidates[0], search_plan if search else streaming_plan if streaming
            else DEFAULT_SCHEDULE if opts.optlevel >= 2 else LEVEL1_SCHEDULE,
            meanwhile=level1_meanwhile)
    assert best is not None
    again = best.summary["instructions"] <= SEARCH_MAX_INSTRUCTIONS  # small enough to compile again
    if search and again:
        for name, ch, by in candidates[1:]:
            measure(name, ch, by, search_plan)
    if measured and again and opts.layout == "cost":
        # The layout the cost model chose for a convolution region is weighed against every convolution
        # channels-first, measured: the model prices each convolution in either layout, but not what its
        # layout costs the operators after it (a per-channel scale along the free axis is a two-input
        # VectorE pass, not a step of the evacuation). ResNet-50: three stage-1 convolutions kept
        # channels-last, 697.6 us; all channels-first 656.7. unet_diffusers: the reverse, 170.2 against 347.6.
        # -O3 weighs -O2's channels-first program too (so it is never slower than -O2).
        first = dataclasses.replace(opts, layout="channels-first")

        def fastest_two(n: int, done: list[tuple[Any, Any]]) -> list[Any]:
            """-O2's two fastest schedules of the programs measured so far, at once: which of them suits
            the channels-first program varies with the program (ResNet-50 under transformer, with a
            lowering order tried on the way to HOIST's: its dag program's fastest schedule, in
            critical-path order, 732.8 us channels-first; the next, in program order with half the
            share, 669.2, where generic's 664.2)."""
            if done:
                return []
            seen: list[Any] = []
            for _, k in sorted((t["latency_us"], k) for k, t in enumerate(tried) if t["latency_us"] is not None):
                if runs[k][2] not in seen:
                    seen.append(runs[k][2])
            return seen[:2]
        seen = {_structure(ch.module) for _, ch, _ in candidates}
        firsts = [lambda: extract(sat.egraph, sat.loaded, extractor, _cost_model(target, first, by_cost))] \
            if _channels_last_convolutions(chosen.module) else []
        if other is not None and _channels_last_convolutions(other.module):
            firsts.append(lambda: level(2, "channels-first")[0])
        for make in firsts:
            ch = st.run("extract", make)
            if _structure(ch.module) not in seen:
                seen.add(_structure(ch.module))
                measure(CHANNELS_FIRST, ch, by_cost, search_plan if search else fastest_two)
    if measured and again and opts.extractor is None and best.summary["instructions"] <= LEVEL1_CHECK_INSTRUCTIONS:
        # -O1's program too (its budget, its extractor, the policy's precision) where it differs, as -O1
        # schedules it: -O2 is then never slower than -O1 (unet_diffusers: -O1's program 327.784 us,
        # -O2's own 327.841), and -O3, which weighs every program -O2 does, never slower than -O2
        # (unet_diffusers: -O2 kept -O1's program, 324.6 us, where -O3's own were 324.7); and as -O2
        # schedules it, writing in place, at once: Relay's ResNet-50 407.4 -> 397.6 us
        low, by1, theirs = level1()
        mine = {_structure(precise_of(ch, by)[0]) for _, ch, by in candidates}
        if theirs not in mine:
            measure(f"-O1 ({LEVEL_EXTRACTOR[1]})", low, by1, lambda n, done: [] if done else
                    [LEVEL1_SCHEDULE, DEFAULT_SCHEDULE])
    st.workdir = workdir
    if measured and workdir is not None:  # the dumps are the chosen program's
        best = build(*runs[pick])[0][1]
        if isinstance(best, NxsatError):
            raise best
    chosen, prec, sharding, found, summary, constants, io, data, model = best
    best = None
    warnings.extend(found)
    extracted = chosen.module
    info = model_info(canonical)
    report = _report(opts, target, info, summary, st.seconds, egraph, prec, io, constants, extracted)
    report["extraction"] = chosen.to_json()
    # who chose the precision: the kept program's (-O1's, kept at -O2, had the policy's)
    report["decisions"] = _decisions(opts, runs[pick][1], canonical, extracted, chosen.casts)
    if tried and tried[pick]["program"] == CHANNELS_FIRST:
        report["decisions"]["layout"] = "measured"
    report["sharding"] = sharding.to_json()
    if measured:
        report["search"] = {"tried": tried, "chosen": pick, "limit_instructions": SEARCH_MAX_INSTRUCTIONS}
    return CompileResult(data, report, warnings, model)


class _Built(NamedTuple):
    """One candidate program compiled and simulated: what the report and the NEFF are made of."""

    chosen: Any  # the extraction (extract.Extraction)
    prec: Any
    sharding: Any
    warnings: Warnings
    summary: dict[str, Any]
    constants: dict[str, Any]
    io: list[tuple[int, int | None]]
    data: bytes | None  # None: a schedule slower than one measured before, never finished
    model: Any


class Outcome(NamedTuple):
    """One schedule of a lowered program, measured; its NEFF bytes and the simulator's model only where it
    was finished (the fastest, where it beat the others)."""

    summary: dict[str, Any]  # the timing summary
    constants: dict[str, Any]
    io: list[tuple[int, int | None]]  # the I/O sizes the roofline counts
    data: bytes | None = None
    model: Any = None


# (the lowered graph's instructions, the schedules measured so far) -> the next ones to measure (none: done)
Plan = Callable[[int, list[tuple[Any, "Outcome | NxsatError"]]], list[Any]]
# a measured schedule and what finishing it needs (its linked program and constants): (outcome, kept)
Measured = tuple[Outcome, Any]


def _backend(st: _Stages, formed: Module, target: Any, opts: CompileOptions, warnings: Warnings,
             plan: Plan | Any, keep_model: bool = False, to_beat: float = math.inf,
             meanwhile: Callable[[int], object] | None = None) -> list[tuple[Any, Outcome | NxsatError]]:
    """Lower once, then schedule, link and replay in time each schedule ``plan`` asks for (or the one
    schedule ``plan`` is): the timing summary, constants and I/O sizes of each. The fastest (the first on
    a tie), where it is faster than ``to_beat``, is then finished: its race check and its NEFF bytes (and
    with ``keep_model`` the simulator's model); the others' bytes are never made. The schedules of a batch
    are independent: up to ``--num-parallel-jobs`` run at once, each in a process forked from the lowered
    graph (the same program, byte for byte, as one at a time), which keeps what it measured until the
    fastest is known; this process runs ``meanwhile`` of the lowered graph's instructions (before them where
    none fork)."""
    from nxsat.backend import Options, graph_summary, lower_graph, schedule_graph
    from nxsat.backend.forward import BUDGETS as FORWARD_BUDGETS
    from nxsat.backend.forward import Forwarded, forward_stores
    from nxsat.sim.critical import path_summary
    from nxsat.sim.report import summarize
    from nxsat.sim.runtime import encode
    from nxsat.sim.timing import simulate
    from nxsat.sim.verify import check_races, link

    options = Options(opts.mixed_precision_accumulation, opts.saturate_infinity)
    lowering = st.run("lower", lambda: lower_graph(formed, target, options))
    warnings.extend(lowering.warnings)
    st.dump("06-lowered.json", lambda: json.dumps(graph_summary(lowering.graph), indent=1, sort_keys=True))
    gathered = _gathered_fraction(formed)
    budgets = FORWARD_BUDGETS if opts.forward else (0.0,)
    # Forwarding keeps tiles live longer; where the scheduler, ordering differently, then finds no room, the
    # pass is undone and run again within a smaller budget, and at last not at all. Every schedule starts
    # from the graph forwarded within the first budget.
    # the pass's outcome, and the budget (and whether it wrote in place) the graph is forwarded within
    forwarded, within = Forwarded(), None

    def forward_within(budget: float, in_place: bool) -> None:
        nonlocal forwarded, within
        if within == (budget, in_place):
            return
        if forwarded.undo is not None:
            forwarded.undo()
        forwarded = st.run("forward", partial(forward_stores, lowering.graph, target, budget,
                                              write_in_place=in_place)) if budget \
            else Forwarded(refused=forwarded.loads + forwarded.refused)
        within = (budget, in_place)
        st.dump("06-forwarded.json", lambda: json.dumps(forwarded.to_json(), indent=1))

    single = not callable(plan)
    if single:
        plan = partial(_once, plan)
    # the race check (more than half of the NEFF stage's time on BERT) runs beside the encoding (and, where
    # the schedule is finished at once, the simulation) where a second CPU is free
    beside = opts.num_parallel_jobs > 1 and _cpus() > 1 and _can_fork()

    def checked(linked: Any) -> Callable[[], None]:
        """Start the race check of ``linked``; the function returned waits for it (raising what it found)."""
        if beside:
            return _in_background(partial(check_races, linked))
        st.run("races", partial(check_races, linked))
        return lambda: None

    def finish(kept: Any, run: Callable[[], dict[str, Any]] | None = None) -> tuple[bytes, Any, Any]:
        """The race check and the NEFF bytes of a linked program (and ``run``'s summary, made meanwhile)."""
        linked, constants = kept
        races = checked(linked)
        try:
            data, model = st.run("neff", lambda: encode(linked, constants))
            summary = run() if run is not None else None
        finally:  # a race is what is wrong first: its error wins over the simulation's
            st.run("races", races)
        st.dump("07-program.nxs", lambda: model.text)
        return data, model if keep_model else None, summary

    def one(schedule: Any, now: bool) -> Measured:
        # A schedule that finds no room tries again within the smaller forwarding budgets, then (loads issued
        # far ahead hold SBUF the work at hand may need) with half the prefetch share
        compiled, failed = None, None
        # a schedule by the profile that finds no room is one the search does without (its fragmented SBUF is
        # not the prefetch share's to halve, and without forwarding it would only lose)
        for sched in (schedule,) if schedule.room else (schedule, replace(schedule, prefetch=schedule.prefetch / 2)):
            for budget in budgets[:1] if schedule.room else budgets:
                forward_within(budget, schedule.write_in_place)
                try:
                    compiled = st.run("schedule", partial(schedule_graph, lowering, target, opts.flags, sched))
                    break
                except NxsatError as e:
                    if e.code != "NCC_EOOM001":
                        raise
                    failed = e
                    if not forwarded.loads:
                        break
            if compiled is not None:
                break
        if compiled is None:
            assert failed is not None
            raise failed
        program, constants = compiled.program, compiled.constants
        # Compulsory traffic: what the program must read of each input it reads (none of one it only
        # returns through input_output_alias) and every output it writes (an alias is written by nobody).
        io = [(int(b.nbytes * gathered.get(i, 1.0)) if b.users else 0, b.shard)
              for i, b in enumerate(compiled.inputs)] \
            + [(0 if b.alias else b.nbytes, b.shard) for b in compiled.outputs]
        forwarding = forwarded.to_json() if opts.forward else None
        compiled = None
        if single:  # freed now, not after the NEFF and the simulation (mobilenet_v2's graph is gigabytes)
            lowering.graph.release()
        linked = st.run("neff", lambda: link(program, target, races=False))
        program = None

        def run() -> dict[str, Any]:
            def measured() -> dict[str, Any]:
                tl = simulate(linked)
                return {**summarize(linked, tl), "critical_path": path_summary(linked, tl, CRITICAL_TOP)}
            return st.run("simulate", measured)
        data, model = None, None
        if now:  # the one schedule, finished whatever it measures: the simulation runs beside the race check
            data, model, summary = finish((linked, constants), run)
        else:
            summary = run()
        summary["forwarded"] = forwarding
        summary["schedule"] = sched.to_json()  # as run: its prefetch share may be the halved one
        st.dump("08-profile.json", lambda: json.dumps(summary, indent=1))
        return Outcome(summary, constants, io, data, model), (linked, constants)

    done: list[tuple[Any, Outcome | NxsatError]] = []
    n = len(lowering.graph.insts)
    batch = plan(n, done)
    # one schedule (-O1's, or a program too large to compile again) is finished as it is measured, here
    now = to_beat == math.inf and len(batch) == 1
    jobs = 1 if keep_model or len(batch) == 1 else min(opts.num_parallel_jobs, _cpus())
    with _Jobs(st, partial(one, now=now), lambda kept: finish(kept)[:2], jobs) as pool:
        while batch:
            # what each schedule starts from (and what a forked job copies)
            forward_within(budgets[0], batch[0].write_in_place)
            done.extend(zip(batch, pool.run(batch, meanwhile and partial(meanwhile, n))))
            meanwhile = None
            batch = plan(n, done)
        k = pool.fastest()
        fastest = done[k][1] if k is not None else None
        if isinstance(fastest, Outcome) and fastest.data is None and fastest.summary["latency_ns"] < to_beat:
            data, model = pool.finish(k)
            done[k] = (done[k][0], fastest._replace(data=data, model=model))
    lowering.graph.release()
    return done


def _latency(out: Outcome | NxsatError) -> float:
    return math.inf if isinstance(out, NxsatError) else out.summary["latency_ns"]


def _once(schedule: Any, n: int, done: list[Any]) -> list[Any]:
    """The plan of a program scheduled one way."""
    return [] if done else [schedule]


class _Jobs:
    """Runs ``measure`` on each item of the batches it is given, in order: a user-facing error is the item's
    outcome (the caller decides whether it stops the compile). With ``jobs`` > 1 (where the platform
    forks), in that many worker processes forked from this one as it is at the first batch; their stage
    times are added to this one's. Whoever measured an item keeps what ``finish`` needs of it while it is
    the fastest that one measured (the first on a tie), so that the fastest of all is finished by the
    process that holds it, and the rest are never finished (BERT-12 at -O2: five race checks and NEFF
    encodings of six saved)."""

    def __init__(self, st: _Stages, measure: Callable[[Any], Measured], finish: Callable[[Any], Any],
                 jobs: int) -> None:
        self.st, self.measure, self.finish_fn = st, measure, finish
        self.jobs = jobs if jobs > 1 and _can_fork() else 1
        self.latencies: list[float] = []  # of every item so far, in order
        self.where: list[int] = []  # the worker that measured each item (-1: this process)
        self.kept: tuple[float, int, Any] | None = None  # this process's fastest: (latency, item, kept)
        self.workers: list[tuple[Any, Any]] = []  # (process, connection)

    def __enter__(self) -> _Jobs:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        for proc, conn in self.workers:
            if kind is None:
                with contextlib.suppress(OSError):  # one that died has said so (EOFError) already
                    conn.send(None)
            else:  # a worker may be busy, and blocked sending what nobody will read
                proc.kill()
            conn.close()
            proc.join()
        self.workers = []

    def _keep(self, out: Measured | NxsatError, k: int) -> Outcome | NxsatError:
        if isinstance(out, NxsatError):
            self.latencies.append(math.inf)
            return out
        outcome, kept = out
        lat = _latency(outcome)
        self.latencies.append(lat)
        if self.kept is None or lat < self.kept[0]:
            self.kept = (lat, k, kept)
        return outcome

    def _serve(self, conn: Any) -> None:
        """A worker: measure items and finish the one asked for until told to stop."""
        self.st.seconds, self.st.progress = {}, Progress(enabled=False)
        while (msg := conn.recv()) is not None:
            what, k, item = msg
            self.st.seconds = {}
            try:
                if what == "measure":
                    reply: Any = self._keep(_attempt(self.measure, item), k)
                else:
                    assert self.kept is not None and self.kept[1] == k
                    reply = self.finish_fn(self.kept[2])
            except NxsatError as e:
                reply = e
            except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises it
                reply = RuntimeError(f"in a forked job: {type(e).__name__}: {e}")
            conn.send((reply, self.st.seconds))

    def _ask(self, w: int, msg: tuple[str, int, Any]) -> None:
        self.workers[w][1].send(msg)

    def _answer(self, w: int) -> Any:
        try:
            reply, seconds = self.workers[w][1].recv()
        except EOFError:
            proc = self.workers[w][0]
            proc.join(5)
            code = proc.exitcode
            raise _ended("a forked schedule's process", -code if code is not None and code < 0 else None) from None
        for name, v in seconds.items():
            self.st.seconds[name] = round(self.st.seconds.get(name, 0.0) + v, 4)
        if isinstance(reply, RuntimeError):
            raise reply
        return reply

    def run(self, batch: list[Any], meanwhile: Callable[[], object] | None = None) -> list[Outcome | NxsatError]:
        """The outcomes of ``batch``, and ``meanwhile`` run in this process: while workers run them, or
        first (what it makes is made at the same point of the compile either way: the same bytes)."""
        first = len(self.latencies)
        if self.jobs <= 1:
            if meanwhile is not None:
                meanwhile()
            out = []
            for item in batch:
                self.where.append(-1)
                out.append(self._keep(_attempt(self.measure, item), len(self.latencies)))
            return out
        if not self.workers:
            ctx = multiprocessing.get_context("fork")
            with _forking():
                for _ in range(self.jobs):
                    mine, theirs = ctx.Pipe()
                    proc = ctx.Process(target=self._serve, args=(theirs,), daemon=True)
                    proc.start()
                    theirs.close()
                    self.workers.append((proc, mine))
        got: dict[int, Outcome | NxsatError] = {}
        busy: dict[Any, tuple[int, int]] = {}  # connection -> (worker, item)
        todo = list(range(len(batch)))
        self.where.extend([-1] * len(batch))
        while todo or busy:
            for w, (_, conn) in enumerate(self.workers):
                if todo and conn not in busy:
                    j = todo.pop(0)
                    self._ask(w, ("measure", first + j, batch[j]))
                    busy[conn] = (w, j)
            if meanwhile is not None:
                meanwhile()
                meanwhile = None
            for conn in multiprocessing.connection.wait(list(busy)):
                w, j = busy.pop(conn)
                got[j] = self._answer(w)
                self.where[first + j] = w
        out = [got[j] for j in range(len(batch))]
        self.latencies.extend(_latency(o) for o in out)
        return out

    def fastest(self) -> int | None:
        """The item measured fastest (the first on a tie), or None where every one failed."""
        best = min(range(len(self.latencies)), key=lambda k: (self.latencies[k], k), default=None)
        return None if best is None or self.latencies[best] == math.inf else best

    def finish(self, k: int) -> Any:
        """``finish`` of what item ``k``'s process kept of it."""
        w = self.where[k]
        if w < 0:
            assert self.kept is not None and self.kept[1] == k
            return self.finish_fn(self.kept[2])
        self._ask(w, ("finish", k, None))
        reply = self._answer(w)
        if isinstance(reply, NxsatError):
            raise reply
        return reply


def _attempt(fn: Callable[[Any], Any], item: Any) -> Any:
    try:
        return fn(item)
    except NxsatError as e:
        return e


def _can_fork() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


@contextlib.contextmanager
def _forking() -> Iterator[None]:
    """Python 3.12+ warns that a process with threads (egglog's, BLAS's) may deadlock when forked: the
    children run only the backend and the simulator (Python and numpy), not the threads' libraries. Nor
    may a child free what the parent made: an e-graph that is garbage by then frees its tables through
    egglog's thread pool, whose threads a forked process does not have, and waits for them forever (a
    child's first garbage collection did, in the test suite: the race check's process never reported).
    What exists at the fork is frozen (``gc.freeze``): the child's collections leave it alone; the
    parent's resume once the child is started."""
    parent = os.getpid()
    gc.freeze()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*fork\(\) may lead to deadlocks",
                                    category=DeprecationWarning)
            yield
    finally:
        if os.getpid() == parent:  # a child forked inside the block leaves it too
            gc.unfreeze()


def _in_background(fn: Callable[[], None]) -> Callable[[], None]:
    """Start ``fn`` in a forked process (it sees this one's memory as it is now); the function returned
    waits for it and raises what it raised (a user-facing error as it was, anything else as an internal
    error naming it)."""
    r, w = os.pipe()
    with _forking():
        pid = os.fork()
    if pid == 0:  # the child: run, report, and leave without this process's exit handlers or buffers
        code = 0
        try:
            os.close(r)
            try:
                fn()
                out: BaseException | None = None
            except NxsatError as e:
                out = e
            except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises it
                out = RuntimeError(f"in a background check: {type(e).__name__}: {e}")
            with os.fdopen(w, "wb") as f:
                f.write(pickle.dumps(out))
        except BaseException:  # noqa: BLE001 - the parent sees no report and says so
            code = 1
        finally:
            os._exit(code)
    os.close(w)

    def join() -> None:
        with os.fdopen(r, "rb") as f:
            data = f.read()
        _, status = os.waitpid(pid, 0)
        out = pickle.loads(data) if data else \
            _ended("the race check's process", os.WTERMSIG(status) if os.WIFSIGNALED(status) else None)
        if out is not None:
            raise out

    return join


def _ended(what: str, signal_number: int | None) -> Exception:
    """Why a forked process gave no report. Killed outright (SIGKILL: on Linux, most likely the kernel's
    out-of-memory killer; mobilenet_v2's training step peaks near 20 GB) is the host's limit, a user-facing
    error that says what to do; anything else is an internal error."""
    if signal_number == signal.SIGKILL:
        return error("NCC_EOOM002", f"{what} was killed (SIGKILL): the host most likely ran out of memory",
                     hint="--num-parallel-jobs 1 keeps one copy of the program in memory; or a host with more")
    return RuntimeError(f"{what} ended without a report" + (f" (signal {signal_number})" if signal_number else ""))


def _cpus() -> int:
    """The CPUs this process may run on (a container's share, not the host's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity on this platform
        return os.cpu_count() or 1


def _structure(module: Module) -> frozenset[str]:
    """The distinct values of ``module`` by content (operator, type, attributes by the e-graph's
    ``Fingerprints``, operands' keys): two extractions of one program, whatever their names, instruction
    order or a constant written twice, have the same set."""
    from nxsat.rules.egraph import Fingerprints

    fp = Fingerprints()
    key: dict[int, str] = {}
    for n in module.entry.post_order():
        text = f"{n.op}|{n.type}|{fp.of(n.attrs)}|{','.join(key[o.id] for o in n.operands)}"
        key[n.id] = hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
    return frozenset(key.values())


def _gathered_fraction(module: Module) -> dict[int, float]:
    """Parameter index -> the part of it the program must read, for a table that only gathers read (an
    embedding: BERT reads 128 of its 30,522 rows); the roofline's compulsory bytes count that part."""
    readers: dict[int, list[Any]] = {}
    for n in module.entry.post_order():
        for o in n.operands:
            if o.op == "parameter":
                readers.setdefault(o.id, []).append(n)
    out: dict[int, float] = {}
    for i, p in enumerate(module.entry.params):
        rs = readers.get(p.id, [])
        if rs and p.tensor.size and all(n.op == "gather" and n.operands[0] is p and n.operands[1] is not p for n in rs):
            out[i] = min(1.0, sum(n.tensor.size for n in rs) / p.tensor.size)
    return out


def _cost_model(target: Any, opts: CompileOptions, by_cost: tuple[str, ...]) -> Any:
    """The extraction's cost model: TensorE in the policy's type, or (precision by cost) in the type of
    the casts a dot absorbs, its weights' loads and casts issued ahead of it (``in_program``)."""
    from nxsat.extract.cost import CostModel

    first = opts.layout == "channels-first"
    if by_cost:
        return CostModel(target, "f32", in_program=True, channels_first=first)
    return CostModel(target, matmul_precision(opts), channels_first=first)


# --auto-cast-type -> the precision rule set that offers dots and convolutions in that type. tf32 has none:
# TensorE's tf32 mode rounds the operands as it loads them, at no cost and at bf16's rate, so there is
# nothing for the cost model to weigh. fp8_e4m3 has none either: with 4 significant bits a sum of products
# that cancels keeps almost nothing, so no bound tells a sound rule from a wrong one (the checker found
# 0.03 against 2.2 on a three-tap convolution); the policy casts every fp32 operand, as the user asked.
PRECISION_SETS = {"bf16": "precision-bf16", "fp16": "precision-fp16"}
PRECISION_MODES = ("cost", "policy")
LAYOUT_MODES = ("cost", "input", "channels-first")


def precision_by_cost(opts: CompileOptions) -> tuple[str, ...]:
    """The precision rule sets the e-graph runs: at -O2 and -O3 (unless ``--precision policy``), under
    ``--auto-cast matmult`` or ``all`` and a type that has one, the extraction chooses each TensorE
    operation's precision by cost (docs/extraction.md); elementwise operations under ``all`` stay the
    policy's."""
    name = PRECISION_SETS.get(opts.auto_cast_type)
    return (name,) if (opts.precision == "cost" and name and opts.auto_cast != "none" and opts.optlevel >= 2) else ()


def _left_out(opts: CompileOptions, by_cost: tuple[str, ...]) -> tuple[str, ...]:
    """The rules a compilation leaves out beyond ``--disable-rule``: with ``--layout input`` the layout set's
    (the model's own layout is kept), and the approximate rules of any set but the precision set that
    runs (``--auto-cast`` permits the precision of TensorE operations, nothing else)."""
    from nxsat.rules.catalog import APPROXIMATE, catalog

    cat = catalog()
    out = [r.name for r in cat.set_rules(("layout",))] if opts.layout == "input" else []
    out += [r.name for r in cat.rules if r.tag == APPROXIMATE and r.set not in by_cost]
    return tuple(out)


def matmul_precision(opts: CompileOptions) -> str:
    """The type TensorE operations run in under the --auto-cast flags."""
    if opts.auto_cast == "none":
        return "f32"
    return {"bf16": "bf16", "fp16": "f16", "tf32": "tf32", "fp8_e4m3": "f8e4m3fn"}[opts.auto_cast_type]


SHARED_SETS = ("generic", "layout")  # the sets every model type runs


def _model_type_matches(model_type: str, matches: dict[str, int]) -> dict[str, int]:
    """How often each rule of the model type's own sets (beyond generic) matched: what --model-type did."""
    from nxsat.rules.catalog import catalog

    cat = catalog()
    own = {r.name for r in cat.set_rules([s for s in cat.sets_for(model_type) if s not in SHARED_SETS])}
    return {k: v for k, v in sorted(matches.items()) if k in own and v}


def _report(opts: CompileOptions, target: Any, info: Any, summary: dict[str, Any], seconds: dict[str, float],
            egraph: dict[str, Any], prec: Any, io: list[tuple[int, int | None]], constants: dict[str, Any],
            module: Module) -> dict[str, Any]:
    """The compile report (docs/compiling.md lists the fields)."""
    flops = sum(info.flops.get(k, 0) for k in ("dot", "convolution"))
    from nxsat.sim.target import physical_cores

    # The logical core's ideal: every physical core's TensorE and DMA engines busy on the model, its
    # FLOPs in the types TensorE runs them in (the program's split: a bf16 model compiled with
    # --auto-cast none multiplies in bf16, not in the flag's fp32)
    cores = physical_cores(target)
    split = {p: f for p, f in summary["flops"].items() if f and target.peak_flops(p)}
    if not split:
        mt = matmul_precision(opts)
        split = {mt if target.supports_matmul_dtype(mt) else "f32": 1}
    matmul_type = max(split, key=lambda p: (split[p], p))
    share = sum(split.values())
    io_bytes = sum(nbytes * (cores if shard is not None else 1) for nbytes, shard in io) \
        + sum(int(v.nbytes) for v in constants.values())
    compute_ns = sum(flops * f / share / (cores * target.peak_flops(p)) for p, f in split.items())
    memory_ns = io_bytes / (cores * target.memory_bw)
    roof = max(compute_ns, memory_ns)
    lat = summary["latency_ns"]
    engines = {k: e["utilization"] for k, e in summary["engines"].items()}
    from nxsat.ops.fused import FUSED

    fused: dict[str, int] = {}
    for n in module.entry.post_order():
        if n.op in FUSED:
            fused[n.op] = fused.get(n.op, 0) + 1
    return {
        "model": module.name, "target": target.name, "lnc": target.lnc, "optlevel": opts.optlevel,
        "model_type": opts.model_type, "auto_cast": opts.auto_cast, "auto_cast_type": opts.auto_cast_type,
        "latency_us": round(lat / 1000, 3),
        "roofline_us": round(roof / 1000, 3),
        "roofline": {"compute_us": round(compute_ns / 1000, 3), "memory_us": round(memory_ns / 1000, 3),
                     "bound": "compute" if compute_ns >= memory_ns else "memory", "flops": flops,
                     "matmul_precision": matmul_type, "compulsory_hbm_bytes": io_bytes, "cores": cores},
        "latency_over_roofline": round(lat / roof, 3) if roof else None,
        "dma_work_us": round(summary["dma"]["work_ns"] / 1000, 3),
        "stages": seconds,
        "egraph": egraph,
        "precision": prec.to_json(),
        "engines": engines,
        "instructions": summary["instructions"],
        "hbm_bytes": summary["hbm"]["bytes"],
        "spill_bytes": summary["spill_bytes"],
        "sbuf_peak_bytes": summary["sbuf"]["peak_bytes"],
        "psum_peak_bytes": summary["psum"]["peak_bytes"],
        "mfu": summary["mfu"],
        "overlap": summary["overlap"],
        "forwarded": summary["forwarded"],
        "critical_path": summary["critical_path"],
        "distribution_strategy": opts.distribution_strategy,
        "fused": dict(sorted(fused.items())),
    }


CHANNELS_FIRST = "channels-first"  # the name of the program with every convolution channels-first, when measured


def _channels_last_convolutions(m: Module) -> int:
    """The convolutions of ``m`` that write their result channels-last (the model's layout kept)."""
    return sum(1 for n in m.entry.post_order() if n.op == "convolution" and len(n.shape) >= 3
               and n.attrs["dims"].output_feature == len(n.shape) - 1)


def _decisions(opts: CompileOptions, by_cost: tuple[str, ...], before: Module, after: Module,
               casts: list[dict[str, Any]]) -> dict[str, Any]:
    """Who chose the precision of TensorE operations and the convolutions' layouts, and what was chosen
    (the choices themselves, with both prices: ``extraction.casts``)."""
    def cf(m: Module) -> int:
        return sum(1 for n in m.entry.post_order() if n.op == "convolution" and n.attrs["dims"].output_feature == 1
                   and n.attrs["dims"].output_batch == 0 and len(n.shape) >= 3)

    convs = sum(1 for n in after.entry.post_order() if n.op == "convolution")
    narrow = sum(1 for c in casts if c["chosen"] not in ("f32", ""))
    return {"precision": "cost" if by_cost else "policy", "offered": len(casts), "narrowed": narrow,
            "layout": opts.layout, "convolutions": convs, "channels_first": cf(after),
            "channels_first_in_model": cf(before)}


def _held(n: Any) -> Any:
    """The type of the input or constant ``n`` is (through moves of its elements), else None."""
    while n.op in ("reshape", "transpose", "broadcast", "copy", "bitcast", "slice") and n.operands:
        n = n.operands[0]
    return n.type if n.op in ("parameter", "constant") and isinstance(n.type, TensorType) else None


CRITICAL_TOP = 4  # the critical path's longest operators the report names (nxsat profile lists more)


def _path_line(p: dict[str, Any]) -> str:
    """What the latency is made of (the critical path: sim/critical.py), its share by engine and its
    longest operators, in one line."""
    from nxsat.sim.critical import shares

    ops = ", ".join(f"{o['operator'] or '-'} ({o['engine']}) {o['ns'] / 1000:.1f} us" for o in p["operators"][:2])
    return shares(p, sep="  ") + (f"; longest {ops}" if ops else "")


LAYOUT_WHO = {"cost": "chosen by cost)", "measured": "every convolution channels-first, measured faster than the "
              "cost model's choice)"}


def format_report(r: dict[str, Any]) -> str:
    """The report as a short table for a terminal."""
    lines = [
        f"{r['model']} for {r['target']} (lnc {r['lnc']}), -O{r['optlevel']}, model type {r['model_type']}, "
        f"auto-cast {r['auto_cast']}" + (f" ({r['auto_cast_type']})" if r["auto_cast"] != "none" else ""),
        f"  latency      {r['latency_us']:>12.3f} us   (simulated)",
        f"  roofline     {r['roofline_us']:>12.3f} us   ({r['roofline']['bound']}-bound)"
        + (f"; latency / roofline {r['latency_over_roofline']:.2f}" if r["latency_over_roofline"] else ""),
        f"  DMA work     {r['dma_work_us']:>12.3f} us   (the DMA engines' time for the program's transfers: no "
        "schedule of them ends sooner)",
        f"  instructions {r['instructions']:>12,}     MFU {r['mfu']:.1%}",
        f"  HBM traffic  {r['hbm_bytes']:>12,} B   spill {r['spill_bytes']:,} B   SBUF peak {r['sbuf_peak_bytes']:,} B",
        "  forwarding   " + _forwarding_line(r["forwarded"]),
        "  engines      " + "  ".join(f"{k} {v:.0%}" for k, v in r["engines"].items() if not k.startswith("q"))
        + f"  DMA queues {sum(1 for k in r['engines'] if k.startswith('q'))}",
        "  critical path " + _path_line(r["critical_path"]),
        f"  e-graph      {r['egraph']['nodes']:,} nodes, {r['egraph']['classes']:,} classes, "
        f"{r['egraph']['iterations']} iterations ({r['egraph']['stop_reason']})",
        "  stages       " + ", ".join(f"{k} {v:.2f}s" for k, v in r["stages"].items()),
    ]
    d = r.get("decisions")
    if d and r["auto_cast"] != "none":
        lines.insert(-2, "  precision    " + (f"by cost: {d['narrowed']} of {d['offered']} dots and convolutions "
                                              f"in {r['auto_cast_type']} (extraction.casts in the report)"
                                              if d["precision"] == "cost" else "the --auto-cast policy"))
    if d and d["convolutions"]:
        lines.insert(-2, f"  layout       {d['channels_first']} of {d['convolutions']} convolutions write "
                         f"channels-first ({d['channels_first_in_model']} in the model; "
                         + LAYOUT_WHO.get(d["layout"], f"--layout {d['layout']})"))
    if r["model_type"] != "generic":
        fired = r["egraph"].get("model_type_rules", {})
        lines.insert(-1, "  model type   " + (", ".join(f"{k} x{v}" for k, v in r["fused"].items())
                                                 or "no fused operator") + " extracted; its rules matched: "
                     + (", ".join(f"{k} {v}" for k, v in fired.items()) or "none"))
    sr = r.get("search")
    if sr:
        t = sr["tried"][sr["chosen"]]
        lines.insert(-1, f"  search       {len(sr['tried'])} schedules tried, the fastest kept: {t['program']} "
                         f"extraction, load lookahead {t['lookahead']}"
                         + (f", weights on {t['weight_queues']} queues of their own" if t["weight_queues"] else "")
                         + (", critical-path order" if t.get("critical") else "")
                         + (", in time" if t.get("timed") else "")
                         + (", loads longest chain first" if t.get("loads_by_rank") else "")
                         + (", the engines' stalls timed" if t.get("stalls") else "")
                         + (f", loads ahead within {t['room']:.0%} of SBUF by the program's profile"
                            if t.get("room") else "")
                         + (f", converted weights through a ring of {t['ring']:.0%} of SBUF" if t.get("ring") else "")
                         + ("" if len(sr["tried"]) > 1 else f" (over {sr['limit_instructions']:,} instructions: "
                                                             "compiled once)"))
    return "\n".join(lines)


def _forwarding_line(f: dict[str, int] | None) -> str:
    if f is None:
        return "off (--disable-forwarding)"
    refused = f"; {f['refused_for_sbuf']:,} left in HBM for SBUF room" if f["refused_for_sbuf"] else ""
    return (f"{f['loads']:,} loads read values still in SBUF ({f['copies']:,} engine copies, "
            f"{f['loads'] - f['copies']:,} SBUF-to-SBUF DMAs; {f['bytes']:,} B); {f['tensors']:,} scratch tensors "
            f"no longer written{refused}")


def write_neff(path: str, result: CompileResult) -> None:
    atomic_write(path, result.neff)
