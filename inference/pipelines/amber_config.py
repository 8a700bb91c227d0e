"""Moved to `sieverag.inference.pipelines.amber.settings` (this path is kept for one release)."""

from sieverag.inference.moved import alias_moved

alias_moved(__name__, "sieverag.inference.pipelines.amber.settings")
