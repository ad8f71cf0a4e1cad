"""The e-graph engine: nxsat terms in an egglog e-graph, loaded flat and read back as a table.

Loading is flat and linear: every IR value becomes one row of a few tab-separated tables
(``ld-op``, ``ld-arg``, ``ld-i`` ...) that egglog's ``input`` command reads in bulk, and one pass
of generated load rules turns each row into its term, unioned with a handle ``(N id)``. No nested
expression is ever built (a long chain would exhaust Python's recursion) and no per-node command
is parsed (egglog's per-command cost makes that superlinear). Handles stay in the e-graph as
unextractable nodes so the host can name any loaded e-class.

Reading back, :meth:`EGraph.view` freezes the database into a :class:`View`: e-classes, the
e-nodes in each, and the analyses, which extraction and the rule checker consume.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nxsat import dtypes as dt
from nxsat.diagnostics import NxsatError, error
from nxsat.ir import Computation, Module, Node, TensorType, TupleType, Type
from nxsat.rules import terms
from nxsat.rules.catalog import Catalog, Rule, catalog
from nxsat.rules.egglog_bindings import load as _load_bindings

eb = _load_bindings()
SPAN = eb.RustSpan("", 0, 0)

# Load tables: name -> (key sorts, value sort).
_TABLES = {
    "ld-op": (("i64",), "String"),
    "ld-arg": (("i64", "i64"), "i64"),
    "ld-varg": (("i64", "i64"), "i64"),
    "ld-nvarg": (("i64",), "i64"),
    "ld-i": (("i64", "i64"), "i64"),
    "ld-s": (("i64", "i64"), "String"),
    "ld-v": (("i64", "i64"), "i64"),
    "ld-shape": (("i64",), "i64"),
    "ld-dtype": (("i64",), "String"),
    "ld-splat": (("i64",), "String"),
}
HANDLES = ("N", "Args")


def lit(v: int | str) -> Any:
    return eb.Lit(SPAN, eb.String(v) if isinstance(v, str) else eb.Int(int(v)))


def call(name: str, *args: Any) -> Any:
    return eb.Call(SPAN, name, list(args))


def vec_expr(v: Sequence[int]) -> Any:
    return call("vec-of", *(lit(int(x)) for x in v)) if len(v) else call("vec-empty")


def slot_expr(value: Any, sort: str) -> Any:
    if sort == terms.IVEC:
        return vec_expr(value)
    return lit(value)


# --- splat values -------------------------------------------------------------------------------

def splat_text(value: Any, dtype: dt.DType) -> str:
    """How the splat analysis spells a value: "0", "1", "-1", "0.5", "inf", "nan", "-0"."""
    if dtype.is_pred:
        return "1" if bool(value) else "0"
    if dtype.is_int:
        return str(int(value))
    return terms.number_text(float(np.asarray(value).astype(np.float64)))


def splat_array(text: str, dtype: dt.DType, shape: Sequence[int]) -> np.ndarray:
    """The array a Fill term stands for."""
    if dtype.is_pred:
        v: Any = text not in ("0", "-0")
    elif dtype.is_int:
        v = int(float(text)) if "." in text or "e" in text else int(text)
    else:
        v = float(text)
    return np.full(tuple(shape), dt.cast(np.asarray(v), dtype) if not dtype.is_pred else v, dtype=dtype.np)


def uniform_value(a: np.ndarray) -> Any | None:
    """The value every element of ``a`` has, or None."""
    if a.size == 0:
        return None
    flat = a.reshape(-1)
    first = flat[0]
    if a.dtype.kind == "f" or a.dtype in (dt.BF16.np, dt.F8E4M3FN.np, dt.F8E5M2.np, np.dtype(np.float16)):
        f = flat.astype(np.float64)
        f0 = f[0]
        if math.isnan(f0):
            return first if np.isnan(f).all() else None
        same = (f == f0) & (np.signbit(f) == np.signbit(f0))
        return first if bool(same.all()) else None
    return first if bool((flat == first).all()) else None


# --- fingerprints (content keys for constants and opaque attributes) -------------------------------

def _array_key(a: np.ndarray) -> tuple:
    a = np.ascontiguousarray(a)
    return (str(a.dtype), a.shape, hashlib.blake2b(a.tobytes(), digest_size=20).hexdigest())


class Fingerprints:
    """Structural fingerprints of attribute values; computations are hashed by their contents."""

    def __init__(self) -> None:
        self._comps: dict[int, str] = {}

    def of(self, v: Any) -> str:
        if isinstance(v, Computation):
            return self.computation(v)
        if isinstance(v, np.ndarray):
            return repr(_array_key(v))
        if isinstance(v, dt.DType):
            return v.name
        if isinstance(v, tuple | list):
            return "(" + ",".join(self.of(x) for x in v) + ")"
        if isinstance(v, dict):
            return "{" + ",".join(f"{k}:{self.of(v[k])}" for k in sorted(v)) + "}"
        return repr(v)

    def computation(self, comp: Computation) -> str:
        key = id(comp)
        if key not in self._comps:
            order = comp.post_order()
            pos = {n.id: i for i, n in enumerate(order)}
            parts = []
            for n in order:
                attrs = {k: v for k, v in n.attrs.items()}
                parts.append(f"{n.op}[{','.join(str(pos[o.id]) for o in n.operands)}]{n.type}{self.of(attrs)}")
            parts.append(f"root={pos[comp.root.id]};params={[pos[p.id] for p in comp.params]}")
            self._comps[key] = hashlib.blake2b("|".join(parts).encode(), digest_size=20).hexdigest()
        return self._comps[key]


# --- the view: the e-graph read back ------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ENode:
    ctor: str
    children: tuple[int, ...]  # e-class indices: fixed T operands, then the TList (variadic terms)
    slots: tuple  # attribute slots, decoded (Constant: (key,), Opaque: (op, key), Fill: (v, t, shape))


@dataclass
class View:
    """A frozen, decoded e-graph. Classes are dense indices; lists (TList) are classes too."""

    nodes: list[ENode] = field(default_factory=list)
    node_class: list[int] = field(default_factory=list)
    class_nodes: list[list[int]] = field(default_factory=list)
    class_is_list: list[bool] = field(default_factory=list)
    handles: dict[int, int] = field(default_factory=dict)  # load id -> class
    list_handles: dict[tuple[int, int], int] = field(default_factory=dict)  # (load id, pos) -> class
    shape: dict[int, tuple[int, ...]] = field(default_factory=dict)
    dtype: dict[int, str] = field(default_factory=dict)
    splat: dict[int, str] = field(default_factory=dict)

    @property
    def n_classes(self) -> int:
        return len(self.class_nodes)

    def term_nodes(self) -> int:
        return sum(1 for c, n in zip(self.node_class, self.nodes) if not self.class_is_list[c])

    def term_classes(self) -> int:
        return sum(1 for x in self.class_is_list if not x)

    def list_items(self, cls: int, limit: int = 1 << 20) -> list[int] | None:
        """The element classes of a TList class (following its first cons cell), or None if cyclic."""
        out: list[int] = []
        seen = set()
        while True:
            if cls in seen or len(out) > limit:
                return None
            seen.add(cls)
            cells = [self.nodes[i] for i in self.class_nodes[cls]]
            nil = next((c for c in cells if c.ctor == "TNil"), None)
            if nil is not None:
                return out
            cons = next((c for c in cells if c.ctor == "TCons"), None)
            if cons is None:
                return None
            out.append(cons.children[0])
            cls = cons.children[1]


@dataclass(frozen=True)
class Sizes:
    nodes: int  # e-nodes of sort T (operators)
    classes: int  # e-classes of sort T
    rows: int  # all rows of all tables (changes whenever anything changes)


@dataclass
class Loaded:
    """Where a module's values live in the e-graph."""

    module: Module
    ids: dict[int, int]  # IR node id -> load id
    root: int
    outputs: list[int]  # load ids of the flattened outputs (through tuple roots)
    nodes: dict[int, Node]  # load id -> IR node
    encodings: dict[int, tuple]  # load id -> (ctor, fixed operands, variadic, slots)
    cse_merged: int = 0  # IR values that landed on an existing e-node


