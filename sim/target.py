"""Target specs: the device facts the simulator, the cost model and the backend read, as data.

Each target is a JSON file under ``sim/targets/``. A file has ``facts`` (published numbers, with the
documents they come from in ``sources``) and ``assumptions`` (every number the documents do not give,
each with the reason it was chosen), and may ``extends`` a core file (``neuroncore-v2``). Loading merges
the chain, refuses an assumption that restates a fact of the same file, and keeps the list of
assumptions so that reports and docs can show exactly what the model takes on trust.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from nxsat import dtypes as dt
from nxsat.diagnostics import error
from nxsat.sim.expr import Formula
from nxsat.sim.program import ENGINE_STREAMS

MAX_EXTENDS_DEPTH = 8


@dataclass(frozen=True)
class Engine:
    """One compute engine of a core: its stream name (``pe``), display name and clock."""

    stream: str
    name: str
    clock_ghz: float
    idle_restart_cycles: float = 0.0  # paid by an instruction that starts after the engine sat idle

    def ns(self, cycles: float) -> float:
        """Nanoseconds of ``cycles`` of this engine's clock."""
        return cycles / self.clock_ghz


@dataclass(frozen=True)
class Assumption:
    """A number or rule the documents do not give: its spec key, value, reason and the file saying so."""

    key: str
    value: Any
    why: str
    source: str


