"""The HLO text front end: syntax forms, attribute decoding, checks and their diagnostics."""

from __future__ import annotations

import numpy as np
import pytest

from nxsat import dtypes as dt
from nxsat.attrs import PadDim, SliceDim, WindowDim
from nxsat.diagnostics import NxsatError
from nxsat.frontend import loads
from nxsat.frontend.hlo import parse_hlo
from nxsat.interpreter import run_module
from nxsat.ir import TensorType, TupleType


def err(text: str) -> NxsatError:
    with pytest.raises(NxsatError) as exc:
        parse_hlo(text, "m.hlo")
    return exc.value


NEW_STYLE = """HloModule m, entry_computation_layout={(f32[2,3]{1,0})->f32[3,2]{1,0}}

ENTRY main.1 {
  x.1 = f32[2,3]{1,0} parameter(0)
  ROOT t.1 = f32[3,2]{1,0} transpose(x.1), dimensions={1,0}
}
"""

OLD_STYLE = """HloModule IrToHlo.7

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(f32[] %a, f32[] %b)
}

ENTRY %main (p: f32[4,5]) -> (f32[4]) {
  %p = f32[4,5]{1,0} parameter(0)
  %zero = f32[] constant(0)
  %r = f32[4]{0} reduce(f32[4,5]{1,0} %p, f32[] %zero), dimensions={1}, to_apply=%add
  ROOT %t = (f32[4]{0}) tuple(f32[4]{0} %r)
}
"""


def test_new_style_module():
    m = parse_hlo(NEW_STYLE)
    assert m.name == "m" and len(m.entry.params) == 1
    assert m.entry.root.op == "transpose" and m.entry.root.attrs["dimensions"] == (1, 0)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(run_module(m, [x])[0], x.T)


def test_old_style_with_operand_shapes_signatures_and_tuple_root():
    m = parse_hlo(OLD_STYLE)
    assert m.entry.root.type == TupleType((TensorType(dt.F32, (4,)),))
    assert m.entry.root.operands[0].attrs["to_apply"].name == "add"
    x = np.ones((4, 5), np.float32)
    np.testing.assert_array_equal(run_module(m, [x])[0], np.full(4, 5, np.float32))


def test_no_entry_keyword_makes_the_last_computation_the_entry_and_order_is_free():
    text = """HloModule m
main {
  ROOT r = f32[2] add(x, y)
  x = f32[2] parameter(0)
  y = f32[2] constant({1, 2})
}
"""
    m = parse_hlo(text)
    np.testing.assert_array_equal(run_module(m, [np.zeros(2, np.float32)])[0], [1, 2])


def test_comments_index_markers_tiling_layouts_and_metadata():
    text = """/* a file comment */
HloModule m, is_scheduled=true, entry_computation_layout={(bf16[8,128]{1,0:T(8,128)(2,1)})->(bf16[8,128], s32[])}

ENTRY %e (p: bf16[8,128]) -> (bf16[8,128], s32[]) {
  %p = bf16[8,128]{1,0:T(8,128)(2,1)} parameter(0), metadata={op_name="jit(f)/x" source_file="model.py" source_line=12}
  %c = s32[] constant(3), sharding={replicated}
  // a line comment
  ROOT %t = (bf16[8,128]{1,0}, /*index=1*/s32[]) tuple(%p, %c), frontend_attributes={a="b"}
}
"""
    m = parse_hlo(text, "m.hlo")
    p = m.entry.params[0]
    assert p.type == TensorType(dt.BF16, (8, 128))
    assert p.loc.origin == "model.py:12" and p.loc.line == 5


def test_stack_frame_tables_are_accepted():
    text = """HloModule m

FileNames
1 "model.py"

FunctionNames
1 "f"

FileLocations
1 {file_name_id=1 function_name_id=1 line=3 end_line=3 column=1 end_column=5}

StackFrames
1 {file_location_id=1 parent_frame_id=0}

ENTRY e {
  ROOT p = f32[2] parameter(0), metadata={op_name="x" stack_frame_id=1}
}
"""
    m = parse_hlo(text)
    assert m.entry.root.op == "parameter"
    assert m.entry.root.loc.origin == "model.py:3"


def test_attribute_forms_are_decoded():
    text = """HloModule m
ENTRY e {
  x = f32[1,3,8,8] parameter(0)
  w = f32[4,3,3,3] parameter(1)
  c = f32[1,4,4,4] convolution(x, w), window={size=3x3 stride=2x2 pad=1_1x1_1 rhs_dilate=1x1},
      dim_labels=bf01_oi01->bf01
  s = f32[1,2,4,4] slice(c), slice={[0:1], [0:4:2], [0:4], [0:4]}
  z = f32[] constant(0)
  ROOT p = f32[1,2,5,8] pad(s, z), padding=0_0x0_0x0_1x1_0_1
}
"""
    m = parse_hlo(text)
    nodes = {n.name: n for n in m.entry.instructions}
    assert nodes["c"].attrs["window"] == (WindowDim(3, 2, 1, 1), WindowDim(3, 2, 1, 1))
    assert nodes["c"].attrs["dims"].labels() == "bf01_oi01->bf01"
    assert nodes["s"].attrs["slice"][1] == SliceDim(0, 4, 2)
    assert nodes["p"].attrs["padding"][3] == PadDim(1, 0, 1)


