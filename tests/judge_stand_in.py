"""A stand-in for an OpenAI-compatible judge server (chat-completions JSON shape), for tests and the guide.

``serve(answer)`` starts ``http.server`` in a thread and returns ``(url, server)``; ``answer(text) -> str``
writes the verdict for the user message ``text``. :func:`arith_judge` is a judge of the built-in task:
it reads the template's ``Answer:`` and ``Reference answer:`` lines and says ``Score: 10`` or ``Score: 0``;
:func:`arith_step_judge` checks one step (a running sum) for ``reward=process``.
``python tests/judge_stand_in.py --port 8123`` serves it until Ctrl-C (the guide's example).
"""

from __future__ import annotations

import argparse
import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def arith_judge(text: str) -> str:
    answer = re.search(r"Answer: (.*)", text)
    gold = re.search(r"Reference answer: *(\S*)", text)
    got = re.search(r"####\s*(-?\d+)\s*$", answer.group(1)) if answer else None
    right = bool(got and gold and got.group(1).lstrip("0") == gold.group(1).lstrip("0"))
    return f"The sums check out. Score: {10 if right else 0}" if right else "Score: 0"


def arith_step_judge(text: str) -> str:
    """The per-step judge of the built-in task (reward=process): is the next running sum right?"""
    terms = [int(t) for t in re.search(r"Problem: ([\d+]+)=", text).group(1).split("+")]
    previous = (re.search(r"Solution so far: (.*)", text).group(1) or "").split()
    step = re.search(r"Next step: (.*)", text).group(1).strip()
    if step == "####":
        right = True
    elif "####" in previous:
        right = step == str(sum(terms))
    else:
        right = step == str(sum(terms[:len(previous) + 2]))
    return f"Verdict: {'correct' if right else 'incorrect'}"


def judge_any(text: str) -> str:
    """The step judge for step questions, the answer judge otherwise."""
    return arith_step_judge(text) if "Next step:" in text else arith_judge(text)


def serve(answer: Callable[[str], str], port: int = 0) -> tuple[str, ThreadingHTTPServer]:
    calls: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            text = body["messages"][-1]["content"]
            calls.append(text)
            reply = json.dumps({"id": "stand-in", "object": "chat.completion", "model": body.get("model"),
                                "choices": [{"index": 0, "message": {"role": "assistant", "content": answer(text)},
                                             "finish_reason": "stop"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args):  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.calls = calls
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/v1", server


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8123)
    url, server = serve(judge_any, ap.parse_args().port)
    print(f"serving the arith stand-in judge at {url}", flush=True)
    threading.Event().wait()
