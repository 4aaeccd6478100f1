"""The built-in tools: ``calculator`` and ``python``, and the registry that config names resolve through.

Each tool is a plain function whose signature has type hints and whose docstring is Google-style
(a summary, ``Args:`` naming every argument, ``Returns:``): that is what transformers'
``get_json_schema`` reads to build the schema the chat template shows the model, and what TRL 1.16's
``GRPOTrainer(tools=[...])`` calls by name with the model's JSON arguments. A tool never raises:
every failure is returned as text (``"Error: ..."``) so that it becomes the tool message the model
reads next, and the run goes on.

``calculator`` parses the expression with :mod:`ast` and evaluates only numbers, ``+ - * / // % **``,
unary signs and parentheses (no names, calls, attributes or subscripts: nothing is ``eval``-ed).
Integers are Python integers and ``/`` is exact (:class:`fractions.Fraction`), so big integers stay
exact; a power whose result would exceed :data:`MAX_RESULT_BITS` bits is refused rather than computed.
``python`` runs the code with :func:`mixrl.tools.sandbox.run_python` under the default
:class:`~mixrl.tools.sandbox.Limits` and returns its output, followed by the one-line reason when it
was stopped.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Iterable
from fractions import Fraction

from mixrl.errors import ConfigError, did_you_mean
from mixrl.registry import Registry
from mixrl.tools.sandbox import run_python

#: the longest expression ``calculator`` parses (characters)
MAX_EXPRESSION_CHARS = 2000
#: the largest result (in bits) a power may produce before it is computed; 100,000 bits is ~30,000 digits
MAX_RESULT_BITS = 100_000

_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_ALLOWED = "numbers, + - * / // % ** and parentheses"


class _Refused(Exception):
    """An expression ``calculator`` will not evaluate; the message is the one line the model reads."""


def _bits(value: int | Fraction | float) -> int:
    if isinstance(value, float):
        return 64
    if isinstance(value, Fraction):
        return max(value.numerator.bit_length(), value.denominator.bit_length())
    return value.bit_length()


def _power(base, exponent):
    if isinstance(exponent, Fraction) and exponent.denominator == 1:
        exponent = exponent.numerator
    if isinstance(exponent, int) and not isinstance(base, float):
        if abs(exponent) * max(_bits(base), 1) > MAX_RESULT_BITS:
            raise _Refused(f"the result of this power has more than {MAX_RESULT_BITS} bits")
        return Fraction(base) ** exponent
    result = float(base) ** float(exponent)
    if isinstance(result, complex):
        raise _Refused("a negative number to a fractional power has no real value")
    return result


def _evaluate(node: ast.AST):
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise _Refused(f"{node.value!r} is not a number; only {_ALLOWED} are allowed")
        return Fraction(node.value) if isinstance(node.value, int) else node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        if isinstance(left, float) or isinstance(right, float):
            left, right = float(left), float(right)
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitXor):
        raise _Refused("^ is not a power here; write ** for a power")
    if isinstance(node, ast.Name):
        raise _Refused(f"names are not allowed ({node.id!r}); only {_ALLOWED} are allowed")
    if isinstance(node, ast.Attribute):
        raise _Refused(f"attributes are not allowed (.{node.attr}); only {_ALLOWED} are allowed")
    if isinstance(node, ast.Call):
        raise _Refused(f"function calls are not allowed; only {_ALLOWED} are allowed")
    raise _Refused(f"{type(node).__name__} is not allowed; only {_ALLOWED} are allowed")


def _format(value) -> str:
    if isinstance(value, Fraction):
        if value.denominator == 1:
            return str(value.numerator)
        try:
            return repr(float(value))
        except OverflowError:
            return f"{value.numerator}/{value.denominator}"
    return repr(value)


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly, with integers of any size.

    Args:
        expression: The arithmetic expression, using numbers, + - * / // % ** and parentheses, e.g. "(123456789 + 987654321) * 3".

    Returns:
        The value of the expression, or a line starting with "Error:" that says what is wrong.
    """
    try:
        text = str(expression)
        if len(text) > MAX_EXPRESSION_CHARS:
            raise _Refused(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError as err:
            raise _Refused(f"not an arithmetic expression ({err.msg})") from None
        return _format(_evaluate(tree))
    except _Refused as err:
        return f"Error: {err}"
    except ZeroDivisionError:
        return "Error: division by zero"
    except (OverflowError, ValueError, MemoryError, RecursionError) as err:
        return f"Error: {type(err).__name__}: {err}".rstrip(": ")


def python(code: str) -> str:
    """Run a Python program in a sandbox and return what it printed.

    Args:
        code: A complete Python program; print the values you want to see. Only the standard library is available, with no network and no files outside its own temporary directory.

    Returns:
        The program's output (stdout and stderr), followed by a line that says why it was stopped if it failed.
    """
    result = run_python(str(code))
    if result.ok:
        return result.text
    text = result.text.rstrip("\n")
    return f"{text}\nError: {result.reason}" if text else f"Error: {result.reason}"


#: the tools a config may name: name -> function (the function's ``__name__`` is the name the model
#: calls); a :class:`mixrl.registry.Registry`, so a name is taken once (``TOOLS.register(name)``)
TOOLS = Registry("tool")
TOOLS.add("calculator", calculator)
TOOLS.add("python", python)


def resolve_tools(names: Iterable[str] | str | None) -> list[Callable[..., str]]:
    """The tool functions for config names, in order, without repeats; one line naming the fix for an unknown name."""
    if names is None:
        return []
    if isinstance(names, str):
        names = [names]
    tools: list[Callable[..., str]] = []
    for name in names:
        if name not in TOOLS:
            raise ConfigError(
                f"unknown tool {name!r}{did_you_mean(str(name), TOOLS)}: "
                f"the built-in tools are {', '.join(sorted(TOOLS))}"
            )
        if TOOLS[name] not in tools:
            tools.append(TOOLS[name])
    return tools
