"""The Relay text format itself: what the grammar accepts, how programs are structured and typed,
and the coded diagnostics for everything else."""

from __future__ import annotations

import json

import numpy as np
import pytest
from relay_testkit import DATA, relay

from nxsat import dtypes as dt
from nxsat.diagnostics import NxsatError
from nxsat.frontend import detect_framework, loads
from nxsat.frontend import relay as relay_frontend
from nxsat.interpreter import run_module
from nxsat.ir import TensorType, TupleType

HEAD = '#[version = "0.0.5"]\n'


def error_of(text, **kw) -> NxsatError:
    with pytest.raises(NxsatError) as e:
        relay.load(text, **kw)
    return e.value


def test_printer_output_with_annotations_comments_and_closures():
    """What TVM's printer writes after FuseOps: fused closures, `/* ty= */` on every binding,
    function attributes, comments."""
    text = (
        HEAD
        + """// a line comment
def @main(%x: Tensor[(1, 4), float32] /* ty=Tensor[(1, 4), float32] */) -> Tensor[(1, 4), float32] {
  %0 = fn (%p0: Tensor[(1, 4), float32], %p1: float32, Primitive=1) -> Tensor[(1, 4), float32] {
    %1 = multiply(%p0, %p1) /* ty=Tensor[(1, 4), float32] */;
    nn.relu(%1) /* ty=Tensor[(1, 4), float32] */
  } /* ty=fn (Tensor[(1, 4), float32], float32) -> Tensor[(1, 4), float32] */;
  %2 = %0(%x, -2f /* ty=float32 */) /* ty=Tensor[(1, 4), float32] */;
  /* a block
     comment */
  %0(%2, 0.5f) /* ty=Tensor[(1, 4), float32] */
}
"""
    )
    x = np.array([[-1, 2, -3, 4]], np.float32)
    (out,) = relay.run(text, x)
    np.testing.assert_array_equal(out, np.maximum(np.maximum(x * -2, 0) * 0.5, 0))


def test_printer_output_of_a_module_matches_the_parser_input():
    """mnist.printed.relay is mnist.relay as TVM's printer writes it: `/* ty=T span=... */` on
    every parameter, call and constant. Same program, same result."""
    spec = DATA / "mnist.consts.json"
    printed = relay.load((DATA / "mnist.printed.relay").read_text(), consts=spec, seed=3)
    plain = relay.load((DATA / "mnist.relay").read_text(), consts=spec, seed=3)
    x = np.random.default_rng(0).standard_normal((1, 1, 28, 28)).astype(np.float32)
    np.testing.assert_array_equal(run_module(printed, [x])[0], run_module(plain, [x])[0])


def test_annotations_are_checked_where_they_are_written(tmp_path):
    """Every `/* ty= */` the printer writes is checked: after an argument, a constant (against the
    constants file: NCC_ERLY003 at the constant) and a parameter."""
    text = (DATA / "mnist.printed.relay").read_text()
    spec = tmp_path / "c.json"
    shapes = json.loads((DATA / "mnist.consts.json").read_text())
    shapes[1][0] = [8]  # a vector where the text says (8, 1, 1)
    spec.write_text(json.dumps(shapes))
    e = error_of(text, consts=spec)
    assert e.code == "NCC_ERLY003" and (e.loc.line, e.loc.column) == (5, 16)
    assert "meta[relay.Constant][1] from" in e.message and "Tensor[(8), float32]" in e.message
    assert "/* ty=Tensor[(8, 1, 1), float32] */" in e.message
    wrong = text.replace("0f /* ty=float32 span=from_string:3:19", "0f /* ty=float16 span=from_string:3:19")
    e = error_of(wrong, consts=DATA / "mnist.consts.json")
    assert e.code == "NCC_EVRF064" and (e.loc.line, e.loc.column) == (3, 19)
    assert "value is float32 but the text annotates it /* ty=float16 */" in e.message
    wrong = text.replace("/* ty=Tensor[(1, 1, 28, 28), float32] span", "/* ty=Tensor[(1, 28, 28), float32] span")
    e = error_of(wrong, consts=DATA / "mnist.consts.json")
    assert e.code == "NCC_EVRF064" and (e.loc.line, e.loc.column) == (2, 11) and "%x is declared" in e.message
    # A parameter without a declared type takes the printer's annotation.
    m = relay.load(HEAD + "def @main(%x /* ty=Tensor[(2), float32] */) { %x }")
    assert m.params[0].type == TensorType(dt.F32, (2,))


