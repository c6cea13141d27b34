"""Where a run stands: what the training loop tells a method at every step."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Progress:
    step: int  # optimizer steps taken before this one
    total: int  # optimizer steps in the whole run

    @property
    def fraction(self) -> float:
        return self.step / max(self.total, 1)

    def before(self, fraction: float) -> bool:
        """True while the run is in the first `fraction` of its steps (stage switches at a fixed step)."""
        return self.step < round(fraction * self.total)
