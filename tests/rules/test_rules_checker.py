"""The rule checker: every shipped rule passes; planted unsound rules are caught with a
counterexample; approximate rules are held to their bound."""

from __future__ import annotations

import numpy as np
import pytest

from nxsat.rules.catalog import build_catalog, catalog
from nxsat.rules.checker import agree, check_rule, check_rules

PLANTED = """
(rewrite (Subtract x y) (Subtract y x)
  :name planted-subtract-swap :tag exact :doc "swaps the operands of subtract")
(rewrite (Transpose (Transpose x p) q) x
  :name planted-transpose-cancel :tag exact :doc "cancels two transposes without checking p and q")
(rewrite (Abs (Negate x)) (Abs x)
  :name planted-abs-negate :tag exact :doc "forgets that unsigned negation wraps")
(rewrite (Multiply x z) z :when ((= (splat z) "0"))
  :name planted-multiply-zero-float :tag exact :doc "x * 0 = 0 without the integer guard (NaN * 0 is NaN)")
(rewrite (Subtract x x) (Fill "0" t s) :when ((= t (dtype x)) (= s (shape x)))
  :name planted-subtract-self-float :tag exact :doc "x - x = 0 without the integer guard (inf - inf is NaN)")
(rewrite (Transpose (Transpose x p) q) (Transpose x (compose q p)) :when ((= (vec-length p) (vec-length q)))
  :name planted-transpose-wrong-order :tag exact :doc "composes the permutations the wrong way round")
(rewrite (Broadcast x s d) x :when ((= s (shape x)))
  :name planted-broadcast-identity :tag exact :doc "forgets that a same-shape broadcast can permute")
(rewrite (Convert (Convert x b) c) (Convert x c) :when ((float-type (dtype x)) (float-type b))
  :name planted-convert-float-chain :tag exact :doc "forgets that a narrower float rounds")
(rewrite (Convert (Convert x b) c) (Convert x c) :when ((int-type (dtype x)) (int-type b))
  :name planted-convert-int-chain :tag exact :doc "forgets that a narrower integer wraps")
(rewrite (Convert (Convert x b) c) (Convert x c) :when ((lossless-convert (dtype x) b))
  :name planted-convert-through-float :tag exact
  :doc "s32 -> f64 keeps every value, but then f64 -> s8 saturates where s32 -> s8 wraps")
(rewrite (Slice (Concatenate l d) a b c) (Slice x a b c)
  :when ((= l (TCons x r)) (= s (shape x)) (rank-dim (vec-length s) d) (<= (vec-get b d) (+ (vec-get s d) 1)))
  :name planted-slice-concatenate-off-by-one :tag exact :doc "lets the slice end one past the first operand")
(rule ((= e (Dot a b lc rc lb rb t pl pr)) (= s (shape e))
       (= nb (vec-length lb))
       (= fa (- (vec-length (shape a)) (+ nb (vec-length lc))))
       (= fb (- (vec-length (shape b)) (+ nb (vec-length rc))))
       (= (vec-length s) (+ nb (+ fa fb))) (> (vec-length s) 0))
      ((union e (Transpose (Dot b a rc lc rb lb t pr pl)
                           (vec-append (vec-append (range 0 nb) (range (+ nb fb) (+ nb (+ fb fa))))
                                       (range nb (+ nb fb))))))
  :name planted-dot-swap-default-type :tag exact
  :doc "swaps a dot's operands keeping the default result type (f16 x bf16 is f16, bf16 x f16 is bf16)")
(rewrite (Convert (Convert x "f16") "bf16") x :when ((= (dtype x) "bf16"))
  :name planted-bf16-through-f16 :tag exact :doc "forgets that f16's range is narrower (1e5 is inf in f16)")
(rewrite (Multiply (Multiply x y) z) (Multiply x (Multiply y z))
  :name planted-multiply-associate-unmarked :tag exact :doc "reassociates without :reassociates")
(rewrite (Multiply (Add x y) z) (Add (Multiply x z) (Multiply y z))
  :name planted-distribute-unmarked :tag exact :doc "distributes without :distributes (inf * (1 + -1))")
(rewrite (Multiply (Add x y) z) (Add (Multiply x z) (Multiply y z))
  :distributes :name planted-distribute :tag exact :doc "distributes a product over a sum")
(rewrite (Convert (Convert x "bf16") "f32") x :when ((= (dtype x) "f32"))
  :name planted-bf16-round-trip :tag approximate :bound 0.01 :doc "rounding to bf16 and back is close")
(rewrite (Convert (Convert x "bf16") "f32") x :when ((= (dtype x) "f32"))
  :name planted-bf16-too-tight :tag approximate :bound 0.00001 :doc "claims more precision than bf16 has")
(rewrite (Convert (Convert x "bf16") "f32") x :when ((= (dtype x) "f32"))
  :name planted-bf16-bound-too-small :tag approximate :bound 0.0015
  :doc "bf16 rounds by up to 2^-8 (0.0039) relative: this bound is 2.6x too small")
"""