@dataclass(frozen=True)
class Target:
    """A resolved target spec for one logical-core configuration (``lnc``)."""

    name: str
    core: str
    description: str
    lnc: int
    spec: dict[str, Any]
    assumptions: tuple[Assumption, ...]
    sources: tuple[str, ...]
    engines: dict[str, Engine] = field(default_factory=dict)
    costs: dict[str, Formula] = field(default_factory=dict)

    # --- memories ----------------------------------------------------------------------------
    @property
    def partitions(self) -> int:
        return int(self.spec["sbuf"]["partitions"])

    @property
    def sbuf_bytes(self) -> int:
        """Bytes per SBUF partition."""
        return int(self.spec["sbuf"]["bytes_per_partition"])

    @property
    def psum_bytes(self) -> int:
        """Bytes per PSUM partition."""
        return int(self.spec["psum"]["bytes_per_partition"])

    @property
    def psum_banks(self) -> int:
        return int(self.spec["psum"]["banks"])

    @property
    def psum_dtypes(self) -> tuple[str, ...]:
        """Element types a PSUM tile may have."""
        return tuple(self.spec["psum"]["dtypes"])

    @property
    def psum_bank_bytes(self) -> int:
        return self.psum_bytes // self.psum_banks

    @property
    def chip_cores(self) -> int:
        return int(self.spec["chip"]["cores"])

    @property
    def hbm_bytes(self) -> int:
        return int(self.spec["chip"]["hbm_bytes"])

    @property
    def hbm_bw(self) -> float:
        """HBM bandwidth one physical core gets, bytes per ns (= GB/s): the chip's, shared evenly."""
        return float(self.spec["chip"]["hbm_gbps"]) / self.chip_cores

    # --- engines, DMA --------------------------------------------------------------------------
    @property
    def dma(self) -> dict[str, Any]:
        return self.spec["dma"]

    @property
    def dma_practical_engine_gbps(self) -> float:
        """The documented practical rate of one DMA engine: the per-core figure over the engines."""
        return float(self.spec["dma"]["practical_core_gbps"]) / int(self.spec["dma"]["engines"])

    @property
    def dma_queues(self) -> int:
        return int(self.spec["dma"]["queues"])

    @property
    def dma_cast_dtypes(self) -> tuple[str, ...]:
        """The element types a DMA converts between as it copies (none: it copies bytes)."""
        return tuple(self.spec["dma"].get("cast_dtypes", ()))

    def dma_casts(self, dst: str, src: str) -> bool:
        """Does a DMA convert ``src``-typed elements to ``dst`` as it copies? (a weight loaded into the
        matmul's type with no engine pass)"""
        return dst != src and dst in self.dma_cast_dtypes and src in self.dma_cast_dtypes

    @property
    def matmul(self) -> dict[str, Any]:
        return self.spec["matmul"]

    @property
    def max_semaphores(self) -> int:
        return int(self.spec["sync"]["semaphores"])

    @property
    def constants(self) -> dict[str, float]:
        return dict(self.spec.get("constants", {}))

    @property
    def collectives(self) -> dict[str, float]:
        return dict(self.spec["collectives"])

    def matmul_dtype_factor(self, dtype_name: str) -> float | None:
        """Cycles per moving column relative to bf16, or None when TensorE cannot run the type."""
        f = self.spec["matmul"]["dtype_cycle_factor"].get(dtype_name)
        return None if f is None else float(f)

    def supports_matmul_dtype(self, dtype_name: str) -> bool:
        """Can TensorE of this target multiply this precision (``tf32``: fp32 operands rounded)?"""
        if dtype_name == "tf32":
            return bool(self.spec["numerics"].get("tf32")) and self.matmul_dtype_factor("tf32") is not None
        return dtype_name in self.spec["numerics"]["matmul_dtypes"] and self.matmul_dtype_factor(dtype_name) is not None

    def double_row(self, dtype_name: str) -> bool:
        """Can TensorE run this precision in double-row mode (K = 256: two products per element, v3 fp8)?"""
        return dtype_name in self.spec["matmul"].get("double_row_dtypes", ())

    def peak_flops(self, dtype_name: str = "bf16") -> float:
        """Dense matmul FLOPs per ns (= GFLOP/s) of one core at this precision: 2 x rows x cols x clock,
        over the precision's cycle factor, twice that in double-row mode."""
        factor = self.matmul_dtype_factor(dtype_name)
        if factor is None or not self.supports_matmul_dtype(dtype_name):
            return 0.0
        m = self.spec["matmul"]
        per_pe = 2 if self.double_row(dtype_name) else 1
        return 2.0 * m["rows"] * m["cols"] * per_pe * self.engines["pe"].clock_ghz / factor

    @property
    def dma_ceiling_gbps(self) -> float:
        """What one core's DMA engines sustain together (the DMA bandwidth guide's per-core figure)."""
        return float(self.spec["dma"]["engines"]) * float(self.spec["dma"]["engine_gbps"])

    @property
    def memory_bw(self) -> float:
        """The HBM bandwidth one core can use, bytes per ns: its share of the chip's HBM, or what its DMA
        engines sustain, whichever is lower (the roofline's memory bound)."""
        return min(self.hbm_bw, self.dma_ceiling_gbps)

    @property
    def access(self) -> dict[str, Any]:
        """Rules for engine access patterns: start partitions, free dimensions, strides."""
        return self.spec["access"]

    def start_partitions(self, count: int) -> tuple[int, ...]:
        """The partitions an engine operand of ``count`` partitions may start at."""
        for limit, starts in sorted((int(k), v) for k, v in self.spec["access"]["start_partitions"].items()):
            if count <= limit:
                return tuple(starts)
        return ()

    def cost(self, opcode: str, engine: str, variants: tuple[str, ...] = ()) -> Formula | None:
        """The cost formula of an opcode on an engine, most specific first: a variant with its own
        documented cost (``activation[func=reciprocal]@dve``, ``...[func=reciprocal]``), then
        ``opcode@engine``, then ``opcode``."""
        costs = self.costs
        for v in variants:
            f = costs.get(f"{opcode}[{v}]@{engine}") or costs.get(f"{opcode}[{v}]")
            if f is not None:
                return f
        return costs.get(f"{opcode}@{engine}") or costs.get(opcode)

    @property
    def exact_int_engines(self) -> frozenset[str]:
        """Engines with native integer arithmetic (others compute integers in fp32)."""
        return frozenset(self.spec["numerics"].get("exact_int_engines", ()))

    @property
    def exact_int_types(self) -> frozenset[str]:
        """The integer types those engines compute on natively."""
        return frozenset(self.spec["numerics"].get("exact_int_types", ()))

    def fp8_saturates(self, dtype_name: str) -> bool:
        """Does an engine's cast to this fp8 type saturate (else it overflows to infinity)?"""
        return bool(self.spec["numerics"].get("fp8_saturate", {}).get(dtype_name, False))

    def summary(self) -> dict[str, Any]:
        """The numbers a report shows about the target."""
        return {
            "target": self.name, "core": self.core, "lnc": self.lnc,
            "hbm_gbps_per_core": round(self.hbm_bw, 3),
            "dma_gbps_per_core": round(self.dma_ceiling_gbps, 3),
            "bf16_tflops_per_core": round(self.peak_flops("bf16") / 1000, 3),
            "sbuf_bytes": self.partitions * self.sbuf_bytes,
            "psum_bytes": self.partitions * self.psum_bytes,
        }


