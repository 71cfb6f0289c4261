"""The one walk over a search space's tree: `walk` meets each place of a space (a domain, a constant, a sub-space,
the sub-space a branching `Choice` takes) as a `Node`, with its path, the config dict holding its value, and its
kind. `Space` expresses its operations through it: checking, rules, decisions (mutate, neighbours, perturb) and the
token encoding.

A class says what kind of node its instances are with a `node_kind` class attribute ("space": a `Space`, whose
`domains` the walk enters; "choice": a `Choice`, whose `options` may be sub-spaces); any other `Domain` is a
"domain", anything else a "constant".
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from nasplat.space.domains import Domain

DOMAIN_KINDS = frozenset({"choice", "domain"})
"""The kinds of node that are domains: a decision, and a position of the token encoding."""

_KINDS: dict[type, str] = {}  # the kind of each type met
_LOOK_UP = object()  # `Node.taken` not set by the consumer: the option the value takes


def kind_of(value: Any) -> str:
    """The kind of node `value` is: "space", "choice", "domain" or "constant" (see the module's docstring)."""
    kind = _KINDS.get(type(value))
    if kind is None:
        kind = getattr(type(value), "node_kind", None) or ("domain" if isinstance(value, Domain) else "constant")
        _KINDS[type(value)] = kind
    return kind


class Node:
    """A place in a space's tree, as `walk` meets it.

    `domain` (of the `kind` "space", "choice", "domain" or "constant") is at `key` of `holder`, the config dict that
    holds its value (None inside a branch the config did not take); `path` joins the keys with dots (for messages:
    keys may hold dots). The sub-space a choice takes is a "space" node of its own, at the choice's key, after it.
    """

    __slots__ = ("domain", "holder", "key", "kind", "path", "taken")

    def __init__(self, path: str, key: str, domain: Any, holder: dict[str, Any] | None, kind: str) -> None:
        self.path, self.key, self.domain, self.holder, self.kind = path, key, domain, holder, kind
        self.taken: Any = _LOOK_UP
        """For a choice: the index of the option whose sub-space the walk enters next (None: none). Unless the
        walk's consumer sets it while it holds the node (after replacing the value), the option the value takes."""

    @property
    def config(self) -> dict[str, Any]:
        """The config dict holding the node's value (`holder`, which a node in a branch not taken has not)."""
        if self.holder is None:
            raise TypeError(f"{self.path!r} is in a branch the config did not take: no config holds its value")
        return self.holder

    @property
    def value(self) -> Any:
        """The node's value in the config."""
        return self.config[self.key]

    @property
    def decides(self) -> bool:
        """Whether the node is a decision: a domain, but a `Choice` of one option (whose sub-space is walked)."""
        return self.kind == "domain" or (self.kind == "choice" and self.domain.cardinality > 1)


def walk(space: Any, holder: dict[str, Any] | None, prefix: str = "", branches: str = "taken") -> Iterator[Node]:
    """The nodes of the `Space` `space` depth first, in key order, with their values in the config `holder` (None:
    no config).

    `branches`: "taken", a choice's node is followed by the option its value takes, if a sub-space, and its nodes;
    "all", by every sub-space option (those not taken with no holder: the token encoding's fixed positions);
    "none", by nothing (a `Choice` checks its own options). Sub-spaces' nodes follow theirs in every mode.
    """
    for key, domain in space.domains.items():
        kind = _KINDS.get(type(domain)) or kind_of(domain)
        node = Node(prefix + key, key, domain, holder, kind)
        yield node
        if kind == "space":
            yield from walk(domain, None if holder is None else holder[key], node.path + ".", branches)
        elif kind == "choice" and branches != "none":
            taken = node.taken
            if taken is _LOOK_UP:
                value = None if holder is None else holder[key]
                taken = domain.index(node.path, value) if isinstance(value, Mapping) else None
            if branches == "taken":
                options: Iterable[tuple[int, Any]] = () if taken is None else ((taken, domain.options[taken]),)
            else:
                options = enumerate(domain.options)
            for i, option in options:
                if (_KINDS.get(type(option)) or kind_of(option)) == "space":
                    inside = holder if i == taken else None
                    yield Node(node.path, key, option, inside, "space")
                    yield from walk(option, None if inside is None else inside[key], node.path + ".", branches)
