"""The default settings of the card's fits, apart from the fitting code so that the `filter`
commands' settings import without it (`sieverag filter list` starts without scikit-learn)."""

FOLDS = 5  # cross-validation folds by question (`filter fit-combination --folds`)
MIN_GAIN = 0.005  # AUROC the filter must add over the priors alone to be used (`--min-gain`)
DEFAULT_TOLERANCE = 0.0  # F1 an away source may lose against the away default (home rule)
