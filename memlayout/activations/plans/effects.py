"""What checkpointing a span of calls does to the baseline's live bytes: the gaps a plan option is made of.

Checkpointing one call of a module (or a run of sibling calls: a segment) frees, from the
end of its forward until its backward begins, every storage allocated inside it and saved
for backward, except its outputs (the next module holds them). Its inputs are kept alive
until then (checkpoint keeps them to rerun). When its backward begins its forward reruns:
at that one event what the rerun allocates comes back, and the rerun frees its temporaries
before backward goes on. plans/plan.py reads the gaps into its matrix of intervals.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memlayout.activations.facts import ModuleCall, StorageKind, Trace
from memlayout.activations.plans.options import Gap
from memlayout.activations.summary import subtree_calls

if TYPE_CHECKING:
    import numpy as np


class Effects:
    """The baseline's storages as arrays, and the gaps of checkpointing any span of its calls."""

    def __init__(self, trace: Trace, curve: np.ndarray) -> None:
        import numpy as np

        self.trace = trace
        self.curve = curve
        storages = trace.storages
        self._born = np.fromiter((s.born for s in storages), dtype=np.int64, count=len(storages))
        self._freeable = np.fromiter(
            (s.nbytes if s.saved and s.kind is StorageKind.STEP else 0 for s in storages),
            dtype=np.int64, count=len(storages),
        )
        self._freeable_prefix = np.concatenate(([0], np.cumsum(self._freeable)))
        self._died = np.fromiter((trace.events + 1 if s.died is None else s.died for s in storages), dtype=np.int64,
                                 count=len(storages))
        self._nbytes = np.fromiter((s.nbytes for s in storages), dtype=np.int64, count=len(storages))
        self.inside = subtree_calls(trace)
        """call id -> the ids of the forward calls inside it, itself included."""

    def rerun_calls(self, first: ModuleCall, last: ModuleCall) -> list[ModuleCall]:
        """Every forward call inside the calls from `first` to `last`: what a segment reruns."""
        return [self.trace.calls[i] for c in self._span(first, last) for i in self.inside[c.id]]

    def gaps(self, first: ModuleCall, last: ModuleCall) -> tuple[Gap, ...]:
        """The effect of checkpointing the calls from `first` to `last` (one call, or a segment)."""
        import numpy as np

        trace = self.trace
        starts = [trace.calls[i].backward_start for c in self._span(first, last) for i in self.inside[c.id]]
        known = [s for s in starts if s is not None]
        if not known:
            return self._unreached_gaps(first, last)
        backward_start = min(known)
        start, end = first.start, last.end
        low = int(np.searchsorted(self._born, start, side="right"))
        high = int(np.searchsorted(self._born, end, side="right"))
        freed = int(self._freeable_prefix[high] - self._freeable_prefix[low])
        outputs = last.output_storages
        saved_outputs = sum(int(self._freeable[i]) for i in outputs if low <= i < high)
        freed -= saved_outputs
        kept_inputs = sum(
            trace.storages[i].nbytes
            for i in first.input_storages
            if trace.storages[i].kind is StorageKind.STEP
            and trace.storages[i].died is not None
            and (trace.storages[i].died or 0) <= backward_start
        )
        # The rerun stops once it has made every tensor backward needs (checkpoint's early stop, torch's default),
        # so it allocates what forward allocated in the span up to the last storage saved there. Its peak is taken
        # over what the span allocated alone: forward's curve also fell where the span's input was freed, which the
        # rerun keeps (a ReLU saves its output, not its input).
        saved = np.flatnonzero(self._freeable[low:high])
        until = int(self._born[low + saved[-1]]) if len(saved) else start
        rerun = self._allocated_peak(low, int(np.searchsorted(self._born, until, side="right")), until)
        # The outputs the span saved for itself are placeholders now: once backward reaches the span, whatever
        # outside held them has had its own backward, and the rerun makes them again (a ReLU's output, saved by
        # the ReLU and by the next convolution, counted twice: 109.3 MB estimated, 101.5 MB measured).
        rerun -= saved_outputs
        # checkpoint keeps the generator's state from forward to the rerun, whose fork takes one more.
        rng = trace.rng_state_bytes
        # A run of several calls holds its inputs until its first call's backward (the last of the run's to begin).
        released = first.backward_start if first.id != last.id and kept_inputs else None
        return (Gap(end, backward_start, max(freed, 0), kept_inputs + rng, rerun + rng, released=released,
                    kept_after=kept_inputs if released is not None else 0),)

    def _allocated_peak(self, low: int, high: int, until: int) -> int:
        """The peak, up to event `until`, of the bytes alive among storages `low` to `high - 1` (born in order)."""
        import numpy as np

        if high <= low:
            return 0
        born, died, nbytes = self._born[low:high], self._died[low:high], self._nbytes[low:high]
        gone = died <= until
        times = np.concatenate([born, died[gone]])
        deltas = np.concatenate([nbytes, -nbytes[gone]])
        return int(max(np.cumsum(deltas[np.argsort(times, kind="stable")]).max(), 0))

    def _unreached_gaps(self, first: ModuleCall, last: ModuleCall) -> tuple[Gap, ...]:
        """The effect of checkpointing calls that backward never reaches, though autograd saved for them.

        Their graph lives while something holds their output: an encoder's output
        returned beside the loss that does not depend on it (an encoder-decoder whose
        decoder has no cross-attention) keeps everything its graph saved until the
        output is dropped, over the end of forward, where the peak often is.
        Checkpointed, the call saves placeholders instead, and backward never asks
        for a rerun. One gap per moment such storages die, each freeing those.
        Under no_grad nothing is saved and there is nothing to free.
        """
        trace = self.trace
        storages = trace.storages
        outputs = set(last.output_storages)
        dies: dict[int, int] = {}
        for c in self._span(first, last):
            for call in self.inside[c.id]:
                for i in trace.calls[call].saved_storages:
                    died = storages[i].died or trace.events
                    if storages[i].kind is StorageKind.STEP and i not in outputs and died > last.end:
                        dies[i] = died
        if not dies:
            return ()
        until = max(dies.values())
        # checkpoint holds the inputs until the graph (the last of these storages) goes.
        kept_inputs = sum(
            storages[i].nbytes
            for i in first.input_storages
            if storages[i].kind is StorageKind.STEP and (storages[i].died or trace.events + 1) <= until
        )
        freed: dict[int, int] = {}
        for i, died in dies.items():
            freed[died] = freed.get(died, 0) + storages[i].nbytes
        kept_inputs += trace.rng_state_bytes  # the generator's state, kept with the inputs
        return tuple(
            Gap(last.end, died, nbytes, kept_inputs if died == until else 0, 0, reruns=False)
            for died, nbytes in sorted(freed.items())
        )

    def _span(self, first: ModuleCall, last: ModuleCall) -> list[ModuleCall]:
        if first.id == last.id:
            return [first]
        return [c for c in self.trace.calls if c.parent == first.parent and first.id <= c.id <= last.id]