# --- the engine -----------------------------------------------------------------------------------

def operand_layout(node: ENode) -> tuple[int, bool]:
    """(fixed operand children, whether the last child is a list of more operands) of an operator
    e-node: an Opaque node's operands are all in its one list child."""
    if node.ctor == "Opaque":
        return 0, True
    term = terms.BY_CTOR[node.ctor]
    return term.operands, term.variadic


class EGraph:
    """One egglog e-graph with the term language, the analyses and a chosen list of rules."""

    def __init__(self, rules: Sequence[Rule] = (), cat: Catalog | None = None) -> None:
        self.catalog = cat or catalog()
        self.eg = eb.EGraph()
        self.rules = [r for r in rules if not r.builtin]
        self.builtins = [r for r in rules if r.builtin]
        self.constants: list[tuple[np.ndarray | None, Type]] = []
        self._const_keys: dict[tuple, int] = {}
        self.opaque: list[tuple[str, dict[str, Any]]] = []
        self._opaque_keys: dict[str, int] = {}
        self.param_types: dict[int, Type] = {}
        self.params: dict[int, Node] = {}
        self._vec_ids: dict[tuple[int, ...], int] = {}
        self._new_vecs: list[tuple[int, ...]] = []
        self._next_id = 0
        self._fp = Fingerprints()
        self._combined: dict[tuple[str, ...], str] = {}
        self.loaded: list[Loaded] = []
        self._declare()

    # -- setup ----------------------------------------------------------------------------------

    def run_text(self, text: str, filename: str = "<nxsat>") -> list[Any]:
        try:
            return self._run(*self.eg.parse_program(text, filename=filename))
        except NxsatError:
            raise
        except Exception as exc:
            raise error("NCC_IINT001", f"egglog rejected nxsat's own program {filename}: {exc}") from exc

    def _run(self, *commands: Any) -> list[Any]:
        """Run commands; egglog failures (errors and Rust panics) become internal errors."""
        try:
            with _rust_stderr():
                return self.eg.run_program(*commands)
        except eb.EggSmolError as exc:
            raise error("NCC_IINT001", f"egglog: {exc}", hint="rerun with --debug and report it") from exc
        except BaseException as exc:
            if type(exc).__name__ == "PanicException":
                raise error("NCC_IINT001", f"egglog panicked: {exc}",
                            hint="a rule built an ill-typed term; run nxsat rules check") from exc
            raise

    def _declare(self) -> None:
        parts = [terms.declarations(), terms.dtype_facts(), *self.catalog.prelude, _load_declarations()]
        self.run_text("\n".join(parts), "term language")
        self.run_text("(ruleset analysis)\n" + _generated_analysis() + "\n".join(self.catalog.analysis),
                      "analysis.egg")
        for rule in self.rules:
            self.add_rule(rule)

    def add_rule(self, rule: Rule) -> None:
        """Declare a rule in its own ruleset; NCC_ERUL002 at the rule when egglog rejects it."""
        text = f"(ruleset {rule.ruleset})\n{rule.egglog}"
        try:
            with _rust_stderr():
                self.eg.run_program(*self.eg.parse_program(text))
        except eb.EggSmolError as exc:
            # egglog's positions refer to the compiled command, not the file: keep its words only.
            msg = re.sub(r"\bIn \d+:\d+(-\d+)?: ", "", " ".join(str(exc).split()))
            raise error("NCC_ERUL002", f"egglog rejects rule {rule.name}: {msg}", rule.loc,
                        "check constructor names and argument sorts with nxsat rules terms") from None
        except BaseException as exc:
            if type(exc).__name__ == "PanicException":
                raise error("NCC_ERUL002", f"egglog fails on rule {rule.name}: {exc}", rule.loc) from None
            raise

    # -- loading --------------------------------------------------------------------------------

    def vec_id(self, v: Sequence[int]) -> int:
        key = tuple(int(x) for x in v)
        if key not in self._vec_ids:
            self._vec_ids[key] = len(self._vec_ids)
            self._new_vecs.append(key)
        return self._vec_ids[key]

    def constant_key(self, value: np.ndarray | None, t: Type) -> int:
        """Equal literals share a key (so they are one e-node); an elided literal is its own."""
        if value is None or not isinstance(value, np.ndarray):
            self.constants.append((value, t))
            return len(self.constants) - 1
        key = (str(t), _array_key(value))
        if key not in self._const_keys:
            self.constants.append((value, t))
            self._const_keys[key] = len(self.constants) - 1
        return self._const_keys[key]

    # --- decoding e-nodes: the one place that knows how constants and operators are stored ----------

    def constant_type(self, node: ENode) -> TensorType | None:
        """The type of a Constant or Fill e-node whose value is known, without building the value (None
        for an elided literal or another constructor)."""
        if node.ctor == "Constant":
            value, t = self.constants[node.slots[0]]
            return t if value is not None and isinstance(t, TensorType) else None
        if node.ctor == "Fill":
            _v, d, shape = node.slots
            return TensorType(dt.by_name(d), tuple(shape))
        return None

    def constant_value(self, node: ENode) -> np.ndarray:
        """The value of a Constant or Fill e-node that :meth:`constant_type` gave a type (a Fill's
        splat is built only here)."""
        if node.ctor == "Constant":
            return np.asarray(self.constants[node.slots[0]][0])
        v, d, shape = node.slots
        return splat_array(v, dt.by_name(d), shape)

    def operator(self, node: ENode) -> tuple[str, dict[str, Any]]:
        """The IR operator and attributes of an operator e-node: an Opaque one's from the opaque table,
        a term constructor's decoded from its slots (where its operands are: :func:`operand_layout`)."""
        if node.ctor == "Opaque":
            op, key = node.slots
            return op, dict(self.opaque[key][1])
        term = terms.BY_CTOR[node.ctor]
        return term.op, term.decode(node.slots)

    def opaque_key(self, node: Node) -> int:
        if node.op in terms.NONDETERMINISTIC:
            self.opaque.append((node.op, node.attrs))
            return len(self.opaque) - 1
        fp = node.op + "|" + self._fp.of(node.attrs)
        if fp not in self._opaque_keys:
            self.opaque.append((node.op, node.attrs))
            self._opaque_keys[fp] = len(self.opaque) - 1
        return self._opaque_keys[fp]

    def load(self, module: Module) -> Loaded:
        """Add the entry computation of ``module``: one row per value, then one load pass."""
        rows: dict[str, list[str]] = {k: [] for k in _TABLES}
        ids: dict[int, int] = {}
        nodes: dict[int, Node] = {}
        comp = module.entry
        order = comp.post_order()
        seen_terms: dict[tuple, int] = {}
        canon: dict[int, int] = {}
        encodings: dict[int, tuple] = {}
        merged = 0
        for node in order:
            i = self._next_id
            self._next_id += 1
            ids[node.id] = i
            nodes[i] = node
            ctor, fixed, variadic, slots, sorts = self._encode(node)
            rows["ld-op"].append(f"{i}\t{ctor}")
            args = [ids[o.id] for o in node.operands]
            for p, a in enumerate(args[:fixed]):
                rows["ld-arg"].append(f"{i}\t{p}\t{a}")
            if variadic:
                rest = args[fixed:]
                for p, a in enumerate(rest):
                    rows["ld-varg"].append(f"{i}\t{p}\t{a}")
                rows["ld-nvarg"].append(f"{i}\t{len(rest)}")
            for s, (value, sort) in enumerate(zip(slots, sorts)):
                if sort == terms.I64:
                    rows["ld-i"].append(f"{i}\t{s}\t{int(value)}")
                elif sort == terms.STRING:
                    rows["ld-s"].append(f"{i}\t{s}\t{value}")
                else:
                    rows["ld-v"].append(f"{i}\t{s}\t{self.vec_id(value)}")
            if isinstance(node.type, TensorType):
                rows["ld-shape"].append(f"{i}\t{self.vec_id(node.type.shape)}")
                rows["ld-dtype"].append(f"{i}\t{node.type.dtype.name}")
                if node.op == "constant" and node.attrs.get("value") is not None:
                    u = uniform_value(np.asarray(node.attrs["value"]))
                    if u is not None:
                        rows["ld-splat"].append(f"{i}\t{splat_text(u, node.type.dtype)}")
            encodings[i] = (ctor, fixed, variadic, tuple(slots))
            term_key = (ctor, tuple(canon[a] for a in args), tuple(slots))
            if term_key in seen_terms:
                merged += 1
                canon[i] = seen_terms[term_key]
            else:
                canon[i] = seen_terms[term_key] = i
        self._define_vecs()
        try:
            with tempfile.TemporaryDirectory(prefix="nxsat-egraph-") as tmp:
                commands = []
                for name, lines in rows.items():
                    if not lines:
                        continue
                    path = Path(tmp) / f"{name}.tsv"
                    # A scratch file in a private directory that only this call reads and then
                    # deletes: a plain write (atomic_write's fsync costs more than a small load).
                    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
                    commands.append(eb.Input(SPAN, name, str(path)))
                self._run(*commands)
        except OSError as exc:
            raise error("NCC_EFIL001", f"cannot write the e-graph's load tables: {exc.strerror or exc}",
                        hint="is the temporary directory (TMPDIR) writable and not full?") from None
        self._run(eb.RunSchedule(eb.Run(SPAN, eb.RunConfig("load"))))
        root = ids[comp.root.id]
        loaded = Loaded(module, ids, root, _output_ids(comp.root, ids), nodes, encodings, merged)
        self.loaded.append(loaded)
        return loaded

    def _define_vecs(self) -> None:
        if not self._new_vecs:
            return
        actions = [eb.ActionCommand(eb.Set(SPAN, "ld-vec", [lit(self._vec_ids[v])], vec_expr(v)))
                   for v in self._new_vecs]
        self._run(*actions)
        self._new_vecs = []

    def _encode(self, node: Node) -> tuple[str, int, bool, tuple, tuple[str, ...]]:
        """(ctor, fixed operands, variadic?, slot values, slot sorts) of one IR node."""
        if node.op == "parameter":
            idx = int(node.attrs["index"])
            self.param_types.setdefault(idx, node.type)
            self.params.setdefault(idx, node)
            return "Parameter", 0, False, (idx,), (terms.I64,)
        if node.op == "constant":
            return "Constant", 0, False, (self.constant_key(node.attrs.get("value"), node.type),), (terms.I64,)
        term = terms.TERMS.get(node.op)
        if term is not None:
            try:
                slots = term.encode(node.attrs)
                n = len(node.operands)
                if n >= term.operands and (term.variadic or n == term.operands):
                    return term.ctor, term.operands, term.variadic, slots, term.slot_sorts
            except terms.NotRepresentable:
                pass
        return "Opaque", 0, True, (node.op, self.opaque_key(node)), (terms.STRING, terms.I64)

    # -- running ----------------------------------------------------------------------------------

    def combined_ruleset(self, rules: Sequence[Rule]) -> str:
        names = tuple(sorted(r.ruleset for r in rules))
        if names not in self._combined:
            name = f"grp{len(self._combined)}"
            self.run_text(f"(unstable-combined-ruleset {name} {' '.join(names)})")
            self._combined[names] = name
        return self._combined[names]

    def run_iteration(self, rules: Sequence[Rule], limited: Sequence[tuple[int, Sequence[Rule]]] = ()) -> Any:
        """One rewrite iteration: the analyses to saturation, then every rule once.

        ``rules`` run seminaively (each match found once). Each ``(limit, rules)`` group of
        ``limited`` runs under egglog's back-off scheduler, which drops the matches of a rule that
        finds more than ``limit`` (and re-searches all matches each time, so it is slower).
        Returns egglog's RunReport of the whole schedule."""
        lets, runs = [], []
        if rules:
            runs.append(f"(run {self.combined_ruleset(rules)})")
        for k, (limit, group) in enumerate(limited):
            if group:
                lets.append(f"(let-scheduler s{k} (back-off :match-limit {int(limit)} :ban-length 1))")
                runs.append(f"(run-with s{k} {self.combined_ruleset(group)})")
        if not runs:
            self.run_analysis()
            return None
        text = f"(run-schedule {' '.join(lets)} (seq (saturate (run analysis)) {' '.join(runs)}))"
        out = self._run(*self.eg.parse_program(text))
        return out[-1].report if out and hasattr(out[-1], "report") else None

    def run_analysis(self) -> None:
        self._run(*self.eg.parse_program("(run-schedule (saturate (run analysis)))"))

    def sizes(self, frozen: Any | None = None) -> Sizes:
        """E-nodes and e-classes of sort T, and the row count of every table."""
        out = self._run(eb.PrintSize(SPAN, None))
        table = dict(out[0].sizes) if out and hasattr(out[0], "sizes") else {}
        fr = frozen if frozen is not None else self.eg.freeze()
        classes: set = set()
        funcs = fr.functions  # a property that converts every table: read it once
        for name in terms.BY_CTOR:
            fn = funcs.get(name)
            if fn is not None and table.get(name):
                classes.update(r.output for r in fn.rows)
        nodes = sum(table.get(name, 0) for name in terms.BY_CTOR)
        return Sizes(nodes, len(classes), sum(table.values()))

    def freeze(self) -> Any:
        return self.eg.freeze()

    # -- reading back -------------------------------------------------------------------------------

    def view(self, frozen: Any | None = None, analyses: bool = True) -> View:
        """Decode the whole e-graph."""
        fr = frozen if frozen is not None else self.eg.freeze()
        eg = self.eg
        v = View()
        cls_index: dict[Any, int] = {}
        vec_cache: dict[Any, tuple[int, ...]] = {}

        def cls(value: Any, is_list: bool) -> int:
            c = cls_index.get(value)
            if c is None:
                c = cls_index[value] = len(v.class_nodes)
                v.class_nodes.append([])
                v.class_is_list.append(is_list)
            return c

        def prim(value: Any, sort: str) -> Any:
            if sort == terms.I64:
                return eg.value_to_i64(value)
            if sort == terms.STRING:
                return eg.value_to_string(value)
            out = vec_cache.get(value)
            if out is None:
                out = vec_cache[value] = tuple(eg.value_to_i64(x) for x in eg.value_to_vec(value))
            return out

        funcs = fr.functions
        for name in sorted(funcs):
            fn = funcs[name]
            if name in terms.BY_CTOR or name in ("TNil", "TCons"):
                is_list = fn.output_sort == terms.TLIST
                for row in fn.rows:
                    if row.subsumed:
                        continue
                    children, slots = [], []
                    for value, sort in zip(row.inputs, fn.input_sorts):
                        if sort in (terms.T, terms.TLIST):
                            children.append(cls(value, sort == terms.TLIST))
                        else:
                            slots.append(prim(value, sort))
                    c = cls(row.output, is_list)
                    v.class_nodes[c].append(len(v.nodes))
                    v.node_class.append(c)
                    v.nodes.append(ENode(name, tuple(children), tuple(slots)))
        for row in funcs["N"].rows if "N" in funcs else ():
            v.handles[eg.value_to_i64(row.inputs[0])] = cls(row.output, False)
        for row in funcs["Args"].rows if "Args" in funcs else ():
            key = (eg.value_to_i64(row.inputs[0]), eg.value_to_i64(row.inputs[1]))
            v.list_handles[key] = cls(row.output, True)
        if analyses:
            for name, target, sort in (("shape", v.shape, terms.IVEC), ("dtype", v.dtype, terms.STRING),
                                       ("splat", v.splat, terms.STRING)):
                for row in funcs[name].rows if name in funcs else ():
                    c = cls_index.get(row.inputs[0])
                    if c is not None:
                        target[c] = prim(row.output, sort)
        return v

    def decode_slots(self, sorts: Sequence[str], inputs: Sequence[Any]) -> tuple:
        """The primitive (attribute) arguments of a frozen row, decoded."""
        out = []
        for value, sort in zip(inputs, sorts):
            if sort == terms.I64:
                out.append(self.eg.value_to_i64(value))
            elif sort == terms.STRING:
                out.append(self.eg.value_to_string(value))
            elif sort == terms.IVEC:
                out.append(tuple(self.eg.value_to_i64(x) for x in self.eg.value_to_vec(value)))
        return tuple(out)

    def same_class(self, a: int, b: int) -> bool:
        """Are loaded values a and b (load ids) proved equal?"""
        try:
            _, va = self.eg.eval_expr(call("N", lit(a)))
            _, vb = self.eg.eval_expr(call("N", lit(b)))
        except Exception as exc:
            raise error("NCC_IINT001", f"egglog: {exc}") from exc
        return va == vb

    # -- host-side helpers -------------------------------------------------------------------------

    def node_expr(self, node: ENode, child_exprs: Sequence[Any]) -> Any:
        """The egglog expression of an e-node, given an expression for each child class."""
        kids, slots = iter(child_exprs), iter(node.slots)
        args = [next(kids) if sort in (terms.T, terms.TLIST) else slot_expr(next(slots), sort)
                for sort in terms.ctor_sorts(node.ctor)]
        return call(node.ctor, *args)

    def union(self, pairs: Iterable[tuple[Any, Any]], splats: Iterable[tuple[Any, str]] = ()) -> None:
        actions = [eb.ActionCommand(eb.Union(SPAN, a, b)) for a, b in pairs]
        actions += [eb.ActionCommand(eb.Set(SPAN, "splat", [e], lit(s))) for e, s in splats]
        if actions:
            self._run(*actions)


