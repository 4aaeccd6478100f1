"""Built-in tools for tool-calling rollouts, and the sandbox that runs model-written code.

``calculator`` (exact arithmetic, :mod:`mixrl.tools.builtin`) and ``python`` (a Python program run in
:func:`mixrl.tools.sandbox.run_python`: its own process with CPU, memory, process, file and wall-clock
limits, no network, a private temporary directory). Both are plain functions with Google-style
docstrings, so TRL's ``GRPOTrainer(tools=...)`` and transformers' ``get_json_schema`` take them as
they are. ``resolve_tools(names)`` turns config names into the functions.
"""

from mixrl.tools.builtin import TOOLS, calculator, python, resolve_tools
from mixrl.tools.sandbox import Limits, ToolResult, run_python

__all__ = ["TOOLS", "Limits", "ToolResult", "calculator", "python", "resolve_tools", "run_python"]
