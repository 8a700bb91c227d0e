"""Greedy decoding of prefilled rows: the `hf` backend's decode loop.

The backend prefills a batch of prompts (inference/llm/hf.py); `decode` then writes every
row's reply, one pass over the rows still writing at a time:

- a row leaves the batch as soon as its reply ends (EOS, a stop string in its text, the length
  cap), so later passes run only the rows still writing — on a CPU, where a pass's cost grows
  with its rows, a batch no longer pays for its longest reply in every row;
- where the cache can be cropped (`kv.is_growing`), each pass also checks a prompt-lookup draft
  per row (inference/llm/prompt_lookup.py), so a reply that copies from its prompt goes several
  tokens a pass;
- each ended row is kept in the prompt cache with the reply tokens fed (inference/llm/
  prompt_cache.py), so a call that continues the reply (MAIN-RAG's judge after Agent-1's
  answer) reads only what follows it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import PreTrainedTokenizerBase
from transformers.cache_utils import DynamicCache

from sieverag.inference.llm import kv
from sieverag.inference.llm.backend_protocol import GenerationSettings
from sieverag.inference.llm.prompt_cache import PromptCache
from sieverag.inference.llm.prompt_lookup import Drafter, agreed

# Tokens one greedy decode pass feeds at most when its rows draft (inference/llm/prompt_lookup.py).
# A pass of a few rows reads every weight once and computes little, so drafts there are nearly
# free; ten rows of one token each compute about as much as they read. MAIN-RAG's Agent-1 on
# 10 HotpotQA passages (SmolLM2-135M, float32, one core): decoding 2.0-2.1 s without drafts,
# 1.8-2.1 s at 32 tokens a pass, 1.7 s at 16. So one row drafts up to `draft_tokens`, two up
# to 7 each, five 2, eight 1, more rows none.
DRAFT_PASS_TOKENS = 16

# One pass of the model over the rows of the cache being decoded: (new token ids [rows,
# tokens], their positions [rows, tokens], the attention mask [rows, columns]) -> logits
# [rows, tokens, vocabulary]; the cache takes the new tokens' keys and values.
Step = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def decode(step: Step, cache: DynamicCache, mask: torch.Tensor, positions: torch.Tensor,
           logits: torch.Tensor, rows: Sequence[list[int]], settings: GenerationSettings,
           eos_ids: Sequence[int], *, tokenizer: PreTrainedTokenizerBase, draft_tokens: int,
           prompt_cache: PromptCache) -> list[list[int]]:
    """Each row's new tokens, EOS excluded, greedy: `rows` are the prompts' ids, prefilled into
    `cache` (attention `mask`, each row's last position in `positions` [rows, 1], its last
    logits in `logits` [rows, vocabulary]).

    A row keeps a draft's tokens up to the first the model would not have chosen, then the
    model's own token; rows draft `DRAFT_PASS_TOKENS` tokens a pass at most in all (one row
    up to `draft_tokens`, 0: none); a shorter draft's spare columns, and a rejected draft's,
    are masked out. Drafts are checked in one pass, so their logits match token-by-token
    decoding to float rounding, not bit for bit; every kept token is the model's greedy
    choice. The ended rows go to `prompt_cache` (when it keeps anything)."""
    drafting = draft_tokens > 0 and kv.is_growing(cache)
    drafters = [Drafter(draft_tokens) for _ in rows]
    tokens: list[list[int]] = [[] for _ in rows]
    active = list(range(len(rows)))  # the batch row behind each cache row
    ends = set(eos_ids)
    # Per cache row, the tokens the model chose in the last pass; all but the last are
    # already in the cache (kept draft tokens).
    chosen = [[token] for token in logits.argmax(dim=-1).tolist()]
    fed: list[list[int]] = [[] for _ in rows]  # each row's reply tokens in the cache
    ended = _EndedRows()
    while True:
        still = [slot for slot, row in enumerate(active)
                 if _extend(tokens[row], chosen[slot], ends, settings, tokenizer)]
        if prompt_cache.max_tokens:
            ended.gather(cache, mask, [(slot, rows[row] + fed[row])
                                       for slot, row in enumerate(active) if slot not in still])
        if not still:
            ended.keep(prompt_cache)
            return tokens
        if len(still) < len(active):
            mask, positions = kv.select_rows(cache, still, mask, positions)
            active = [active[slot] for slot in still]
        cap = DRAFT_PASS_TOKENS // len(active) - 1 if drafting else 0
        drafts = [drafters[row].propose(rows[row] + tokens[row], min(
            cap, settings.max_new_tokens - len(tokens[row]) - 1)) if cap > 0 else []
            for row in active]
        width = 1 + max(map(len, drafts))
        ids = [[tokens[row][-1], *draft, *[0] * (width - 1 - len(draft))]
               for row, draft in zip(active, drafts, strict=True)]
        columns = mask.shape[1]
        lengths = torch.tensor([1 + len(draft) for draft in drafts], device=mask.device)
        mask = torch.cat([mask, (torch.arange(width, device=mask.device)[None, :]
                                 < lengths[:, None]).to(mask.dtype)], dim=1)
        offsets = torch.arange(1, width + 1, device=positions.device)[None, :]
        predicted = step(torch.tensor(ids, device=positions.device), positions + offsets,
                         mask).argmax(dim=-1).tolist()
        accepted = [agreed(draft, guess) for draft, guess in zip(drafts, predicted, strict=True)]
        chosen = [[*draft[:kept], guess[kept]]
                  for draft, guess, kept in zip(drafts, predicted, accepted, strict=True)]
        for row, draft, kept in zip(active, drafts, accepted, strict=True):
            drafters[row].kept(len(draft), kept)
            fed[row] += [tokens[row][-1], *draft[:kept]]
        if width > 1:
            # The cache keeps each row's fed token and kept draft: the widest of these, the
            # columns past a row's own masked out.
            kept = torch.tensor(accepted, device=mask.device)
            widest = 1 + max(accepted)
            cache.crop(-(width - widest))
            mask = mask[:, :columns + widest]
            mask[:, columns:] = (torch.arange(widest, device=mask.device)[None, :]
                                 <= kept[:, None]).to(mask.dtype)
            positions = positions + 1 + kept.to(positions.device)[:, None]
        else:
            positions = positions + 1


def reply_complete(tokens: list[int], settings: GenerationSettings,
                   tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether a reply (its last token just added, not EOS) has reached the length cap or
    ends in one of the stop strings."""
    if len(tokens) >= settings.max_new_tokens:
        return True
    window = max((len(s) for s in settings.stop), default=0) + 1
    return bool(settings.stop) and any(s in tokenizer.decode(tokens[-window:])
                                       for s in settings.stop)