def test_constants_scalars_arrays_specials_and_bools():
    text = """HloModule m
ENTRY e {
  a = f32[2,2] constant({ {1.5, -2}, {inf, -inf} })
  b = f32[] constant(nan)
  c = pred[3] constant({true, false, true})
  d = s8[2] constant({-128, 127})
  e = u64[] constant(18446744073709551615)
  f = bf16[] constant(1e-05)
  ROOT t = (f32[2,2], f32[], pred[3], s8[2], u64[], bf16[]) tuple(a, b, c, d, e, f)
}
"""
    m = parse_hlo(text)
    a, b, c, d, e, f = run_module(m, [])
    np.testing.assert_array_equal(a, [[1.5, -2], [np.inf, -np.inf]])
    assert np.isnan(b) and c.tolist() == [True, False, True] and d.tolist() == [-128, 127]
    assert int(e) == 2**64 - 1 and f.dtype == dt.BF16.np
    assert [w.code for w in m.warnings] == ["NCC_WTYP001"]  # u64 warns once


def test_elided_constant_loads_and_fails_only_when_run():
    text = "HloModule m\nENTRY e {\n  ROOT c = f32[1000] constant({...})\n}\n"
    m = parse_hlo(text, "m.hlo")
    assert m.entry.root.attrs["value"] is None
    with pytest.raises(NxsatError) as exc:
        run_module(m, [])
    assert exc.value.code == "NCC_ECON001" and "m.hlo:3:8" in exc.value.format()


def test_call_while_conditional_and_topk_custom_call():
    text = """HloModule m
body {
  s = (s32[], f32[2]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  v = f32[2] get-tuple-element(s), index=1
  one = s32[] constant(1)
  two = f32[2] constant({2, 2})
  ROOT n = (s32[], f32[2]) tuple(add(i, one), multiply(v, two))
}
"""
    # Nested instruction syntax is not HLO: operands must be names. Check the error, then the real form.
    e = err(text + "ENTRY e {\n ROOT p = f32[2] parameter(0)\n}\n")
    assert e.code == "NCC_EPRS001"
    text = """HloModule m
body {
  s = (s32[], f32[2]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  v = f32[2] get-tuple-element(s), index=1
  one = s32[] constant(1)
  two = f32[2] constant({2, 2})
  i2 = s32[] add(i, one)
  v2 = f32[2] multiply(v, two)
  ROOT n = (s32[], f32[2]) tuple(i2, v2)
}
cond {
  s = (s32[], f32[2]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  lim = s32[] constant(3)
  ROOT lt = pred[] compare(i, lim), direction=LT
}
neg { a = f32[2] parameter(0)
  ROOT n = f32[2] negate(a) }
ident { a = f32[2] parameter(0)
  ROOT n = f32[2] copy(a) }
ENTRY e {
  x = f32[2] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[2]) tuple(zero, x)
  w = (s32[], f32[2]) while(init), condition=cond, body=body
  v = f32[2] get-tuple-element(w), index=1
  k = s32[] constant(1)
  c = f32[2] conditional(k, v, v), branch_computations={neg, ident}
  tk = (f32[1], s32[1]) custom-call(c), custom_call_target="TopK"
  ROOT r = f32[1] get-tuple-element(tk), index=0
}
"""
    m = parse_hlo(text)
    assert run_module(m, [np.array([1.0, 5.0], np.float32)])[0].tolist() == [40.0]
    topk = [n for n in m.entry.instructions if n.name == "tk"][0]
    assert topk.op == "topk" and topk.attrs == {"k": 1, "largest": True}


