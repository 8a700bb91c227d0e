"""Prompt-lookup drafts: the model's next tokens guessed from the text it has already seen.

Greedy decoding of one prompt on a CPU reads every weight once per token, and a pass over a
few tokens costs less than as many passes over one (SmolLM2-135M, 2 cores, float32: 9 tokens
~100–114 ms, one ~42–50 ms). Replies that copy from their prompt (amber's memory agents
restate the evidence, answers repeat a name) can then go several tokens a step: find the last
few tokens earlier in the prompt or reply, propose what followed them there, and keep the part
the model agrees with in one pass (Saxena 2023, "Prompt lookup decoding"; transformers'
`prompt_lookup_num_tokens`). The draft never decides a token: every kept token is the model's
own greedy choice.
"""

from __future__ import annotations

from collections.abc import Sequence


def draft(sequence: Sequence[int], *, ngram: int, tokens: int) -> list[int]:
    """Up to `tokens` ids that followed the most recent earlier occurrence of `sequence`'s
    last n ids, for the longest n <= `ngram` that occurs; [] when none does."""
    if tokens < 1:
        return []
    for size in range(min(ngram, len(sequence) - 1), 0, -1):
        tail = list(sequence[-size:])
        for start in range(len(sequence) - size - 1, -1, -1):
            if list(sequence[start:start + size]) == tail:
                return list(sequence[start + size:start + size + tokens])
    return []


def agreed(proposed: Sequence[int], predicted: Sequence[int]) -> int:
    """How many of the `proposed` draft tokens the model would have chosen itself:
    `predicted[i]` is its greedy token after the draft's first i tokens."""
    count = 0
    while count < len(proposed) and proposed[count] == predicted[count]:
        count += 1
    return count


DEFAULT_DRAFT_TOKENS = 12  # the in-process backends' draft limit (`draft_tokens`)
NGRAM = 3  # the longest tail looked up (shorter ones are tried when it is not found)
FIRST_LENGTH = 2  # a reply's first draft length


class Drafter:
    """Drafts for one reply, their length adapting to how much of them the model keeps: 2
    longer after a draft kept whole, 1 shorter otherwise (between 1 and `limit`). A pass over
    more tokens costs more (on 2 CPU cores, float32: 1 token ~42 ms, 1 + 8 ~100 ms), so long
    drafts only pay where the reply is copying."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.length = min(FIRST_LENGTH, limit)

    def propose(self, sequence: Sequence[int], room: int) -> list[int]:
        """A draft continuing `sequence` (prompt and reply so far), at most `room` tokens."""
        return draft(sequence, ngram=NGRAM, tokens=min(self.length, room))

    def kept(self, proposed: int, accepted: int) -> None:
        """Record that the model agreed with `accepted` of the last draft's `proposed` tokens."""
        if not proposed:
            return
        if accepted == proposed:
            self.length = min(self.limit, self.length + 2)
        else:
            self.length = max(1, self.length - 1)
