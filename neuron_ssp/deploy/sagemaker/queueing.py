"""An instance serving `slots` requests at once as an M/M/c queue: what a concurrency target means for it.

Poisson arrivals, c = the serving batch, each running request taking the same time S whatever the others do.
On Neuron that holds for a step: the compiled (batch, k) network runs every row, live or padded. What it
leaves out: a joining request's prefill stalls the running rows, and a loop that takes a whole batch per call
(no joining mid-way: the plan's reason says "a request joins only between batches") waits longer than M/M/c
says. Erlang C gives the chance an arrival waits; the mean number in the system L (running + waiting) is what
SageMaker's ConcurrentRequestsPerModel counts: requests the container holds, those queued inside it included,
until the last token is sent (SageMaker developer guide, "Define a scaling policy", high-resolution metrics).
For c = 1 it is M/M/1: L = ρ/(1-ρ).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SlotQueue:
    slots: int
    utilisation: float  # ρ: the mean fraction of the slots busy, 0 <= ρ < 1

    @property
    def wait_probability(self) -> float:
        """Erlang C, through Erlang B's recursion (no factorials to overflow)."""
        load = self.slots * self.utilisation
        blocking = 1.0
        for n in range(1, self.slots + 1):
            blocking = load * blocking / (n + load * blocking)
        return blocking / (1.0 - self.utilisation * (1.0 - blocking))

    @property
    def in_system(self) -> float:
        """L: mean requests running or waiting."""
        rho = self.utilisation
        return self.slots * rho + self.wait_probability * rho / (1.0 - rho)

    @property
    def wait_in_generations(self) -> float:
        """Mean wait before a request starts, in units of one request's generation time S."""
        return self.wait_probability / (self.slots * (1.0 - self.utilisation))


def at_concurrency(slots: int, concurrency: float) -> SlotQueue:
    """The queue whose mean number in the system is `concurrency` (> 0): L grows from 0 to infinity with ρ."""
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if SlotQueue(slots, middle).in_system < concurrency else (low, middle)
    return SlotQueue(slots, (low + high) / 2)