def test_printed_function_and_expression_are_programs():
    """`print(mod["main"])` writes `fn (...) {...}`; printing an expression writes its free
    variables as `free_var %x: T;`. Either is a program: the parameters, or the free variables,
    in order, are @main's."""
    fn = (
        HEAD
        + """fn (%x: Tensor[(1, 4), float32] /* ty=Tensor[(1, 4), float32] */, %s: float32) -> Tensor[(1, 4), float32] {
  %0 = multiply(%x, %s) /* ty=Tensor[(1, 4), float32] */;
  nn.relu(%0) /* ty=Tensor[(1, 4), float32] */
} /* ty=fn (Tensor[(1, 4), float32], float32) -> Tensor[(1, 4), float32] */
"""
    )
    x = np.array([[-1, 2, -3, 4]], np.float32)
    np.testing.assert_array_equal(relay.run(fn, x, np.float32(2))[0], np.maximum(x * 2, 0))
    assert [p.name for p in relay.load(fn).params] == ["x", "s"]
    expr = (
        HEAD
        + """free_var %x: Tensor[(1, 4), float32] /* ty=Tensor[(1, 4), float32] */;
free_var %b: Tensor[(4), float32];
%0 = add(%x, %b) /* ty=Tensor[(1, 4), float32] */;
(%0, nn.relu(%0))
"""
    )
    b = np.array([1, 1, 1, 1], np.float32)
    s, r = relay.run(expr, x, b)
    np.testing.assert_array_equal(s, x + b)
    np.testing.assert_array_equal(r, np.maximum(x + b, 0))
    assert loads(expr, "expr.txt").framework == "RELAY"
    e = error_of(HEAD + "free_var %x;\n%x")
    assert e.code == "NCC_EVRF064" and "%x" in e.message and e.loc.line == 2
    assert error_of(HEAD + "free_var %x: float32;\nfree_var %x: float32;\n%x").code == "NCC_EPRS002"
    assert error_of(HEAD + "def @main() { 1f }\nfree_var %x: float32;\n%x").code == "NCC_EPRS001"


def test_comments_nest_as_in_tvm():
    text = (
        HEAD
        + """def @main(%x: Tensor[(2), float32]) {
  /* commented out, annotations and all:
  %0 = add(%x, 1f /* ty=float32 */) /* ty=Tensor[(2), float32] */;
  */
  %0 = multiply(%x, 2f) // a "quoted */ line comment
  ; %0 /* "a string /* in a comment" */ */
}
"""
    )
    x = np.array([1, 2], np.float32)
    np.testing.assert_array_equal(relay.run(text, x)[0], x * 2)
    e = error_of(HEAD + 'def @main() {\n  /* one /* two */\n  "/*" }')
    assert e.code == "NCC_EPRS001" and "unterminated" in e.message and (e.loc.line, e.loc.column) == (3, 3)


def test_let_tuples_projection_infix():
    text = (
        HEAD
        + """def @main(%a: Tensor[(3), float32], %b: Tensor[(3), float32])
        -> (Tensor[(3), float32], Tensor[(3), bool]) {
  let %t: (Tensor[(3), float32], Tensor[(3), float32]) = (%a + %b * 2f, %a - %b);
  let %u = (%t.0, );
  %0 = %u.0 / %t.1;
  (%0, %a < %b)
}
"""
    )
    a, b = np.array([1, 2, 3], np.float32), np.array([4, -5, 0.5], np.float32)
    out, cmp = relay.run(text, a, b)
    np.testing.assert_allclose(out, (a + b * 2) / (a - b))
    np.testing.assert_array_equal(cmp, a < b)


