"""`python -m attnspec.specs`: the seeds' worked examples that disagree with the reference (the errata)."""
import signal

from attnspec.specs.worked_examples import check

signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `python -m attnspec.specs | head` ends quietly

rows = check()
errata = [r for r in rows if not r.agrees]
inputs = sum(r.kind == "input" for r in rows)
print(f"{len(rows)} printed numbers: {len(rows) - inputs} recomputed by the reference, {inputs} inputs checked "
      f"against their transcription; {len(errata)} errata\n")
print(f"{'source':<26} {'quantity':<28} {'printed':>10} {'computed':>12}")
for r in errata:
    print(f"{r.source:<26} {r.quantity:<28} {r.printed:>10} {r.computed:>12.6g}")