@pytest.fixture(scope="module")
def planted():
    return build_catalog(extra_files=[("planted", "planted.egg", PLANTED)])


def test_every_shipped_rule_is_sound_and_tested():
    cat = catalog()
    results = check_rules(cat.rules, cat)
    bad = [r.format() for r in results if r.status not in ("sound", "built-in")]
    assert not bad, "\n".join(bad)
    assert sum(r.status == "sound" for r in results) == sum(not r.builtin for r in cat.rules)
    for r in results:
        if r.status == "sound":
            assert r.fired >= 1 and r.tried >= r.fired


@pytest.mark.parametrize("name", ["planted-subtract-swap", "planted-transpose-cancel", "planted-abs-negate",
                                  "planted-multiply-zero-float", "planted-subtract-self-float",
                                  "planted-transpose-wrong-order", "planted-broadcast-identity",
                                  "planted-convert-float-chain", "planted-convert-int-chain",
                                  "planted-convert-through-float", "planted-bf16-through-f16",
                                  "planted-slice-concatenate-off-by-one", "planted-dot-swap-default-type"])
def test_planted_unsound_rules_are_caught_with_a_counterexample(planted, name):
    (rule,) = planted.find([name])
    r = check_rule(rule, planted)
    assert r.status == "unsound", r.format()
    cx = r.counterexample
    assert cx is not None and cx.instance and cx.rhs and cx.why
    text = r.format()
    assert "instance:" in text and "left-hand side gives" in text and "right-hand side gives" in text
    if name == "planted-subtract-swap":
        assert "subtract(" in cx.instance and "Subtract" in cx.rhs
        (x, y) = cx.inputs.values()
        np.testing.assert_array_equal(np.asarray(cx.expected, np.float64),
                                      (np.asarray(x, np.float64) - np.asarray(y, np.float64)).astype(
                                          np.asarray(cx.expected).dtype).astype(np.float64))
        assert agree(cx.expected, cx.got, None, 1.0) is not None
    if name == "planted-transpose-cancel":
        assert cx.instance.count("transpose(") == 2


def test_the_range_trial_finds_what_ordinary_values_do_not(planted):
    """bf16 -> f16 -> bf16 = x holds for every value of ordinary size, NaN, inf and zeros (it passed
    before the trial at each type's extremes); a reassociation overflows differently there, which is
    why rules marked :reassociates (add-associate, multiply-associate) skip that trial."""
    (through_f16, unmarked) = planted.find(["planted-bf16-through-f16", "planted-multiply-associate-unmarked"])
    assert check_rule(through_f16, planted, inputs=2).status == "sound"
    r = check_rule(through_f16, planted)
    assert r.status == "unsound" and "values differ" in r.counterexample.why, r.format()
    assert check_rule(unmarked, planted).status == "unsound"
    assert check_rule(unmarked, planted, inputs=2).status == "sound"
    assert {r.name for r in catalog().rules if r.reassociates} == {  # the fused operators': they compute in fp32
        "add-associate", "multiply-associate", "softmax-scale", "softmax-scale-left", "layer-norm-flax",
        "layer-norm-two-pass", "layer-norm-centred", "group-norm-flax", "rms-norm-f32-sum"}


