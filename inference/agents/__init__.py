"""Who runs each model role (`roles`: the generator, the filter and the judge, their cards)
and cutting the scored answer from a reply (`answer_extraction`): the agents' rank, beside
`filters/` and `metrics/`."""
