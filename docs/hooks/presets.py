"""The Presets section of the configuration page, from the shipped preset files (a part
docs/hooks/generated.py writes).

`docs/configuration.md` holds the line `<!-- presets -->`; the build replaces it with each
YAML file of `inference/presets/` (what `--preset NAME` reads), comments included.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.exceptions import PluginError

MARKER = "<!-- presets -->"
PAGE = "configuration.md"
PRESETS = Path(__file__).resolve().parents[2] / "inference" / "presets"


def presets_reference() -> str:
    """A section per preset file: its name as `--preset` takes it, then the file."""
    files = sorted(PRESETS.glob("*.yaml"))
    if not files:
        raise PluginError(f"no preset files in {PRESETS}")
    return "\n".join(f"### {path.stem}\n\n`--preset {path.stem}` "
                     f"(`inference/presets/{path.name}`):\n\n```yaml\n"
                     f"{path.read_text(encoding='utf-8').rstrip()}\n```\n" for path in files)


# What docs/hooks/generated.py puts in place of MARKER on PAGE.
WHAT = "the presets"
generate = presets_reference