@contextmanager
def _rust_stderr() -> Iterator[None]:
    """Hold back what egglog's Rust code writes to the process's stderr while it runs: a panic
    writes its message (and, with RUST_BACKTRACE set, a backtrace) there before Python sees the
    PanicException, which the caller turns into one coded line. Anything written without a panic
    is passed on."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no usable fd 2 (embedded use): leave it alone
        yield
        return
    panicked = False
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException as exc:
            panicked = type(exc).__name__ == "PanicException"
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if not panicked and held.tell():
                held.seek(0)
                sys.stderr.write(held.read().decode(errors="replace"))


def _output_ids(root: Node, ids: dict[int, int]) -> list[int]:
    """The load ids of the flattened outputs: through tuple nodes, else the root itself."""
    out: list[int] = []
    stack = [root]
    order: list[Node] = []
    while stack:
        n = stack.pop()
        if n.op == "tuple" and isinstance(n.type, TupleType):
            stack.extend(reversed(n.operands))
        else:
            order.append(n)
    for n in order:
        out.append(ids[n.id])
    return out


def _load_declarations() -> str:
    lines = ["(constructor N (i64) T :unextractable)", "(constructor Args (i64 i64) TList :unextractable)",
             "(function ld-vec (i64) IVec :no-merge)", "(ruleset load)"]
    for name, (keys, value) in _TABLES.items():
        lines.append(f"(function {name} ({' '.join(keys)}) {value} :no-merge)")
    lines.append("(rule ((= n (ld-nvarg i))) ((union (Args i n) (TNil))) :ruleset load)")
    lines.append("(rule ((= a (ld-varg i j))) ((union (Args i j) (TCons (N a) (Args i (+ j 1))))) :ruleset load)")
    lines.append("(rule ((= v (ld-shape i)) (= s (ld-vec v))) ((set (shape (N i)) s)) :ruleset load)")
    lines.append("(rule ((= t (ld-dtype i))) ((set (dtype (N i)) t)) :ruleset load)")
    lines.append("(rule ((= s (ld-splat i))) ((set (splat (N i)) s)) :ruleset load)")
    specs: list[tuple[str, int, bool, tuple[str, ...]]] = [
        (t.ctor, t.operands, t.variadic, t.slot_sorts) for t in terms.TERMS.values() if t.op != "constant"]
    specs += [("Constant", 0, False, (terms.I64,)), ("Opaque", 0, True, (terms.STRING, terms.I64))]
    for ctor, fixed, variadic, sorts in specs:
        facts = [f'(= "{ctor}" (ld-op i))']
        args = []
        for p in range(fixed):
            facts.append(f"(= a{p} (ld-arg i {p}))")
            args.append(f"(N a{p})")
        if variadic:
            args.append("(Args i 0)")
        slot_args = []
        for s, sort in enumerate(sorts):
            if sort == terms.I64:
                facts.append(f"(= s{s} (ld-i i {s}))")
            elif sort == terms.STRING:
                facts.append(f"(= s{s} (ld-s i {s}))")
            else:
                facts.append(f"(= k{s} (ld-v i {s}))")
                facts.append(f"(= s{s} (ld-vec k{s}))")
            slot_args.append(f"s{s}")
        if ctor == "Opaque":  # the op name comes first, the operand list last
            term = "(Opaque s0 s1 (Args i 0))"
        else:
            term = f"({ctor} {' '.join(args + slot_args)})"
        lines.append(f"(rule ({' '.join(facts)}) ((union (N i) {term})) :ruleset load)")
    return "\n".join(lines) + "\n"


def _generated_analysis() -> str:
    """Type rules of elementwise terms: the first operand's shape, its dtype (or pred)."""
    lines = []
    for t in terms.TERMS.values():
        if not t.elementwise:
            continue
        ops = " ".join(f"x{i}" for i in range(t.operands))
        slots = " ".join(f"a{i}" for i in range(len(t.slot_sorts)))
        pattern = f"({t.ctor} {ops} {slots})".replace(" )", ")")
        dtype = '"pred"' if t.pred_result else "t"
        facts = f"(= e {pattern}) (= s (shape x0))" + ("" if t.pred_result else " (= t (dtype x0))")
        lines.append(f"(rule ({facts}) ((set (shape e) s) (set (dtype e) {dtype})) :ruleset analysis "
                     f':name "analysis-{t.ctor}")')
    return "\n".join(lines) + "\n"


__all__ = ["EGraph", "ENode", "Loaded", "Sizes", "View", "splat_array", "splat_text", "uniform_value"]