def test_device_placement_is_accepted_and_ignored():
    """After device planning the printer writes each parameter's and function's virtual device
    (with show_meta_data=True, as a metadata reference): the graph is the same."""
    text = (
        HEAD
        + """def @main(%x {virtual_device=meta[VirtualDevice][0]}: Tensor[(2), float32] /* ty=Tensor[(2), float32] */,
          %y {virtual_device=meta[VirtualDevice][0]}, virtual_device=meta[VirtualDevice][1]) {
  add(%x, 1f)
}
"""
    )
    x = np.array([1, 2], np.float32)
    np.testing.assert_array_equal(
        relay.run(text.replace("%y {virtual_device=meta[VirtualDevice][0]}, ", ""), x)[0], x + 1
    )
    e = error_of(text)
    assert e.code == "NCC_EVRF064" and "%y" in e.message  # %y has no type


def test_let_in_parentheses():
    """The printer wraps a let used as a value in parentheses: `%0 = (let %y = ...; %y);`."""
    text = (
        HEAD
        + """def @main(%x: Tensor[(2), float32]) {
  %0 = (
    let %y: Tensor[(2), float32] = add(%x, 1f);
    multiply(%y, %y)
  );
  (%0, (%x), (%1 = negative(%x); %1))
}
"""
    )
    x = np.array([1, 2], np.float32)
    out, same, neg = relay.run(text, x)
    np.testing.assert_array_equal(out, (x + 1) ** 2)
    np.testing.assert_array_equal(same, x)
    np.testing.assert_array_equal(neg, -x)
    assert error_of(HEAD + "def @main(%x: float32) { (let %y = %x; %y); %y }").code == "NCC_EPRS002"


def test_global_functions_become_calls():
    text = (
        HEAD
        + """def @square(%v: Tensor[(2), float32]) -> Tensor[(2), float32] {
  multiply(%v, %v)
}
def @pair(%v: Tensor[(2), float32]) -> (Tensor[(2), float32], Tensor[(2), float32]) {
  (@square(%v), %v)
}
def @main(%x: Tensor[(2), float32]) -> Tensor[(2), float32] {
  %0 = @pair(%x);
  add(%0.0, %0.1)
}
"""
    )
    m = relay.load(text)
    assert {"main", "pair", "square"} <= set(m.computations)
    assert [n.op for n in m.entry.post_order()].count("call") == 1
    x = np.array([3, -1], np.float32)
    np.testing.assert_array_equal(relay.run(text, x)[0], x * x + x)


def test_tuple_results_of_calls_feed_tuple_operators():
    text = (
        HEAD
        + """def @two(%v: Tensor[(2), float32]) -> (Tensor[(2), float32], Tensor[(2), float32]) {
  (%v, negative(%v))
}
def @main(%x: Tensor[(2), float32]) {
  concatenate(@two(%x), axis=0)
}
"""
    )
    x = np.array([1, 2], np.float32)
    np.testing.assert_array_equal(relay.run(text, x)[0], [1, 2, -1, -2])


def test_if_is_if_converted():
    text = (
        HEAD
        + """def @main(%c: bool, %x: Tensor[(2), float32]) {
  if (%c) { (%x, 1f) } else { let %y = negative(%x); (%y, 2f) }
}
"""
    )
    x = np.array([1, -2], np.float32)
    for c in (True, False):
        out, s = relay.run(text, np.array(c), x)
        np.testing.assert_array_equal(out, x if c else -x)
        assert float(s) == (1.0 if c else 2.0)
    e = error_of(HEAD + "def @main(%x: Tensor[(2), float32]) { if (%x) { %x } else { %x } }")
    assert e.code == "NCC_EVRF064" and "bool scalar" in e.message


@pytest.mark.parametrize(
    "literal,dtype,value",
    [
        ("2", dt.S32, 2),
        ("0i64", dt.S64, 0),
        ("-3i8", dt.S8, -3),
        ("2f", dt.F32, 2.0),
        ("1e-05f", dt.F32, 1e-5),
        ("0.044715f", dt.F32, 0.044715),
        ("3f16", dt.F16, 3.0),
        ("1.5f64", dt.F64, 1.5),
        ("-inff", dt.F32, -np.inf),
        ("True", dt.PRED, True),
        ("4294967296", dt.S64, 2**32),
    ],
)
def test_literals(literal, dtype, value):
    m = relay.load(HEAD + f"def @main() {{ {literal} }}")
    assert m.entry.result_type == TensorType(dtype, ())
    assert m.entry.root.attrs["value"] == np.asarray(value, dtype.np)


