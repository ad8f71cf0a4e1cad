"""The HLO text front end: syntax forms, attribute decoding, checks and their diagnostics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nxsat import dtypes as dt
from nxsat.attrs import PadDim, SliceDim, WindowDim
from nxsat.diagnostics import NxsatError
from nxsat.frontend import loads
from nxsat.frontend.hlo import parse_hlo
from nxsat.interpreter import run_module
from nxsat.ir import TensorType, TupleType
from nxsat.printer import to_hlo_text


def frame_tables(file_name: str, line: int) -> str:
    """The stack-frame tables of newer XLA dumps, for one frame at ``file_name``:``line``."""
    return f"""
FileNames
1 {file_name}

FunctionNames
1 "f"

FileLocations
1 {{file_name_id=1 function_name_id=1 line={line} end_line={line} column=1 end_column=5}}

StackFrames
1 {{file_location_id=1 parent_frame_id=0}}
"""


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
    text = "HloModule m\n" + frame_tables('"model.py"', 3) + """
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


def test_nan_payloads_and_signs_keep_their_bits_through_parse_and_print():
    # XLA prints a NaN that is not the plain quiet NaN with its mantissa field: nan(0x1) is f32's
    # signaling NaN with payload 1, -nan(0x400001) a negative quiet NaN with payload 1.
    text = """HloModule m
ENTRY e {
  a = f32[4] constant({nan(0x1), -nan, -nan(0x400001), nan})
  b = bf16[2] constant({nan(0x41), -nan(0x1)})
  c = f8e5m2[1] constant({-nan(0x1)})
  ROOT t = (f32[4], bf16[2], f8e5m2[1]) tuple(a, b, c)
}
"""
    want = [[0x7F800001, 0xFFC00000, 0xFFC00001, 0x7FC00000], [0x7FC1, 0xFF81], [0xFD]]
    m = parse_hlo(text)
    for out, bits in zip(run_module(m, []), want):
        assert out.view(f"u{out.dtype.itemsize}").tolist() == bits
    printed = to_hlo_text(m)
    assert "constant({nan(0x1), -nan, -nan(0x400001), nan})" in printed
    again = loads(printed, "printed.hlo")
    for out, bits in zip(run_module(again, []), want):
        assert out.view(f"u{out.dtype.itemsize}").tolist() == bits
    e = err("HloModule m\nENTRY e {\n  ROOT b = bf16[1] constant({nan(0x80)})\n}\n")
    assert e.code == "NCC_EPRS003" and "7-bit mantissa" in e.message


def test_tuple_constant_becomes_a_tuple_of_constants():
    text = """HloModule m
ENTRY e {
  ROOT c = ((f32[2], s32[]), pred[]) constant((({1.5, -2}, 7), true))
}
"""
    m = parse_hlo(text)
    assert [(n.name, n.op) for n in m.entry.instructions] == [
        ("c.0.0", "constant"), ("c.0.1", "constant"), ("c.0", "tuple"), ("c.1", "constant"), ("c", "tuple")]
    a, b, c = run_module(m, [])
    assert a.tolist() == [1.5, -2.0] and int(b) == 7 and bool(c) is True
    e = err("HloModule m\nENTRY e {\n  ROOT c = (f32[], s32[]) constant((1))\n}\n")
    assert e.code == "NCC_EVRF064" and "1 tuple element(s), expected 2" in e.message
    # An elided tuple constant loads for inspection like an elided array.
    m = parse_hlo("HloModule m\nENTRY e {\n  ROOT c = (f32[2], s32[]) constant({...})\n}\n")
    assert m.entry.root.op == "tuple" and all(o.attrs["value"] is None for o in m.entry.root.operands)


def test_computation_attributes_shape_valued_attributes_and_deep_constants():
    text = """HloModule m
%async_body (p: f32[2]) -> f32[2] {
  %p = f32[2]{0} parameter(0)
  ROOT %n = f32[2]{0} negate(%p)
}, execution_thread="host"

ENTRY %e (x: f32[2]) -> f32[2] {
  %x = f32[2]{0} parameter(0)
  %k = f32[1,1,1,1,1,1,1,1,1,1,1,2] constant({{{{{{{{{{{{3, 4}}}}}}}}}}}})
  %o = f32[2]{0} custom-call(%x), custom_call_target="host_print", outfeed_shape=(f32[2]{0}, s32[])
  ROOT %r = f32[2]{0} call(%x), to_apply=%async_body
}
"""
    m = parse_hlo(text, "m.hlo")
    k = [n for n in m.entry.instructions if n.name == "k"][0]
    assert k.attrs["value"].ravel().tolist() == [3.0, 4.0]
    assert run_module(m, [np.array([1, 2], np.float32)])[0].tolist() == [-1, -2]
    assert any(w.code == "NCC_WPRS001" and "outfeed_shape" in w.message for w in m.warnings)


