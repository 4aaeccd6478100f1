"""Make the Caesar-shift task: shift every letter of a short word one place on (a->b, ..., z->a).

    python examples/caesar/make_data.py        # writes examples/caesar/train.jsonl (1000 rows)

Deterministic (seed 0). Each row: ``prompt`` ("shift: cab"), ``answer`` ("dbc") and ``solution``
(the expert completion, here the answer itself; the default data group reads it as the expert column).
mixrl holds out 20% of a single file's rows for evaluation (a fixed split), never trained on.
"""

import json
import random
import string
from pathlib import Path

N_ROWS = 1000
LETTERS = string.ascii_lowercase


def shift(word: str) -> str:
    return "".join(LETTERS[(LETTERS.index(ch) + 1) % 26] for ch in word)


def main() -> None:
    rng = random.Random(0)
    words: list[str] = []
    while len(words) < N_ROWS:
        word = "".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 5)))
        if word not in words:
            words.append(word)
    out = Path(__file__).with_name("train.jsonl")
    with out.open("w") as f:
        for word in words:
            f.write(json.dumps({"prompt": f"shift: {word}", "answer": shift(word), "solution": shift(word)}) + "\n")
    print(f"wrote {N_ROWS} rows to {out}")


if __name__ == "__main__":
    main()