@pytest.mark.parametrize(
    "literal", ["1i7", "300i8", "1.5i32", "1f8", "99999999999999999999", "1" * 5000, "1i" + "6" * 5000]
)
def test_bad_literals(literal):
    assert error_of(HEAD + f"def @main() {{ {literal} }}").code == "NCC_EPRS003"


def test_types():
    text = (
        HEAD
        + """def @main(%a: Tensor[(), float32], %b: float16, %c: (Tensor[(1, 2), int8], (bool,)),
           %d: Tensor[(5,), uint8], %e: Tensor[(7), bfloat16]) {
  %c
}
"""
    )
    m = relay.load(text)
    types = [p.type for p in m.params]
    assert types[0] == TensorType(dt.F32, ()) and types[1] == TensorType(dt.F16, ())
    assert types[2] == TupleType((TensorType(dt.S8, (1, 2)), TupleType((TensorType(dt.PRED, ()),))))
    assert types[3] == TensorType(dt.U8, (5,)) and types[4] == TensorType(dt.BF16, (7,))
    assert [p.name for p in m.params] == ["a", "b", "c", "d", "e"]


def test_nodes_carry_locations_and_names():
    text = HEAD + "def @main(%x: Tensor[(2, 3), float32]) {\n  %0 = add(%x, 1f);\n  nn.softmax(%0)\n}\n"
    m = relay.load(text, filename="model.relay")
    nodes = [n for c in m.computations.values() for n in c.instructions]
    assert all(n.loc is not None and n.loc.file == "model.relay" and n.loc.line > 0 for n in nodes)
    add = next(n for n in nodes if n.op == "add" and n.name == "0")
    assert (add.loc.line, add.loc.column) == (3, 8)
    assert any(n.op == "reduce" and n.loc.line == 4 for n in nodes)


def test_metadata_section_is_cut_off():
    text = (
        HEAD
        + "def @main(%x: Tensor[(2), float32]) { %x }\n#[metadata]\n"
        + '{"root": 1, "nodes": [{}, {"type_key": "Map"}]}\n'
    )
    x = np.array([1, 2], np.float32)
    np.testing.assert_array_equal(relay.run(text, x)[0], x)


def test_framework_detection_and_dispatch(tmp_path):
    text = HEAD + "def @main(%x: Tensor[(2), float32]) { %x }"
    assert detect_framework("m.relay", "") == "RELAY"
    assert detect_framework("m.txt", text) == "RELAY"
    m = loads(text, "m.txt")
    assert m.framework == "RELAY"
    spec = tmp_path / "c.json"
    spec.write_text('[[[2], "float32"]]')
    m = loads(HEAD + "def @main() { meta[relay.Constant][0] }", "m.relay", "RELAY", relay_constants=spec, seed=3)
    assert m.entry.root.attrs["value"].shape == (2,)


def test_version_other_than_005_warns():
    m = relay.load('#[version = "0.0.4"]\ndef @main(%x: Tensor[(2), float32]) { %x }')
    assert [w.code for w in m.warnings] == ["NCC_WPRS001"]


# --- diagnostics -----------------------------------------------------------------------------


def test_syntax_error_position():
    e = error_of(
        HEAD + "def @main(%x: Tensor[(2), float32]) {\n  %0 = add(%x, %x;\n  %0\n}\n",
        filename="bad.relay",
    )
    assert e.code == "NCC_EPRS001"
    assert (e.loc.file, e.loc.line, e.loc.column) == ("bad.relay", 3, 18)
    assert e.format().startswith("bad.relay:3:18: error NCC_EPRS001")
    e = error_of(HEAD + "def @main(%x: Tensor[(2), float32]) {\n  add(%x, %x)\n")
    assert e.code == "NCC_EPRS001" and "end of text" in e.message
    assert error_of(HEAD + "def @main() { $ }").code == "NCC_EPRS001"


