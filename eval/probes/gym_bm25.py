"""BM25's NDCG@1 against the memory gym's useful session, per level and size (memory questions,
all users): the words-alone baseline the gym is built to defeat.

    python -m eval.probes.gym_bm25      # seconds; prints the table docs/gym.md quotes
"""

from __future__ import annotations

import typer


def main() -> None:
    from memsifter.coarse.bm25 import BM25Filter
    from memsifter.data.gym import LEVELS, GymConfig, generate_world, to_dataset

    bm25 = BM25Filter()
    sizes = ("ci", "small", "medium")
    print("| level | " + " | ".join(sizes) + " |\n|---" * 1 + "|---" * len(sizes) + "|")
    for level in LEVELS:
        cells = []
        for size in sizes:
            ds = to_dataset(generate_world(GymConfig(level=level, size=size)))
            memory = [q for q in ds.queries if q.meta["useful_session_ids"]]
            hits = sum(
                bm25.score(q.question, list(q.haystack)).ids[0] in q.meta["useful_session_ids"]
                for q in memory
            )
            cells.append(f"{hits / len(memory):.3f} (n={len(memory)})")
        print(f"| {level} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    typer.run(main)
