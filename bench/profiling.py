"""The profile of one mixrl ``algo=grpo`` step, as text: cProfile by cumulative time, mixrl's
own functions, cProfile by self time, and torch.profiler's top operators. The steps profiled run
after the measured ones (:class:`bench.timer.StepTimer` captures them) and are not in the timings.
"""

from __future__ import annotations

import io
import os
import pstats
import shlex
import site
import sysconfig
from datetime import datetime
from pathlib import Path

from bench.machine import REPO, git_commit
from bench.timer import StepTimer


def _short_paths(text: str) -> str:
    """site-packages/ and repository prefixes removed from file names."""

    prefixes = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
    for pre in sorted(prefixes, key=len, reverse=True):
        text = text.replace(pre.rstrip(os.sep) + os.sep, "")
    return text.replace(str(REPO) + os.sep, "")


def render_profile(timer: StepTimer, opts) -> str:
    """The text of ``profile.txt`` from the profilers ``timer`` ran (``opts``: the CLI's ``argv`` and ``device``)."""
    out = io.StringIO()
    out.write(f"# cProfile and torch.profiler of one mixrl algo=grpo step\n# command: python -m bench.throughput {shlex.join(opts.argv)}".rstrip() + "\n")
    out.write(f"# commit {git_commit()}, {datetime.now().astimezone().isoformat(timespec='seconds')}, device {opts.device}\n")
    out.write("# these steps are profiled after the measured steps and are not part of the timings; cProfile\n"
              "# inflates Python-heavy code, so read shares, not absolute times.\n\n")
    recs = {r.profiled: r for r in timer.result.records if r.profiled}
    if timer.cprofile is not None:
        r = recs.get("cprofile")
        out.write(f"## cProfile (step {r.step if r else '?'}, {r.seconds if r else float('nan'):.3f}s with the profiler on)\n\n")
        s = io.StringIO()
        st = pstats.Stats(timer.cprofile, stream=s)
        st.sort_stats("cumulative").print_stats(45)
        out.write(_short_paths(s.getvalue()))
        # mixrl's own code: where the subclass and the objective spend their time
        out.write("\n## mixrl functions (cumulative seconds in this step; nested calls overlap)\n\n")
        rows = []
        for (fname, line, func), (cc, nc, tt, ct, _) in st.stats.items():  # type: ignore[attr-defined]
            if f"{os.sep}mixrl{os.sep}" in fname and f"{os.sep}bench{os.sep}" not in fname:
                rows.append((ct, tt, nc, f"{Path(fname).relative_to(REPO) if str(fname).startswith(str(REPO)) else fname}:{line}({func})"))
        for ct, tt, nc, where in sorted(rows, reverse=True)[:25]:
            out.write(f"{ct:9.4f} cum {tt:9.4f} self {nc:6d} calls  {where}\n")
        s = io.StringIO()
        pstats.Stats(timer.cprofile, stream=s).sort_stats("tottime").print_stats(25)
        out.write("\n## cProfile by self time\n\n" + _short_paths(s.getvalue()))
    if timer.torch_profile is not None:
        r = recs.get("torch")
        sort = "cuda_time_total" if opts.device == "cuda" else "cpu_time_total"
        out.write(f"\n## torch.profiler (step {r.step if r else '?'}), top operators by {sort}\n\n")
        out.write(timer.torch_profile.key_averages().table(sort_by=sort, row_limit=30))
        out.write("\n")
    return out.getvalue()
