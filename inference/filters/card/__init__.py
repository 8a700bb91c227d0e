"""The filter's card, `sieverag_adapter.json` beside a LoRA adapter, in one place.

* `card_file` — the card as a file: read it, check it against the model and prompts in use,
  write it (whole, or with a fitted section), and what packaging puts in it;
* `combination` — the fitted combination it holds (`Combination`, with its bar, shift guard
  and home rule), read from and written to the card's sections;
* `filter_card` — `FilterCard`, the card a run's filter role is read by, and the questions
  asked of a card: which combination ranks, and the lines that say so.

Fitting a card stays in `training/evaluation/` and writes through these modules.
"""