def _extend(tokens: list[int], chosen: Sequence[int], ends: set[int],
            settings: GenerationSettings, tokenizer: PreTrainedTokenizerBase) -> bool:
    """Add the model's `chosen` tokens to a reply, up to its end: False once the reply has
    ended (an EOS, not added; the length cap; a stop string)."""
    for token in chosen:
        if token in ends:
            return False
        tokens.append(token)
        if reply_complete(tokens, settings, tokenizer):
            return False
    return True


class _EndedRows:
    """The rows a greedy decode has ended, gathered for the prompt cache as they leave the
    batch: each row's ids (prompt and the reply tokens fed) and copies of its keys and values
    at its attended columns only (the padding and a rejected draft's columns dropped: the
    keys hold their positions already, so attention over them is unchanged)."""

    def __init__(self) -> None:
        self.ids: list[list[int]] = []
        self.layers: list[kv.Layers] = []
        self.masks: list[torch.Tensor] = []

    def gather(self, cache: DynamicCache, mask: torch.Tensor,
               rows: Sequence[tuple[int, list[int]]]) -> None:
        """Copy each (cache row, ids) of `rows` out of `cache` (a plain per-layer KV cache;
        anything else is not gathered), where `mask` attends."""
        layers = kv.cache_layers(cache) if rows else None
        if layers is None:
            return
        for slot, ids in rows:
            attended = mask[slot].nonzero().squeeze(1)
            self.ids.append(ids)
            self.layers.append([(keys[slot:slot + 1].index_select(2, attended),
                                 values[slot:slot + 1].index_select(2, attended))
                                for keys, values in layers])
            self.masks.append(mask.new_ones((1, len(attended))))

    def keep(self, prompt_cache: PromptCache) -> None:
        prompt_cache.keep_rows(self.ids, self.layers, self.masks)
