"""Config documents from text, bounded before a single object is built. No Django.

A config document is plain data: mappings with string keys, lists, strings, whole numbers, finite
numbers, booleans and nulls, a few levels deep. YAML can say much more, and each extra is a way to make
the server work without limit or to hand the planner a value it does not expect:

- anchors and aliases (`&a` / `*a`): 451 bytes of nested aliases expanded to ~230 MB. A document never
  needs them, so any alias is refused while composing, before anything is expanded;
- depth: a mapping 3,000 levels deep. Nodes are counted while composing; past MAX_DEPTH the document
  is refused;
- size: MAX_BYTES of text and MAX_NODES nodes (a flat list of a million nulls is small text);
- tags: `!!binary`, `!!set`, `!!omap`, `!!timestamp` (an unquoted date is kept as the text it is),
  `.nan` / `.inf`, and keys that are not strings (`1:`, `null:`, `true:`) are refused by name.

Each refusal is a ParseRefused with a stable code and a sentence that says what to change.
"""

from __future__ import annotations

import math
from typing import Any, Final

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

try:
    from yaml.cyaml import CParser  # libyaml: PyYAML's wheels carry it
except ImportError:  # pragma: no cover (a PyYAML built without libyaml)
    CParser = None

MAX_BYTES: Final = 4 * 1024 * 1024
MAX_DEPTH: Final = 16  # the deepest real document: section → row → targets → target → value is 5
MAX_NODES: Final = 500_000


class ParseRefused(ValueError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


_CORE_TAGS: Final = frozenset({"tag:yaml.org,2002:str", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
                               "tag:yaml.org,2002:bool", "tag:yaml.org,2002:null", "tag:yaml.org,2002:map",
                               "tag:yaml.org,2002:seq"})


if CParser is not None:

    class _SafeLoader(Composer, SafeConstructor, Resolver, CParser):
        """SafeLoader with libyaml's scanner and parser under PyYAML's own composer, so the checks below still
        see every node as it is composed (yaml.CSafeLoader composes in C, out of their reach). A 20,000-route
        document (860 KB) loads in 1.3 s of CPU instead of 3.1 s with the pure-Python scanner and parser."""

        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)

else:  # pragma: no cover
    _SafeLoader = yaml.SafeLoader


class _Loader(_SafeLoader):
    """SafeLoader that refuses aliases, deep or huge documents and non-core tags while composing."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise ParseRefused("yaml_alias", f"YAML aliases (*{event.anchor}) are not accepted in a config "
                               "document: write the value out where it is used.")
        event = self.peek_event()
        if getattr(event, "anchor", None):
            raise ParseRefused("yaml_alias", f"YAML anchors (&{event.anchor}) are not accepted in a config "
                               "document: write the value out where it is used.")
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise ParseRefused("document_too_large", f"The document has more than {MAX_NODES:,} values.")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise ParseRefused("document_too_deep", f"The document is nested deeper than {MAX_DEPTH} levels.")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


# Dates stay text: a job's `start_at: 2026-12-01T00:00:00Z` is an ISO string to the API, as in the export.
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


def _refuse_tag(loader: _Loader, node: yaml.Node) -> Any:
    raise ParseRefused("yaml_tag_not_allowed", f"The YAML tag {node.tag} is not accepted in a config document "
                       "(plain mappings, lists, text, numbers, true/false and null only).")


for _tag in ("tag:yaml.org,2002:binary", "tag:yaml.org,2002:set", "tag:yaml.org,2002:omap",
             "tag:yaml.org,2002:pairs", "tag:yaml.org,2002:timestamp", None):
    _Loader.add_constructor(_tag, _refuse_tag)


def load(text: str | bytes) -> Any:
    """The document in `text` (YAML, or JSON, which is YAML), as plain data. Raises ParseRefused."""
    if isinstance(text, bytes):
        if len(text) > MAX_BYTES:
            raise ParseRefused("document_too_large", f"The document is larger than {MAX_BYTES // 1024 // 1024} MB.")
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise ParseRefused("invalid_document", "The document is not UTF-8 text.") from None
    if len(text) > MAX_BYTES:
        raise ParseRefused("document_too_large", f"The document is larger than {MAX_BYTES // 1024 // 1024} MB.")
    try:
        loader = _Loader(text)
    except yaml.YAMLError as exc:
        raise ParseRefused("invalid_document", f"Not YAML or JSON: {exc}") from None
    except UnicodeEncodeError:  # libyaml reads UTF-8: a lone surrogate (JSON's "\udcff") cannot be one
        raise ParseRefused("invalid_document", "The document is not UTF-8 text.") from None
    try:
        data = loader.get_single_data()
    except ParseRefused:
        raise
    except yaml.YAMLError as exc:
        raise ParseRefused("invalid_document", f"Not YAML or JSON: {exc}") from None
    except RecursionError:
        raise ParseRefused("document_too_deep", f"The document is nested deeper than {MAX_DEPTH} levels.") from None
    except ValueError as exc:  # an integer of more digits than Python converts (4,300), and the like
        raise ParseRefused("invalid_number", f"A value cannot be read as the number it looks like: {exc}") from None
    finally:
        loader.dispose()
    check_plain(data)
    return data


def check_plain(data: Any) -> None:
    """Refuse what JSON cannot say either: non-string keys, NaN and infinities (iteratively, any depth)."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ParseRefused("document_too_deep", f"The document is nested deeper than {MAX_DEPTH} levels.")
        if isinstance(value, float) and not math.isfinite(value):
            raise ParseRefused("invalid_number", f"{value} is not a number a config document can hold.")
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise ParseRefused("invalid_key", f"Every key must be text; {key!r} is a "
                                       f"{type(key).__name__}. Quote it if it is a name.")
                stack.append((item, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)
        elif not (value is None or isinstance(value, str | bool | int | float)):
            raise ParseRefused("invalid_document", f"A {type(value).__name__} value is not accepted here.")
