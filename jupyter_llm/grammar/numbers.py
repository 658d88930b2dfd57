"""Integer and number ranges as GBNF digit patterns, exact on the decimal
digits: a bound is rounded outwards to ``MAX_BOUND_DIGITS`` digits each side of
the point, and digit runs without a bound are capped (``gbnf.MAX_DIGITS``,
``MAX_FRACTION``) so that a model cannot run away in them."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal, InvalidOperation, localcontext
from typing import Any

from jupyter_llm.grammar.gbnf import MAX_DIGITS, MAX_FRACTION, alternatives, group, repeat, seq

MAX_BOUND_DIGITS = 40  # a bound is rounded outwards to this many digits each side of the point


# -- integers and numbers by their digits -----------------------------------------------------
def _digit_class(low: int, high: int) -> str:
    return f'"{low}"' if low == high else f"[{low}-{high}]"


def _any_digits(n: int) -> str:
    return repeat("[0-9]", n, n)


def _at_least(digits: str) -> str:
    """Strings of ``len(digits)`` digits, >= ``digits``."""
    if not digits or set(digits) == {"0"}:
        return _any_digits(len(digits))
    first, rest = int(digits[0]), digits[1:]
    options = [seq(f'"{first}"', _at_least(rest))]
    if first < 9:
        options.append(seq(_digit_class(first + 1, 9), _any_digits(len(rest))))
    return alternatives(options)


def _at_most(digits: str) -> str:
    """Strings of ``len(digits)`` digits, <= ``digits``."""
    if not digits or set(digits) == {"9"}:
        return _any_digits(len(digits))
    first, rest = int(digits[0]), digits[1:]
    options = []
    if first > 0:
        options.append(seq(_digit_class(0, first - 1), _any_digits(len(rest))))
    options.append(seq(f'"{first}"', _at_most(rest)))
    return alternatives(options)


def _between_same_length(low: str, high: str) -> str:
    if not low:
        return ""
    a, b = int(low[0]), int(high[0])
    if a == b:
        return seq(f'"{a}"', _between_same_length(low[1:], high[1:]))
    if set(low[1:]) <= {"0"} and set(high[1:]) <= {"9"}:
        return seq(_digit_class(a, b), _any_digits(len(low) - 1))
    options = [seq(f'"{a}"', _at_least(low[1:]))]
    if b - a >= 2:
        options.append(seq(_digit_class(a + 1, b - 1), _any_digits(len(low) - 1)))
    options.append(seq(f'"{b}"', _at_most(high[1:])))
    return alternatives(options)


def natural_range(low: int, high: int | None) -> str:
    """Non-negative integers in [low, high] (high None: up to ``MAX_DIGITS``
    digits, or one more than ``low`` has), as JSON writes them."""
    lo = str(low)
    if high is None:
        longest = max(MAX_DIGITS, len(lo) + 1)
        return alternatives(
            [
                _between_same_length(lo, "9" * len(lo)),
                seq("[1-9]", repeat("[0-9]", len(lo), longest - 1)),
            ]
        )
    hi = str(high)
    if len(lo) == len(hi):
        return _between_same_length(lo, hi)
    options = [_between_same_length(lo, "9" * len(lo))]
    if len(hi) - len(lo) >= 2:
        options.append(seq("[1-9]", repeat("[0-9]", len(lo), len(hi) - 2)))
    options.append(_between_same_length("1" + "0" * (len(hi) - 1), hi))
    return alternatives(options)


def integer_range(low: int | None, high: int | None) -> str:
    """Integers in [low, high], either end open (None); low <= high."""
    options = []
    if high is None or high >= 0:
        options.append(natural_range(max(low, 0) if low is not None else 0, high))
    if low is None or low < 0:
        top = -1 if high is None else min(high, -1)
        options.append(seq('"-"', natural_range(-top, None if low is None else -low)))
    return alternatives(options)


@dataclass(frozen=True)
class Bound:
    value: Decimal
    strict: bool


def _split(value: Decimal) -> tuple[int, str]:
    """The integer part and the fraction's digits (no trailing zeros) of ``value`` >= 0."""
    whole = int(value)
    text = format(value - whole, "f")
    frac = text.partition(".")[2].rstrip("0")
    return whole, frac


