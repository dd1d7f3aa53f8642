"""One generic registry of names, used by every list of names in the harness.

    OBJECTIVES = Registry("objective")
    @OBJECTIVES.register("ppo")          # decorator ...
    def _ppo(...): ...
    OBJECTIVES.register("mine", thing)   # ... or call
    OBJECTIVES.get("nope")   # ValueError: objective='nope' is not registered; choose one of [...]
    name: OBJECTIVES.Name    # a pydantic field type: a str validated against the registry at
                             # validation time (a runtime registration is accepted), whose JSON
                             # schema lists the names registered when the schema is built

It sits in the lowest layer (algorithms/, imported by every other package) so that the
algorithms' own registries (objectives, schedules, divergences, estimators, aggregations,
advantages, methods) and the shared layer's (engines, scorers, templates, benchmarks,
metrics) are one class with one error message. Reading it is like reading a dict: `name in
R`, `R[name]`, `list(R)`, `len(R)`, `R.items()`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Generic, TypeVar

from pydantic import AfterValidator, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

T = TypeVar("T")
_DECORATE: Any = object()  # register's "no thing given" (None is a thing: a hub-less benchmark)


class Registry(Mapping[str, T], Generic[T]):
    """Names -> registered things, in registration order; `kind` names the list in errors."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self.Name = Annotated[str, AfterValidator(self.check), _NamesSchema(self)]

    def register(self, name: str, thing: T = _DECORATE) -> Any:
        """Register `thing` under `name`; without `thing`, a decorator that registers the
        decorated object and returns it unchanged. A name registered twice is an error."""

        def add(obj: T) -> T:
            if not name or name in self._items:
                raise ValueError(f"{self.kind} {name!r} is empty or registered twice")
            self._items[name] = obj
            return obj

        return add if thing is _DECORATE else add(thing)

    def __setitem__(self, name: str, thing: T) -> None:
        """Register or replace `name` (tests: pytest's monkeypatch.setitem)."""
        self._items[name] = thing

    def __delitem__(self, name: str) -> None:
        """Remove `name` (a test's runtime registration, undone)."""
        del self._items[name]

    def get(self, name: str, *default: T) -> T:  # type: ignore[override]
        """The thing registered as `name`; a miss lists what is registered (or, given a
        `default` as dict.get takes one, returns it)."""
        try:
            return self._items[name]
        except (KeyError, TypeError):
            if default:
                return default[0]
            raise ValueError(self.unknown(name)) from None

    def check(self, name: str) -> str:
        """`name` if it is registered (a pydantic AfterValidator); else the lookup's error."""
        self.get(name)
        return name

    def unknown(self, name: object) -> str:
        """The one error message of a failed lookup."""
        return f"{self.kind}={name!r} is not registered; choose one of {self.names()}"

    def names(self) -> list[str]:
        return list(self._items)

    def __getitem__(self, name: str) -> T:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"


class _NamesSchema:
    """JSON schema of a Registry.Name field: a string enum of the names registered now."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {"enum": self.registry.names(), "type": "string"}