@pytest.mark.parametrize(
    "body,code,words",
    [
        ("add(%x, %nope)", "NCC_EPRS002", "%nope"),
        ("@nowhere(%x)", "NCC_EPRS002", "@nowhere"),
        ("%0 = %x; %0 = %x; %0", "NCC_EPRS002", "bound twice"),
        ("nn.relu(%x, alpha=1)", "NCC_EPRS003", "no attribute alpha"),
        ('nn.softmax(%x, axis="one")', "NCC_EPRS003", "axis"),
        ("nn.softmax(%x, axis=0, axis=0)", "NCC_EPRS003", "twice"),
        ("reshape(%x)", "NCC_EPRS003", "newshape"),
        ("nn.frobnicate(%x)", "NCC_EUOC002", "nn.frobnicate"),
        ("qnn.dense(%x, %x)", "NCC_EUOC002", "quantized"),
        ("dyn.reshape(%x, %x)", "NCC_EMOD025", "dynamic"),
        ("Cons(%x)", "NCC_EUOC002", "constructor Cons"),
        ("match (%x) { _ => %x }", "NCC_EUOC002", "match"),
        ("ref(%x)", "NCC_EUOC002", "references"),
        ("%f = fn (%y) { %y }; %f", "NCC_EUOC002", "closure"),
        ("(%x, None)", "NCC_EUOC002", "operator None used as a value"),
        ("if (True) { (%x, nn.relu) } else { (%x, %x) }", "NCC_EUOC002", "nn.relu"),
        ("(fn (%y) { %y }, %x).1", "NCC_EUOC002", "closure"),
        ("%x.0", "NCC_EVRF064", "not a tuple"),
        ("(%x, %x).2", "NCC_EVRF064", "out of range"),
        ("add(%x)", "NCC_EVRF064", "2 arguments"),
        ("meta[relay.attrs.Conv2DAttrs][0]", "NCC_EPRS003", "meta"),
        ("meta[relay.Constant][0]", "NCC_ERLY002", "--relay-constants"),
    ],
)
def test_diagnostics(body, code, words):
    e = error_of(HEAD + f"def @main(%x: Tensor[(2), float32]) {{ {body} }}")
    assert e.code == code, e
    assert words in e.format()
    assert e.loc is not None and e.loc.line == 2


def test_unsupported_constructs_name_themselves():
    e = error_of(HEAD + "type List[A] { Cons(A, List[A]), Nil }\ndef @main() { 1f }")
    assert e.code == "NCC_EUOC002" and "type definitions" in e.message
    e = error_of(HEAD + "def @f(%x: float32) -> float32 { @f(%x) }\ndef @main(%x: float32) { @f(%x) }")
    assert e.code == "NCC_EUOC002" and "recursive function @f" in e.message
    e = error_of(HEAD + "def @main[A](%x: A) { %x }")
    assert e.code == "NCC_EUOC002"


def test_type_errors_point_at_the_binding():
    text = (
        HEAD
        + "def @main(%x: Tensor[(2, 3), float32]) -> Tensor[(3, 2), float32] {\n"
        + "  %0 = nn.relu(%x);\n  %0\n}\n"
    )
    e = error_of(text)
    assert e.code == "NCC_EVRF064" and e.loc.line == 4 and "declared to return" in e.message
    text = HEAD + "def @main(%x: Tensor[(2, 3), float32]) {\n  let %y: Tensor[(3), float32] = nn.relu(%x);\n  %y\n}\n"
    e = error_of(text)
    assert e.code == "NCC_EVRF064" and (e.loc.line, e.loc.column) == (3, 3)
    text = (
        HEAD
        + "def @main(%x: Tensor[(2, 3), float32]) {\n"
        + "  %0 = nn.relu(%x) /* ty=Tensor[(2, 3), int8] */;\n  %0\n}\n"
    )
    e = error_of(text)
    assert e.code == "NCC_EVRF064" and e.loc.line == 3 and "annotates" in e.message
    text = HEAD + "def @main(%x: Tensor[(2, 3), float32]) {\n  %0 = nn.dense(%x, transpose(%x));\n  %0\n}\n"
    e = error_of(text)
    assert e.code == "NCC_EVRF064" and (e.loc.line, e.loc.column) == (3, 8)


