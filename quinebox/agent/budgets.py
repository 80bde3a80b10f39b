"""What an agent may spend: turns per conversation, exec cycles, and tokens shared with its subtree.

The tree hands each box a `TokenPool`; a session spends from it, and the
tree reserves from it what a child may spend, so the pool lives here, below
both.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

DEFAULT_MAX_TURNS = 40
DEFAULT_MAX_CYCLES = 10


class TokenPool:
    """Tokens a box may still spend, on its own model calls or by handing them to children.

    A child's `tokens:N` is reserved from its parent's pool when it starts and
    what it did not use comes back when it ends, so a subtree never spends more
    than its root was granted.
    """

    def __init__(self, limit: int | None):
        self.limit = limit
        self.left = limit
        self._lock = threading.Lock()

    def spend(self, tokens: int) -> None:
        with self._lock:
            if self.left is not None:
                self.left -= tokens

    def refund(self, tokens: int) -> None:
        self.spend(-tokens)

    @property
    def exhausted(self) -> bool:
        return self.left is not None and self.left <= 0


@dataclass
class Budget:
    max_turns: int = DEFAULT_MAX_TURNS
    max_cycles: int = DEFAULT_MAX_CYCLES
    tokens: TokenPool = field(default_factory=lambda: TokenPool(None))
