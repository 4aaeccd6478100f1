"""Normalise and compare math answers (GSM8K / MATH style).

``normalize_answer`` turns the many spellings of one answer into one string
(``$1,000.00`` -> ``1000``, ``\\dfrac{1}{2}`` -> ``1/2``, ``10\\text{ cm}`` -> ``10``);
``parse_number`` reads a normalised answer as an exact ``Fraction`` when it is a number;
``answers_match`` compares numerically (with tolerance) when both sides are numbers,
else by normalised string equality. Nothing here raises on odd input.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

__all__ = ["normalize_answer", "parse_number", "answers_match"]

_TEXT_CMDS = ("text", "textbf", "textit", "textrm", "mathrm", "mathbf", "mbox", "operatorname")


def _read_group(s: str, i: int) -> tuple[str, int] | None:
    """Read a TeX argument at ``s[i:]``: ``{...}`` (balanced) or one non-space char. Returns (arg, end)."""
    n = len(s)
    while i < n and s[i] == " ":
        i += 1
    if i >= n:
        return None
    if s[i] == "{":
        depth = 0
        for j in range(i, n):
            if s[j] == "{":
                depth += 1
            elif s[j] == "}":
                depth -= 1
                if depth == 0:
                    return s[i + 1 : j], j + 1
        return None
    if s[i] == "\\":  # a command as the argument, e.g. \frac\pi2
        m = re.match(r"\\[A-Za-z]+", s[i:])
        if m:
            return m.group(0), i + len(m.group(0))
    return s[i], i + 1


def _replace_command(s: str, name: str, nargs: int, build) -> str:
    """Replace every ``\\name{a}{b}`` by ``build(a, b)`` (arguments may nest)."""
    pattern = re.compile(r"\\" + name + r"(?![A-Za-z])")
    out = []
    pos = 0
    for _ in range(1000):  # bounded: never loop forever on broken input
        m = pattern.search(s, pos)
        if not m:
            break
        args = []
        j = m.end()
        for _k in range(nargs):
            g = _read_group(s, j)
            if g is None:
                break
            args.append(g[0])
            j = g[1]
        if len(args) < nargs:
            out.append(s[pos : m.end()])
            pos = m.end()
            continue
        out.append(s[pos : m.start()])
        out.append(build(*args))
        pos = j
    out.append(s[pos:])
    return "".join(out)


def _strip_text_commands(s: str) -> str:
    r"""``\text{...}`` is mostly a unit (``10\text{ cm}``): drop it when something else is left, else unwrap."""
    removed = s
    for name in _TEXT_CMDS:
        removed = _replace_command(removed, name, 1, lambda a: "")
    if re.sub(r"[\s{}^]", "", removed):
        return removed
    for name in _TEXT_CMDS:
        s = _replace_command(s, name, 1, lambda a: a)
    return s


_ATOM = re.compile(r"\d+(?:\.\d+)?|[A-Za-z]|\\[A-Za-z]+(?:\{[^{}]*\})?")


def _frac(a: str, b: str) -> str:
    a, b = a.strip(), b.strip()
    a = a if _ATOM.fullmatch(a) or re.fullmatch(r"-\d+(?:\.\d+)?", a) else f"({a})"
    b = b if _ATOM.fullmatch(b) else f"({b})"
    return f"{a}/{b}"


_NUM_WITH_COMMAS = re.compile(r"(?<![\d.])(\d{1,3}(?:,\d{3})+)(?![\d])")


def normalize_answer(answer: object) -> str:
    """One canonical string per answer; numbers come out as ``72``, ``-0.5``, ``3/4``."""
    try:
        s = str(answer if answer is not None else "").strip()
    except Exception:  # noqa: BLE001
        return ""
    if not s:
        return ""
    # math delimiters: $...$, $$...$$, \(...\), \[...\]
    s = re.sub(r"^\\[(\[]\s*|\s*\\[)\]]$", "", s)
    s = s.replace("\\$", "").replace("$", "")
    s = s.strip()
    # spacing and sizing commands
    s = re.sub(r"\\(?:left|right|big|Big|bigg|Bigg)(?![A-Za-z])", "", s)
    s = re.sub(r"\\(?:displaystyle|textstyle|scriptstyle)(?![A-Za-z])", "", s)
    s = re.sub(r"\\[,;:! ]", "", s)
    s = s.replace("\\quad", "").replace("\\qquad", "").replace("~", "")
    # degrees, percent
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?", "", s)
    s = s.replace("°", "").replace("\\%", "").replace("%", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    # LaTeX thousands separator 1{,}000
    s = s.replace("{,}", ",")
    s = _strip_text_commands(s)
    # a leading "x =" / "answer:" label
    s = re.sub(r"^\s*(?:[A-Za-z]\s*=|(?:the\s+)?(?:final\s+)?answer\s*(?:is|:)?)\s*", "", s, flags=re.I)
    # mixed numbers 2\frac{1}{2} -> 5/2
    m = re.fullmatch(r"\s*(-?)(\d+)\s*\\frac\s*\{(\d+)\}\s*\{(\d+)\}\s*", s)
    if m and int(m.group(4)) != 0:
        value = int(m.group(2)) + Fraction(int(m.group(3)), int(m.group(4)))
        s = f"{m.group(1)}{value.numerator}/{value.denominator}"
    s = re.sub(r"\\sqrt\s*(\d|[A-Za-z])", r"\\sqrt{\1}", s)
    s = _replace_command(s, "frac", 2, _frac)
    s = _NUM_WITH_COMMAS.sub(lambda mm: mm.group(1).replace(",", ""), s)
    s = re.sub(r"\s+", "", s)
    s = s.rstrip(".")
    if s.startswith("+"):
        s = s[1:]
    # wrapping braces {72}
    while len(s) >= 2 and s[0] == "{" and s[-1] == "}" and _read_group(s, 0) == (s[1:-1], len(s)):
        s = s[1:-1]
    s = re.sub(r"^\(([A-Za-z])\)$", r"\1", s)  # multiple choice (A) -> A
    number = parse_number(s)
    if number is not None:
        return _format_number(number)
    return s


def _format_number(x: Fraction) -> str:
    if x.denominator == 1:
        return str(x.numerator)
    # a terminating decimal prints as a decimal, anything else as a fraction
    d = x.denominator
    while d % 2 == 0:
        d //= 2
    while d % 5 == 0:
        d //= 5
    if d == 1:
        text = f"{float(x):.12f}".rstrip("0").rstrip(".")
        if Fraction(text) == x:
            return text
    return f"{x.numerator}/{x.denominator}"


_DECIMAL = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"


def parse_number(s: object) -> Fraction | None:
    """Read ``72``, ``-0.50``, ``1e3``, ``3/4``, ``(3)/(4)``, ``-1/2`` as an exact Fraction, else ``None``."""
    if not isinstance(s, str):
        return None
    t = s.strip().replace(" ", "")
    if not t or len(t) > 200:
        return None
    try:
        if re.fullmatch(_DECIMAL, t):
            return Fraction(t)
        m = re.fullmatch(r"([-+]?)\(?(" + _DECIMAL + r")\)?/\(?(" + _DECIMAL + r")\)?", t)
        if m:
            num, den = Fraction(m.group(2)), Fraction(m.group(3))
            if den == 0:
                return None
            value = num / den
            return -value if m.group(1) == "-" else value
    except (ValueError, ZeroDivisionError, OverflowError):
        return None
    return None


_LEADING_NUMBER = re.compile(r"([-+]?\d[\d,]*(?:\.\d+)?(?:/\d+)?)\s*[A-Za-z][A-Za-z\s.]*")


def answers_match(predicted: object, gold: object, *, tolerance: float = 1e-6) -> bool:
    """True if the two answers are the same: numerically (exact for integers, else within
    ``tolerance`` relative/absolute) when both are numbers, else as normalised strings."""
    try:
        p, g = normalize_answer(predicted), normalize_answer(gold)
        if not p or not g:
            return False
        pn, gn = parse_number(p), parse_number(g)
        if gn is not None and pn is None:
            # '72 apples' against a numeric gold: take the leading number
            m = _LEADING_NUMBER.fullmatch(p)
            if m:
                pn = parse_number(normalize_answer(m.group(1)))
        if pn is not None and gn is not None:
            if pn == gn:
                return True
            if pn.denominator == 1 and gn.denominator == 1:
                return False
            return math.isclose(float(pn), float(gn), rel_tol=tolerance, abs_tol=tolerance)
        return p == g
    except Exception:  # noqa: BLE001 - a reward must never fail on model output
        return False