@dataclass(frozen=True)
class Fraction:
    """Digit strings after the ".": ``digits`` matches the non-empty ones
    (None: none), ``empty`` says whether no fraction at all is in."""

    digits: str | None
    empty: bool


_ANY_REST = f"[0-9]{{0,{MAX_FRACTION - 1}}}"
_ANY_FRACTION = Fraction(f"[0-9]{{1,{MAX_FRACTION}}}", True)
_NONZERO = Fraction(f'"0"{{0,{MAX_FRACTION - 1}}} [1-9] [0-9]{{0,{MAX_FRACTION - 1}}}', False)


def _after(first: str, rest: Fraction) -> str | None:
    """``first`` followed by ``rest`` (which may be empty)."""
    if rest.digits is None:
        return first if rest.empty else None
    return seq(first, f"({rest.digits})?" if rest.empty else group(rest.digits))


def _fraction(options: list[str | None], empty: bool) -> Fraction:
    kept = [o for o in options if o is not None]
    return Fraction(alternatives(kept) if kept else None, empty)


def fraction_at_least(digits: str, strict: bool) -> Fraction:
    """0.f >= 0.digits (> if strict); ``digits`` without trailing zeros."""
    if not digits:
        return _NONZERO if strict else _ANY_FRACTION
    first = int(digits[0])
    options = [_after(f'"{first}"', fraction_at_least(digits[1:], strict))]
    if first < 9:
        options.append(seq(_digit_class(first + 1, 9), _ANY_REST))
    return _fraction(options, False)


def fraction_at_most(digits: str, strict: bool) -> Fraction:
    """0.f <= 0.digits (< if strict)."""
    if not digits:
        return Fraction(None, False) if strict else Fraction(f'"0"{{1,{MAX_FRACTION}}}', True)
    first = int(digits[0])
    options = []
    if first > 0:
        options.append(seq(_digit_class(0, first - 1), _ANY_REST))
    options.append(_after(f'"{first}"', fraction_at_most(digits[1:], strict)))
    return _fraction(options, True)


def fraction_between(low: str, low_strict: bool, high: str, high_strict: bool) -> Fraction:
    """0.low <= 0.f <= 0.high (each end strict or not); 0.low < 0.high."""
    if not low and not low_strict:
        return fraction_at_most(high, high_strict)
    b = int(high[0])
    if not low:  # 0 < f
        if b == 0:
            return _fraction(
                [_after('"0"', fraction_between("", True, high[1:], high_strict))], False
            )
        options = [_after('"0"', _NONZERO)]
        if b >= 2:
            options.append(seq(_digit_class(1, b - 1), _ANY_REST))
        options.append(_after(f'"{b}"', fraction_at_most(high[1:], high_strict)))
        return _fraction(options, False)
    a = int(low[0])
    if a == b:
        return _fraction(
            [_after(f'"{a}"', fraction_between(low[1:], low_strict, high[1:], high_strict))], False
        )
    options = [_after(f'"{a}"', fraction_at_least(low[1:], low_strict))]
    if b - a >= 2:
        options.append(seq(_digit_class(a + 1, b - 1), _ANY_REST))
    options.append(_after(f'"{b}"', fraction_at_most(high[1:], high_strict)))
    return _fraction(options, False)


def _with_fraction(whole: str, frac: Fraction) -> str | None:
    if frac.digits is None:
        return whole if frac.empty else None
    tail = seq('"."', group(frac.digits))
    return seq(whole, f"({tail})?" if frac.empty else tail)


