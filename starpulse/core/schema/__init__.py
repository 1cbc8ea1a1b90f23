"""Settings as documented dataclasses, and everything derived from them.

A settings tree is a dataclass whose fields are *settings* (a typed value with a default and
a doc: its unit, what it does, why this default; made with :func:`setting`) or *sections* (a
nested settings dataclass, :func:`section`). The service config dataclasses document their
own fields this way, so a default is written once, beside the code that uses it; a file
section whose key belongs to one of them takes the field with :func:`from_field`. From a
tree, :class:`Schema` derives

- the reader (:class:`Reading`): a mapping parsed from a YAML or TOML file, overlaid with
  environment overrides and command-line flags, becomes the dataclasses. Every problem is
  collected and reported at once, one line each, naming where the value came from and its
  dotted key::

      controller.yaml: detection.correlation.settle_s: must be a number >= 0, got 'x'

- environment overrides ``STARPULSE_<SECTION>__<KEY>`` (a double underscore per level);
- command-line flags (:class:`Flag`): their help, default and the setting they set;
- a reference file with every setting at its default, documented (:func:`render`).

Types come from the annotations: ``str``, ``Path``, ``int``, ``float``, ``bool``,
``Literal[...]`` (one of), ``list[str]`` or ``tuple[str, ...]``, ``dict[str, list[str]]``,
``dict[str, Any]`` (a free mapping its consumer checks), ``X | None`` (may be null) and
nested dataclasses (sections).
"""

from starpulse.core.schema.flags import Flag, flag_overrides
from starpulse.core.schema.reading import ENV_PREFIX, Override, Reading, address_ok, did_you_mean, read_file, show
from starpulse.core.schema.render import describe, render, to_yaml
from starpulse.core.schema.tree import (
    UNSET,
    ConfigError,
    Leaf,
    Schema,
    Section,
    Spec,
    default_of,
    from_field,
    gather,
    meta,
    section,
    setting,
)

__all__ = [
    "ENV_PREFIX",
    "UNSET",
    "ConfigError",
    "Flag",
    "Leaf",
    "Override",
    "Reading",
    "Schema",
    "Section",
    "Spec",
    "address_ok",
    "default_of",
    "describe",
    "did_you_mean",
    "flag_overrides",
    "from_field",
    "gather",
    "meta",
    "read_file",
    "render",
    "section",
    "setting",
    "show",
    "to_yaml",
]