def test_c_escaped_strings_decode_to_the_model_source():
    # absl::CEscape writes bytes outside printable ASCII in octal: a UTF-8 path reads back whole.
    text = "HloModule m\n" + frame_tables(r'"/home/jos\303\251/model \"v2\".py"', 7) + r"""
ENTRY e {
  p = f32[2] parameter(0), metadata={op_name="caf\303\251" stack_frame_id=1}
  ROOT q = f32[2] negate(p), metadata={op_name="x" source_file="/tmp/caf\303\251.py" source_line=3}
}
"""
    m = parse_hlo(text)
    assert m.entry.params[0].loc.origin == '/home/jos\u00e9/model "v2".py:7'
    assert m.entry.root.loc.origin == "/tmp/caf\u00e9.py:3"


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
    # nxsat's fused operators are not HLO: only a model-type rule set makes one
    ("HloModule m\nENTRY e {\n  x = f32[2] parameter(0)\n  ROOT y = f32[2] softmax(x), dimension=0\n}\n", "NCC_EUOC002",
     "4:8"),
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
    ("HloModule m\nENTRY e {\n  x = f32[2] parameter(0)\n"
     "  ROOT c = pred[2] compare(x, x), direction=EQ, type=SIGN\n}\n", "NCC_EPRS003", "4:49"),
    ("HloModule m\nENTRY e {\n  ROOT i = pred[4] iota(), iota_dimension=0\n}\n", "NCC_EVRF064", "3:8"),
    ("HloModule m\nENTRY e {\n  ROOT c = f32[] parameter((0))\n}\n", "NCC_EPRS003", "3:8"),
    ("HloModule m\nENTRY e {\n  ROOT x = f6e2m3fn[2] parameter(0)\n}\n", "NCC_ESPP004", "3:12"),
    ("HloModule m, entry_computation_layout={(f32[?])->f32[]}\nENTRY e {\n  ROOT p = f32[] parameter(0)\n}\n",
     "NCC_EMOD025", "1:14"),
    ("HloModule m\nmx {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT m = f32[] maximum(a, b)\n}\n"
     "ENTRY e {\n  x = f32[4] parameter(0)\n  z = f32[] constant(0)\n"
     "  ROOT r = f32[5] reduce-window(x, z), window={size=0}, to_apply=mx\n}\n", "NCC_EPRS003", "10:40"),
    ("HloModule m\nENTRY e {\n  x = f32[2] parameter(0)\n  ROOT r = f32[2] all-gather(x), dimensions={0}, "
     "replica_groups=[2,2]<=[2,2]T(0,0)\n}\n", "NCC_EPRS003", "4:50"),
    ("HloModule m\nENTRY e {\n  x = f32[2] parameter(0)\n  ROOT r = f32[2] all-gather(x), dimensions={0}, "
     "replica_groups=[1,200000000]<=[200000000]\n}\n", "NCC_EPRS003", "4:50"),
    ("HloModule m\nENTRY e {\n  x = f32[2] parameter(0)\n  ROOT r = f32[2] all-gather(x), dimensions={0}, "
     "replica_groups={{0},junk}\n}\n", "NCC_EPRS003", "4:50"),
    ("HloModule m\nENTRY e {\n  x = f32[1] parameter(0)\n  ROOT b = f32[4] broadcast(x), dimensions={0}\n}\n",
     "NCC_EVRF064", "4:8"),
    ("HloModule m\nENTRY e {\n  x = f32[4,4] parameter(0)\n  i = s32[] parameter(1)\n  j = s64[] parameter(2)\n"
     "  ROOT d = f32[2,2] dynamic-slice(x, i, j), dynamic_slice_sizes={2,2}\n}\n", "NCC_EVRF064", "6:8"),
    ("HloModule m, input_output_alias={ {0}: (0, {}, may-alias) }\nENTRY e {\n  x = f32[2] parameter(0)\n"
     "  ROOT y = f32[3] parameter(1)\n}\n", "NCC_EVRF064", "1:14"),
    ("HloModule m, input_output_alias={ {1}: (0, {}, may-alias) }\nENTRY e {\n  ROOT x = f32[2] parameter(0)\n}\n",
     "NCC_EVRF064", "1:14"),
    ("HloModule m, input_output_alias={ {}: (3, {}, may-alias) }\nENTRY e {\n  ROOT x = f32[2] parameter(0)\n}\n",
     "NCC_EVRF064", "1:14"),
    ("HloModule m, input_output_alias={ {}: (0, {}, maybe) }\nENTRY e {\n  ROOT x = f32[2] parameter(0)\n}\n",
     "NCC_EPRS003", "1:14"),
    ("HloModule m, input_output_alias={ {}: 0 }\nENTRY e {\n  ROOT x = f32[2] parameter(0)\n}\n",
     "NCC_EPRS003", "1:14"),
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
    # A .hlo file is HLO even without a header or ENTRY (the last computation is the entry).
    assert loads("main {\n  ROOT p = f32[2] parameter(0)\n}\n", "model.hlo").entry.name == "main"
    with pytest.raises(NxsatError) as exc:
        loads("hello world", "model.bin")
    assert exc.value.code == "NCC_EFIL001"


def test_input_output_alias_says_which_parameter_each_output_returns():
    """resnet50's header donates its 320 state tensors: output k+1 is parameter k's buffer."""
    path = Path(__file__).parent / "data" / "hlo" / "resnet50_keras_jax_f32.hlo"
    m = parse_hlo(path.read_text(), str(path))
    aliases = m.attrs["output_aliases"]
    assert len(aliases) == 320 and all(aliases[k + 1] == k for k in range(320))
    nested = parse_hlo("HloModule m, input_output_alias={ {1, 0}: (1, {}), {0}: (0, {}, must-alias) }\n"
                       "ENTRY e {\n  a = f32[2] parameter(0)\n  b = s32[3] parameter(1)\n  t = (s32[3]) tuple(b)\n"
                       "  ROOT r = (f32[2], (s32[3])) tuple(a, t)\n}\n", "m.hlo")
    assert nested.attrs["output_aliases"] == {0: 0, 1: 1}