def magnitude_range(low: Bound, high: Bound | None) -> str | None:
    """Decimals without an exponent in the range (low.value >= 0, low < high)."""
    li, lf = _split(low.value)
    options: list[str | None] = []
    if high is None:
        options.append(_with_fraction(f'"{li}"', fraction_at_least(lf, low.strict)))
        options.append(_with_fraction(group(natural_range(li + 1, None)), _ANY_FRACTION))
    else:
        hi, hf = _split(high.value)
        if li == hi:
            options.append(
                _with_fraction(f'"{li}"', fraction_between(lf, low.strict, hf, high.strict))
            )
        else:
            options.append(_with_fraction(f'"{li}"', fraction_at_least(lf, low.strict)))
            if hi - li >= 2:
                options.append(_with_fraction(group(natural_range(li + 1, hi - 1)), _ANY_FRACTION))
            options.append(_with_fraction(f'"{hi}"', fraction_at_most(hf, high.strict)))
    kept = [o for o in options if o is not None]
    return alternatives(kept) if kept else None


def number_range(low: Bound | None, high: Bound | None) -> str | None:
    """Numbers in the range, written without an exponent; None if it is empty."""
    if empty_range(low, high):
        return None
    zero = Decimal(0)
    options: list[str | None] = []
    if high is None or high.value > zero or (high.value == zero and not high.strict):
        start = Bound(zero, False) if low is None or low.value < zero else low
        options.append(magnitude_range(start, high))
    if low is None or low.value < zero:
        top = None if low is None else Bound(-low.value, low.strict)
        bottom = (
            Bound(zero, True)
            if high is None or high.value >= zero
            else Bound(-high.value, high.strict)
        )
        if (inner := magnitude_range(bottom, top)) is not None:
            options.append(seq('"-"', group(inner)))
    kept = [o for o in options if o is not None]
    return alternatives(kept) if kept else None


def _decimal(value: Any) -> Decimal | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = Decimal(value) if isinstance(value, int) else Decimal(repr(value))
    except InvalidOperation:
        return None
    return number if number.is_finite() else None


def bounds(schema: dict[str, Any]) -> tuple[Bound | None, Bound | None]:
    """The tightest lower and upper bound, from both drafts' exclusive forms."""

    def tighter(a: Bound | None, b: Bound | None, lower: bool) -> Bound | None:
        if a is None or b is None:
            return a or b
        if a.value != b.value:
            return a if (a.value > b.value) == lower else b
        return a if a.strict else b

    low = high = None
    for key, lower in (("minimum", True), ("maximum", False)):
        value = _decimal(schema.get(key))
        if value is not None:
            strict = schema.get("exclusive" + key.capitalize()) is True  # draft 4
            bound = Bound(value, strict)
            low, high = (
                (tighter(low, bound, True), high) if lower else (low, tighter(high, bound, False))
            )
    for key, lower in (("exclusiveMinimum", True), ("exclusiveMaximum", False)):
        value = _decimal(schema.get(key))
        if value is not None:
            bound = Bound(value, True)
            low, high = (
                (tighter(low, bound, True), high) if lower else (low, tighter(high, bound, False))
            )
    return low, high


def coarse(bound: Bound | None, lower: bool) -> Bound | None:
    """``bound`` with at most ``MAX_BOUND_DIGITS`` digits after the point,
    rounded outwards; None (no bound) from 10**MAX_BOUND_DIGITS on. Keeps the
    digit rules (one per digit) small."""
    if bound is None or abs(bound.value) >= Decimal(10) ** MAX_BOUND_DIGITS:
        return None
    with localcontext(prec=3 * MAX_BOUND_DIGITS):
        step = Decimal(1).scaleb(-MAX_BOUND_DIGITS)
        rounded = bound.value.quantize(step, rounding=ROUND_FLOOR if lower else ROUND_CEILING)
    return bound if rounded == bound.value else Bound(rounded, False)


def empty_range(low: Bound | None, high: Bound | None) -> bool:
    if low is None or high is None:
        return False
    return low.value > high.value or (low.value == high.value and (low.strict or high.strict))


def integer_bounds(low: Bound | None, high: Bound | None) -> tuple[int | None, int | None]:
    """The inclusive integer range the bounds leave."""
    lo = hi = None
    if low is not None:
        whole = int(low.value.to_integral_value(rounding="ROUND_FLOOR"))
        lo = whole + 1 if (low.strict or whole < low.value) else whole
    if high is not None:
        whole = int(high.value.to_integral_value(rounding="ROUND_CEILING"))
        hi = whole - 1 if (high.strict or whole > high.value) else whole
    return lo, hi
