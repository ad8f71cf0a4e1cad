"""What ``nxsat inspect`` reports about a model: operators, parameters, FLOPs, outputs, warnings.

FLOPs are counted on the canonical graph (calls inlined, conditionals if-converted, static loops
unrolled), so a body called N times counts N times; dot and convolution FLOPs are exact (from the
registry's ``flops`` rules), everything else is counted as one operation per output element. A
loop whose trip count is not static is counted once and flagged.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from nxsat.ir import Computation, Module, Node
from nxsat.ops import registry
from nxsat.passes import canonicalize

MATMUL_OPS = ("dot", "convolution")


@dataclass
class ModelInfo:
    name: str
    source: str
    framework: str
    computations: int
    instructions: int
    op_histogram: dict[str, int]
    parameters: list[dict[str, Any]]
    parameter_bytes: int
    outputs: list[dict[str, Any]]
    flops: dict[str, int]
    canonical_nodes: int
    dynamic_loops: int
    unsupported: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _flops(comp: Computation, seen: set[int]) -> tuple[Counter, int]:
    """FLOPs per kind in ``comp`` and in bodies of loops left in it; and how many such loops."""
    counts: Counter = Counter()
    loops = 0
    for n in comp.post_order():
        opdef = registry.get(n.op)
        if n.op == "while":
            loops += 1
            body = n.attrs["body"]
            if id(body) not in seen:
                seen.add(id(body))
                c, nested = _flops(body, seen)
                counts.update(c)
                loops += nested
            continue
        if opdef is None or opdef.flops is None:
            continue
        try:
            f = opdef.flops([o.type for o in n.operands], n.type, n.attrs)
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
        counts["matmul" if n.op in MATMUL_OPS else "other"] += int(f)
        if n.op in MATMUL_OPS:
            counts[n.op] += int(f)
    return counts, loops


def _all_instructions(module: Module) -> list[Node]:
    return [n for c in module.computations.values() for n in c.instructions]


def model_info(module: Module) -> ModelInfo:
    nodes = _all_instructions(module)
    hist = Counter(n.op for n in nodes)
    params = []
    total = 0
    for p in module.entry.params:
        nbytes = p.type.nbytes
        total += nbytes
        params.append({"index": p.attrs.get("index", len(params)), "name": p.name, "type": str(p.type),
                       "bytes": nbytes})
    outputs = [{"name": f"out{i}", "type": str(t)} for i, t in enumerate(module.outputs)]
    canon = canonicalize(module)
    counts, loops = _flops(canon.entry, set())
    refused = [n for n in nodes if (o := registry.get(n.op)) is not None and o.status == registry.UNSUPPORTED
               or n.op == "custom-call"]
    refused.sort(key=lambda n: (n.op, n.loc.file, n.loc.line, n.loc.column) if n.loc else (n.op, "", 0, 0))
    unsupported = list(dict.fromkeys(_refused_text(n) for n in refused))
    return ModelInfo(
        name=module.name, source=module.source, framework=module.framework,
        computations=len(module.computations), instructions=len(nodes),
        op_histogram=dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0]))),
        parameters=params, parameter_bytes=total, outputs=outputs,
        flops={"total": counts["matmul"] + counts["other"], "matmul": counts["matmul"],
               "dot": counts["dot"], "convolution": counts["convolution"], "other": counts["other"]},
        canonical_nodes=len(canon.entry.post_order()), dynamic_loops=loops, unsupported=unsupported,
        warnings=[w.format() for w in module.warnings])


def _refused_text(n: Node) -> str:
    what = f"custom-call {n.attrs.get('target', '')!r}" if n.op == "custom-call" else n.op
    return f"{what} at {n.loc}" if n.loc else what


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)


def _count(n: int) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n:,} ({n / scale:.2f} {unit})"
    return f"{n:,}"


def format_info(info: ModelInfo, max_params: int = 20) -> str:
    lines = [f"model: {info.source} ({info.framework}, module {info.name})",
             f"computations: {info.computations}   instructions: {info.instructions}   "
             f"after inlining/if-conversion/unrolling: {info.canonical_nodes} nodes"]
    lines.append(f"parameters: {len(info.parameters)}, {_bytes(info.parameter_bytes)}")
    shown = info.parameters if len(info.parameters) <= max_params else info.parameters[:max_params]
    width = max((len(p["name"]) for p in shown), default=4)
    for p in shown:
        lines.append(f"  {p['index']:>4}  {p['name']:<{width}}  {p['type']:<28} {_bytes(p['bytes'])}")
    if len(shown) < len(info.parameters):
        lines.append(f"  ... {len(info.parameters) - len(shown)} more (--all lists them)")
    lines.append(f"outputs: {len(info.outputs)}")
    for o in info.outputs[:max_params]:
        lines.append(f"  {o['name']:<6} {o['type']}")
    if len(info.outputs) > max_params:
        lines.append(f"  ... {len(info.outputs) - max_params} more (--all lists them)")
    f = info.flops
    lines.append(f"FLOPs: dot {_count(f['dot'])}, convolution {_count(f['convolution'])}; "
                 f"elementwise and other {_count(f['other'])}")
    if info.dynamic_loops:
        lines.append(f"  ({info.dynamic_loops} loop(s) with a trip count unknown at compile time: "
                     "their bodies are counted once)")
    lines.append(f"operators ({len(info.op_histogram)} kinds, every computation as written):")
    items = list(info.op_histogram.items())
    for i in range(0, len(items), 4):
        lines.append("  " + "".join(f"{op:<24}{n:>6}   " for op, n in items[i:i + 4]).rstrip())
    if info.unsupported:
        lines.append("not supported (the model loads for inspection only):")
        lines.extend(f"  {u}" for u in info.unsupported[:max_params])
        if len(info.unsupported) > max_params:
            lines.append(f"  ... {len(info.unsupported) - max_params} more (--all lists them)")
    if info.warnings:
        lines.append("warnings:")
        lines.extend(f"  {w}" for w in info.warnings)
    return "\n".join(lines)