@pytest.mark.parametrize("text,code,where", [
    ("HloModule m\nENTRY e {\n  x = f32[2] parameter(0)\n  ROOT y = f32[3] negate(x)\n}\n", "NCC_EVRF064", "4:8"),
    ("HloModule m\nENTRY e {\n  x = f32[?,2] parameter(0)\n  ROOT y = f32[2] negate(x)\n}\n", "NCC_EMOD025", "3:7"),
    ("HloModule m\nENTRY e {\n  x = f32[<=4] parameter(0)\n  ROOT y = f32[4] negate(x)\n}\n", "NCC_EMOD025", "3:7"),
    ("HloModule m\nENTRY e {\n  ROOT x = c64[2] parameter(0)\n}\n", "NCC_EVRF004", "3:12"),
    ("HloModule m\nENTRY e {\n  ROOT x = f8e4m3fnuz[2] parameter(0)\n}\n", "NCC_EVRF005", "3:12"),
    ("HloModule m\nENTRY e {\n  ROOT x = s4[2] parameter(0)\n}\n", "NCC_ESPP004", "3:12"),
    ("HloModule m\nENTRY e {\n  x = f32[2] parameter(0)\n  ROOT y = f32[2] frobnicate(x)\n}\n", "NCC_EUOC002", "4:8"),
    ("HloModule m\nENTRY e {\n  ROOT y = f32[2] negate(x)\n}\n", "NCC_EPRS002", "3:26"),
    ("HloModule m\nENTRY e {\n  x = f32[2] parameter(0)\n  ROOT y = f32[2] negate(x\n}\n", "NCC_EPRS001", "5:1"),
    ("HloModule m\nENTRY e {\n  x = f32[2] parameter(0)\n  x = f32[2] parameter(1)\n}\n", "NCC_EPRS002", "4:3"),
    ("HloModule m\nENTRY e {\n  x = f32[2] parameter(1)\n}\n", "NCC_EPRS004", "3:3"),
    ("HloModule m\nENTRY e {\n  x = f32[2] parameter(0)\n  ROOT y = f32[2] transpose(x), dimensions={1,0}\n}\n",
     "NCC_EVRF064", "4:8"),
    ("HloModule m\nENTRY e {\n  x = f32[4] parameter(0)\n  ROOT y = f32[2] slice(x), slice={0:2}\n}\n",
     "NCC_EPRS003", "4:29"),
    ("HloModule m\nENTRY e {\n  x = f32[2] parameter(0)\n  ROOT y = f32[2] reduce(x, x), to_apply=nope\n}\n",
     "NCC_EPRS002", "4:33"),
    ("HloModule m, entry_computation_layout={(f32[3])->f32[3]}\nENTRY e {\n  ROOT x = f32[2] parameter(0)\n}\n",
     "NCC_EVRF064", "1:14"),
    ("HloModule m\nENTRY e {\n  ROOT c = f32[2] constant({1, 2, 3})\n}\n", "NCC_EVRF064", "3:28"),
    ("HloModule m\nENTRY e {\n  ROOT c = s8[] constant(300)\n}\n", "NCC_EPRS003", "3:26"),
    ("HloModule m\n", "NCC_EPRS004", "1:11"),
    ("HloModule m\nENTRY e {\n  x = f32[2] parameter(0), metadata={op_name=\"x\"\n}\n", "NCC_EPRS001", ""),
    ("HloModule m\na {\n  ROOT r = f32[] call(), to_apply=b\n}\nb {\n  ROOT r = f32[] call(), to_apply=a\n}\n",
     "NCC_EPRS002", ""),
])
def test_bad_input_gives_one_coded_line_with_location(text, code, where):
    e = err(text)
    assert e.code == code, e.format()
    line = e.format()
    assert "\n" not in line and line.startswith("m.hlo:")
    if where:
        assert f"m.hlo:{where}:" in line, line


def test_int64_warns_once_with_location():
    text = """HloModule m
ENTRY e {
  a = s64[2] parameter(0)
  b = s64[2] negate(a)
  ROOT c = s64[2] add(a, b)
}
"""
    m = parse_hlo(text, "m.hlo")
    ws = [w for w in m.warnings if w.code == "NCC_WTYP001"]
    assert len(ws) == 1 and ws[0].loc.line == 3
    x = np.array([2**40, -5], np.int64)
    np.testing.assert_array_equal(run_module(m, [x])[0], [0, 0])  # the reference keeps 64 bits


def test_unknown_attribute_is_ignored_with_a_warning_and_unsupported_op_loads_for_inspection():
    text = """HloModule m
ENTRY e {
  x = f32[4] parameter(0), mystery={1}
  ROOT f = f32[4] cholesky(x)
}
"""
    m = parse_hlo(text, "m.hlo")
    codes = {w.code for w in m.warnings}
    assert codes == {"NCC_WPRS001", "NCC_WUOC001"}
    with pytest.raises(NxsatError) as exc:
        run_module(m, [np.ones(4, np.float32)])
    assert exc.value.code == "NCC_EUOC002" and "cholesky" in exc.value.message


def test_unknown_custom_call_target():
    text = ('HloModule m\nENTRY e {\n  x = f32[4] parameter(0)\n'
            '  ROOT c = f32[4] custom-call(x), custom_call_target="Foo"\n}\n')
    m = parse_hlo(text, "m.hlo")
    with pytest.raises(NxsatError) as exc:
        run_module(m, [np.ones(4, np.float32)])
    assert exc.value.code == "NCC_EVRF015"


def test_framework_detection():
    assert loads(NEW_STYLE, "model.txt").name == "m"
    with pytest.raises(NxsatError) as exc:
        loads("hello world", "model.bin")
    assert exc.value.code == "NCC_EFIL001"
