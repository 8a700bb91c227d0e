"""A run's composition: its settings (`config`: `RunConfig`, presets from
`inference/presets/`) and how a run is planned and its roles and pipelines built
(`compose`). It sits above the pipelines and below evaluation."""