def test_structure_errors():
    assert error_of(HEAD).code == "NCC_EPRS004"
    assert error_of(HEAD + "def @f() { 1f }").code == "NCC_EPRS004"
    assert error_of(HEAD + "def @main() { 1f }\ndef @main() { 2f }").code == "NCC_EPRS002"
    assert error_of(HEAD + "def @main(%x) { %x }").code == "NCC_EVRF064"
    assert error_of(HEAD + "def @main(%x: float32, %x: float32) { %x }").code == "NCC_EPRS002"
    assert error_of(HEAD + "def @main(%x: Tensor[(?, 2), float32]) { %x }").code == "NCC_EMOD025"
    assert error_of(HEAD + "def @main(%x: Tensor[(2), float7]) { %x }").code == "NCC_ESPP004"
    assert error_of(HEAD + "def @main(%x: Tensor[(2), wibble]) { %x }").code == "NCC_EPRS003"
    assert error_of(HEAD + "def @main() { %0 = 1f; }").code == "NCC_EPRS001"


def test_huge_numbers_are_diagnostics():
    """Digit strings longer than Python converts (4300 digits) are coded errors, not crashes."""
    digits = "1" * 5000
    e = error_of(HEAD + f"def @main(%x: (float32, float32)) {{ %x.{digits} }}")
    assert e.code == "NCC_EPRS003" and e.loc.line == 2
    assert error_of(HEAD + f"def @main(%x: Tensor[({digits}), float32]) {{ %x }}").code == "NCC_ESHP001"
    assert error_of(HEAD + f"def @main() {{ meta[relay.Constant][{digits}] }}").code == "NCC_EPRS003"
    m = relay.load(HEAD + "def @main() { 3.14159265358979323846264338327950288419716939937510f }")
    assert m.entry.root.attrs["value"] == np.float32(np.pi)


def test_node_limit_stops_closure_inlining(monkeypatch):
    """Closures calling closures inline exponentially; the node budget stops them (lowered here
    so the test is fast: the real limit takes tens of seconds to reach)."""
    monkeypatch.setattr(relay_frontend, "MAX_NODES", 5_000)
    lines = [HEAD + "def @main(%x: Tensor[(2), float32]) {", "  %f0 = fn (%a: Tensor[(2), float32]) { add(%a, 1f) };"]
    for i in range(1, 12):
        lines.append(f"  %f{i} = fn (%a: Tensor[(2), float32]) {{ %0 = %f{i - 1}(%a); %f{i - 1}(%0) }};")
    lines.append("  %f11(%x)\n}")
    e = error_of("\n".join(lines))
    assert e.code == "NCC_EVRF007" and "5000" in e.message


def test_depth_limit_is_a_diagnostic():
    deep = "negative(" * 400 + "%x" + ")" * 400
    e = error_of(HEAD + f"def @main(%x: float32) {{ {deep} }}")
    assert e.code == "NCC_EPRS001" and "nested" in e.message


def test_int64_inputs_warn_once():
    text = (
        HEAD
        + """def @main(%ids: Tensor[(2, 3), int64], %pos: Tensor[(3), int64],
           %table: Tensor[(10, 4), float32]) {
  %0 = less(%ids, 0i64);
  %1 = add(%ids, 10i64);
  %2 = where(%0, %1, %ids);
  %3 = add(%2, %pos);
  take(%table, %3, axis=0)
}
"""
    )
    m = relay.load(text)
    warnings = list(m.warnings)
    assert [w.code for w in warnings] == ["NCC_WTYP001"]
    assert "ids" in warnings[0].message and "pos" in warnings[0].message
    ids = np.array([[1, -1, 2], [0, 3, -10]], np.int64)
    pos = np.array([0, 1, 2], np.int64)
    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    (out,) = relay.run(text, ids, pos, table)
    np.testing.assert_array_equal(out, table[np.clip(np.where(ids < 0, ids + 10, ids) + pos, 0, 9)])
    m = relay.load(HEAD + 'def @main(%x: Tensor[(2), int32]) { cast(%x, dtype="int64") }')
    assert [w.code for w in m.warnings] == ["NCC_WTYP001"]
    assert not list(relay.load(HEAD + "def @main(%x: Tensor[(2), int32]) { %x }").warnings)