def test_a_distributive_rule_is_checked_without_infinities(planted):
    """x * (a + b) = x * a + x * b is true of reals, but inf * (1 + -1) is NaN where inf - inf is too
    only by luck of signs: with infinities among the inputs the checker finds the difference; a rule
    marked :distributes (the batch norms' shifts moved past the scale) is checked on finite values and
    NaN. A wrong distribution is still caught."""
    unmarked, marked = planted.find(["planted-distribute-unmarked", "planted-distribute"])
    assert check_rule(unmarked, planted).status == "unsound"
    r = check_rule(marked, planted)
    assert r.status == "sound" and r.fired >= 4, r.format()
    assert {r.name for r in catalog().rules if r.distributes} == {"batch-norm-keras", "batch-norm-flax"}
    wrong = build_catalog(extra_files=[("w", "w.egg", """
(rewrite (Multiply (Add x y) z) (Add (Multiply x z) y)
  :distributes :name planted-distribute-wrong :tag exact :doc "forgets to scale the second term")
""")])
    assert check_rule(wrong.find(["planted-distribute-wrong"])[0], wrong).status == "unsound"


def test_the_same_seed_gives_the_same_counterexample(planted):
    (rule,) = planted.find(["planted-subtract-swap"])
    a, b = check_rule(rule, planted, seed=5), check_rule(rule, planted, seed=5)
    assert a.format() == b.format()


def test_approximate_rules_are_held_to_their_bound(planted):
    ok, tight, small = planted.find(["planted-bf16-round-trip", "planted-bf16-too-tight",
                                     "planted-bf16-bound-too-small"])
    assert check_rule(ok, planted, inputs=2).status == "sound"
    # at fp32's largest values bf16 rounds to infinity: no bound holds there
    r = check_rule(ok, planted)
    assert r.status == "unsound" and "inf" in r.counterexample.why, r.format()
    for rule in (tight, small):
        r = check_rule(rule, planted)
        assert r.status == "unsound" and "values differ" in r.counterexample.why


def test_a_rule_whose_guard_is_never_true_is_untested():
    cat = build_catalog(extra_files=[("never", "never.egg", """
(rewrite (Negate x) x :when ((= (dtype x) "no-such-type"))
  :name never-fires :tag exact :doc "its guard is never true")
""")])
    (rule,) = cat.find(["never-fires"])
    r = check_rule(rule, cat, max_batches=2)
    assert r.status == "untested" and r.fired == 0 and "did not fire" in r.message


def test_a_rule_egglog_rejects_is_an_error_at_its_line():
    cat = build_catalog(extra_files=[("bad", "bad.egg", """

(rewrite (Negate x y) x :name bad-arity :tag exact :doc "Negate takes one operand")
""")])
    (rule,) = cat.find(["bad-arity"])
    r = check_rule(rule, cat)
    assert r.status == "error" and "bad-arity" in r.message


def test_agree_tolerates_rounding_only_for_floats():
    a = np.array([1.0, 2.0, 3.0], np.float32)
    assert agree(a, a + np.float32(1e-7), None, 3.0) is None
    assert agree(a, a + np.float32(1e-3), None, 3.0) is not None
    assert agree(np.array([1, 2], np.int32), np.array([1, 3], np.int32), None, 0.0) is not None
    assert agree(np.array([np.nan]), np.array([np.nan]), None, 0.0) is None
    assert agree(np.array([np.nan]), np.array([0.0]), None, 0.0) is not None
    assert agree(a, a.astype(np.float64), None, 1.0) is not None  # the element type changed


def test_a_rule_that_crashes_egglog_is_unsound_in_one_clean_message(capfd):
    cat = build_catalog(extra_files=[("crash", "crash.egg", """
(rule ((= e (Reshape x s))) ((union e (Reshape x (vec-set s 9 1))))
  :name crash-vec-set :tag exact :doc "vec-set past the end of the vector: egglog panics")
""")])
    (rule,) = cat.find(["crash-vec-set"])
    r = check_rule(rule, cat, max_batches=1, min_batches=1)
    assert r.status == "unsound" and "egglog panicked" in r.message and "index out of bounds" in r.message
    assert r.format().count("\\n") == 0
    err = capfd.readouterr().err
    assert "panicked at" not in err and "backtrace" not in err  # Rust's own panic report is held back