# --- loading ---------------------------------------------------------------------------------

def _targets_dir() -> Any:
    return resources.files("nxsat.sim").joinpath("targets")


@cache
def _read(name: str) -> dict[str, Any]:
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name):
        raise error("NCC_EARG002", f"unknown target {name!r}", hint="targets: " + ", ".join(target_names()))
    path = _targets_dir().joinpath(f"{name}.json")
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, OSError):
        raise error("NCC_EARG002", f"unknown target {name!r}", hint="targets: " + ", ".join(target_names())) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error("NCC_ETGT001", f"target spec {name}.json is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise error("NCC_ETGT001", f"target spec {name}.json must be a JSON object")
    return data


def target_names() -> list[str]:
    """The targets one can compile for (abstract core files excluded), sorted."""
    names = []
    for entry in _targets_dir().iterdir():
        if entry.name.endswith(".json"):
            stem = entry.name[: -len(".json")]
            if not _read(stem).get("abstract"):
                names.append(stem)
    return sorted(names)


def _paths(tree: Any, prefix: str = "") -> set[str]:
    """Every dotted path (inner nodes included) of a nested dict."""
    out: set[str] = set()
    if isinstance(tree, dict):
        for k, v in tree.items():
            p = f"{prefix}.{k}" if prefix else k
            out.add(p)
            out |= _paths(v, p)
    return out


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _set_path(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set a dotted key; a dict value is merged into what is there (it restates part of a section)."""
    parts = key.split(".")
    node = tree
    for p in parts[:-1]:
        nxt = node.get(p)
        if not isinstance(nxt, dict):
            nxt = {}
            node[p] = nxt
        node = nxt
    old = node.get(parts[-1])
    if isinstance(value, dict) and isinstance(old, dict):
        node[parts[-1]] = _merge(old, value)
    else:
        node[parts[-1]] = copy.deepcopy(value)


def _covers(key: str, value: Any, other: str) -> bool:
    """Does setting ``key`` to ``value`` restate the dotted key ``other``?"""
    if other == key:
        return True
    if not other.startswith(key + "."):
        return False
    return other[len(key) + 1:] in _paths(value)


def _get_path(tree: dict[str, Any], key: str) -> Any:
    node: Any = tree
    for p in key.split("."):
        if not isinstance(node, dict) or p not in node:
            return _MISSING
        node = node[p]
    return node


_MISSING = object()


def _resolve(name: str, depth: int = 0) -> tuple[dict[str, Any], dict[str, Assumption], dict[str, Any]]:
    """(merged spec, assumptions by key, metadata) of one file and its ``extends`` chain.

    A file has ``facts`` (published numbers), ``assumptions`` (``{"value", "why"}`` each), ``costs``
    (one table: every instruction's cycle formula with its ``source``, or with ``assumed`` giving
    why it is not published) and, when it extends another generation's core, ``inherits``: the
    parent's numbers it takes, each named with why (they become its assumptions), so that a file
    states only what differs from its parent."""
    if depth > MAX_EXTENDS_DEPTH:
        raise error("NCC_ETGT001", f"target spec {name}: 'extends' chain deeper than {MAX_EXTENDS_DEPTH}")
    data = _read(name)
    facts = data.get("facts", {})
    assumptions = data.get("assumptions", {})
    costs = data.get("costs", {})
    inherits = data.get("inherits", {})
    if not all(isinstance(x, dict) for x in (facts, assumptions, costs, inherits)):
        raise error("NCC_ETGT001", f"target spec {name}: 'facts', 'assumptions', 'costs' and 'inherits' must be "
                    "objects")
    if "extends" in data:
        spec, assumed, meta = _resolve(str(data["extends"]), depth + 1)
    else:
        spec, assumed, meta = {}, {}, {"sources": []}
    parent = copy.deepcopy(spec)
    fact_paths = _paths(facts)
    for key, entry in assumptions.items():
        if key in fact_paths or any(p.startswith(key + ".") for p in fact_paths):
            raise error("NCC_ETGT001", f"target spec {name}: {key} is both a fact and an assumption",
                        hint="every number lives in one place")
        if not isinstance(entry, dict) or "value" not in entry or not str(entry.get("why", "")).strip():
            raise error("NCC_ETGT001", f"target spec {name}: assumption {key} needs a value and a 'why'")
    for key, entry in costs.items():
        ok = isinstance(entry, dict) and "cycles" in entry and (
            bool(str(entry.get("source", "")).strip()) != bool(str(entry.get("assumed", "")).strip()))
        if not ok:
            raise error("NCC_ETGT001", f"target spec {name}: cost {key} needs 'cycles' and either a 'source' "
                        "(documented) or 'assumed' (why, when it is not)")
    for key, why in inherits.items():
        if not str(why).strip() or _get_path(parent, key) is _MISSING:
            raise error("NCC_ETGT001", f"target spec {name}: inherits {key}, which its parent does not have "
                        "(or no reason is given)")
        if key in fact_paths or key in assumptions:
            raise error("NCC_ETGT001", f"target spec {name}: {key} is both inherited and stated",
                        hint="every number lives in one place")
    # A child's facts, assumptions or costs replace what its parent assumed at the same key.
    for key in list(assumed):
        if (key in fact_paths or any(_covers(k, e["value"], key) for k, e in assumptions.items())
                or (key.startswith("costs.") and key[6:] in costs)):
            del assumed[key]
    spec = _merge(spec, facts)
    for key, entry in assumptions.items():
        _set_path(spec, key, entry["value"])
        assumed[key] = Assumption(key, entry["value"], str(entry["why"]), f"{name}.json")
    table = spec.setdefault("costs", {})
    for key, entry in costs.items():
        table[key] = entry["cycles"]
        if entry.get("assumed"):
            assumed[f"costs.{key}"] = Assumption(f"costs.{key}", entry["cycles"], str(entry["assumed"]), f"{name}.json")
    for key, why in inherits.items():
        assumed[key] = Assumption(key, _get_path(parent, key), str(why), f"{name}.json")
    meta = dict(meta)
    for k in ("core", "description"):
        if k in data:
            meta[k] = data[k]
    meta["sources"] = list(meta.get("sources", [])) + [str(s) for s in data.get("sources", [])]
    return spec, assumed, meta


_REQUIRED = {
    "chip": ("cores", "hbm_bytes", "hbm_gbps"),
    "sbuf": ("partitions", "bytes_per_partition"),
    "psum": ("partitions", "bytes_per_partition", "banks", "dtypes"),
    "matmul": ("rows", "cols", "max_moving", "dtype_cycle_factor"),
    "dma": ("engines", "engine_gbps", "practical_core_gbps", "fixed_latency_ns", "partitions_per_engine", "queues",
            "descriptor_overhead_ns", "hbm_hbm_engines_per_bytes", "transpose_efficiency",
            "sbuf_transpose_efficiency", "saturating_bytes"),
    "transpose": ("exact", "psum_dtypes"),
    "access": ("start_partitions", "max_free_dims", "strided_bytes", "strided_factor", "strided_engines"),
    "bn_stats": ("max_free",),
    "latency": ("access_cycles", "dependent_stall_cycles", "dependent_stall_engines", "semaphore_ns"),
    "sync": ("semaphores",),
    "collectives": ("fixed_ns", "hop_ns", "link_gbps_per_rank"),
    "numerics": ("matmul_dtypes", "exact_int_engines", "exact_int_types", "exact_copy_engines"),
    "lnc": ("default", "configs"),
}

# Modeling choices the spec names and the code implements: a spec that asks for another is refused
# rather than silently modeled differently.
POLICIES = {
    ("dma", "sharing"): ("engine-time max-min",),
    ("matmul", "stationary_reload_hidden"): (True,),
    ("chip", "hbm_shared_evenly"): (True,),
    ("numerics", "float_to_int"): ("truncate-saturate",),
    ("numerics", "stochastic_rounding"): (False,),
    ("dma", "queue_pipelined"): (True, False),
    ("collectives", "separate_from_dma"): (True,),
}


@cache
def load_target(name: str, lnc: int | None = None) -> Target:
    """The resolved spec of target ``name`` with logical-core config ``lnc`` (default: the target's)."""
    data = _read(name)
    if data.get("abstract"):
        raise error("NCC_EARG002", f"{name} is a core description, not a target",
                    hint="targets: " + ", ".join(target_names()))
    spec, assumed, meta = _resolve(name)
    for section, keys in _REQUIRED.items():
        sec = spec.get(section)
        if not isinstance(sec, dict):
            raise error("NCC_ETGT001", f"target {name}: missing section {section!r}")
        for k in keys:
            if k not in sec:
                raise error("NCC_ETGT001", f"target {name}: missing {section}.{k}")
    for (section, key), allowed in POLICIES.items():
        value = spec.get(section, {}).get(key)
        if value not in allowed:
            raise error("NCC_ETGT001", f"target {name}: {section}.{key} = {value!r} is not a model nxsat implements",
                        hint="supported: " + ", ".join(repr(a) for a in allowed))
    engines: dict[str, Engine] = {}
    for stream in ENGINE_STREAMS:
        e = spec.get("engines", {}).get(stream)
        if not isinstance(e, dict) or not isinstance(e.get("clock_ghz"), (int, float)) or e["clock_ghz"] <= 0:
            raise error("NCC_ETGT001", f"target {name}: engine {stream} needs a positive clock_ghz")
        engines[stream] = Engine(stream, str(e.get("name", stream)), float(e["clock_ghz"]),
                                 float(e.get("idle_restart_cycles", 0)))
    costs = {k: Formula(v, f"{name}.costs.{k}") for k, v in sorted(spec.get("costs", {}).items())}
    configs = {int(k): v for k, v in spec["lnc"]["configs"].items()}
    chosen = int(spec["lnc"]["default"]) if lnc is None else int(lnc)
    if chosen not in configs:
        raise error("NCC_EARG001", f"logical core config {chosen} is not valid for {name}",
                    hint="valid: " + ", ".join(str(k) for k in sorted(configs)))
    if spec["sbuf"]["partitions"] != spec["psum"]["partitions"]:
        raise error("NCC_ETGT001", f"target {name}: SBUF and PSUM must have the same partition count")
    if spec["psum"]["bytes_per_partition"] % spec["psum"]["banks"]:
        raise error("NCC_ETGT001", f"target {name}: PSUM size must divide into its banks")
    for d in spec["numerics"]["matmul_dtypes"]:
        try:
            dt.by_name(d)
        except KeyError:
            raise error("NCC_ETGT001", f"target {name}: unknown matmul dtype {d!r}") from None
    return Target(
        name=name, core=str(meta.get("core", "")), description=str(meta.get("description", "")), lnc=chosen,
        spec=spec, assumptions=tuple(assumed[k] for k in sorted(assumed)),
        sources=tuple(dict.fromkeys(meta.get("sources", []))), engines=engines, costs=costs,
    )


def physical_cores(target: Target) -> int:
    """Physical cores one logical core of this target's configuration spans."""
    return target.lnc
