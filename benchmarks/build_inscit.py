"""A multi-turn set the conversation design was never tuned on, from INSCIT's dev conversations.

INSCIT (Wu et al., "INSCIT: Information-Seeking Conversations with Mixed-Initiative
Interactions", TACL 2023; repository ellenmellon/INSCIT, ``data/dev.json``): people asking about
Wikipedia topics in open conversations, answered by human agents from Wikipedia passages. The
file is not redistributed here: give its path (a clone of the repository). Rows are written in
``multiturn_dev.jsonl``'s fields so ``python -m benchmarks.multiturn --data`` reads them:

* a turn (the 2nd user turn or later) whose first reference response is a ``directAnswer``;
* ``history``: the earlier turns as the conversation had them (user, then the agent's
  responses), ``question``: the last user turn, ``answer``: its reference response;
* ``distractor_answer``: the agent's previous response (the answer to the earlier turn);
* ``context_dependent``: null (INSCIT has no rewrites), so only the "all" group is reported.

Conversations are taken in a fixed hash order, at most ``--turns-per-conversation`` turns each::

    python -m benchmarks.build_inscit /path/to/INSCIT/data/dev.json -o /tmp/inscit_multiturn.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Optional


def rows_of(dialogues: dict, conversations: int, per_conversation: int) -> list[dict]:
    order = sorted(dialogues, key=lambda k: hashlib.sha256(k.encode()).hexdigest())
    rows: list[dict] = []
    taken = 0
    for conversation_id in order:
        if taken >= conversations:
            break
        kept = 0
        for index, turn in enumerate(dialogues[conversation_id]["turns"]):
            context = turn["context"]
            if len(context) < 3 or not turn["labels"] or kept >= per_conversation:
                continue
            label = turn["labels"][0]
            previous = context[-2].strip()
            if label["responseType"] != "directAnswer" or not previous or previous == label["response"].strip():
                continue
            history = [{"role": "user" if i % 2 == 0 else "assistant", "content": text} for i, text in enumerate(context[:-1])]
            rows.append(
                {
                    "conversation_id": conversation_id,
                    "turn": len(context) // 2 + 1,
                    "history": history,
                    "question": context[-1],
                    "answer": label["response"],
                    "distractor_answer": previous,
                    "distractor_turn": len(context) // 2,
                    "context_dependent": None,
                    "source": "inscit-dev",
                }
            )
            kept += 1
        taken += 1 if kept else 0
    return rows


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dev_json", type=Path)
    parser.add_argument("-o", "--out", type=Path, required=True)
    parser.add_argument("--conversations", type=int, default=20)
    parser.add_argument("--turns-per-conversation", type=int, default=3)
    args = parser.parse_args(argv)
    dialogues = json.loads(args.dev_json.read_text(encoding="utf-8"))
    rows = rows_of(dialogues, args.conversations, args.turns_per_conversation)
    with open(args.out, "w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{len(rows)} turns of {len({r['conversation_id'] for r in rows})} conversations -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
