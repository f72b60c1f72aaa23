"""What a rule reports into, and checks several rule modules share."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field


@dataclass
class Findings:
    """The errors (and warnings) found for one model, each naming model, file and field.

    A warning does not stop the model: it says what the server accepts and does not act on.
    """

    model: str
    source: str  # the config file, as shown to the user
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def add(self, where: str, rule: str) -> None:
        self.errors.append(self._line(where, rule))

    def warn(self, where: str, rule: str) -> None:
        self.warnings.append(self._line(where, rule))

    def _line(self, where: str, rule: str) -> str:
        return f"model '{self.model}' ({self.source}): {where}: {rule}"

    def __bool__(self) -> bool:
        return bool(self.errors)


@dataclass(frozen=True)
class ModelFiles:
    """What the rules may ask about the model's folder."""

    exists: Callable[[str], bool]  # path relative to the model folder -> present?


DIMS_RULE = "dimension must be integer >= 1, or -1 to indicate a variable-size dimension"


def check_dims(dims: Sequence[int], where: str, findings: Findings, prefix: str = "") -> None:
    """Each dimension is >= 1, or -1 for a variable size (Triton's wording, after ``prefix``)."""
    bad = [dim for dim in dims if dim == 0 or dim < -1]
    if bad:
        findings.add(where, f"{prefix}{DIMS_RULE} (got {list(dims)})")


def check_unique(names: Iterable[str], kind: str, findings: Findings) -> None:
    """Report each name that occurs more than once."""
    for name, count in Counter(names).items():
        if name and count > 1:
            findings.add(kind, f"duplicate {kind} name '{name}' ({count} times)")
