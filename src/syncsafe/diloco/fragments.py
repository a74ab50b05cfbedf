"""Streaming DiLoCo's fragments: a model's parameters cut into contiguous groups of layers.

With `train.sync.mode: streaming` each sync event merges one fragment instead of the whole model. Fragment f
of F holds the f-th of F contiguous runs of the decoder layers (the layer indices split as evenly as numpy's
`array_split` splits them); the parameters before the first layer (the embeddings) join the first fragment,
those after the last (final norm, LM head) the last, as torchft fragments a model. Every fragment is then one
contiguous range of the flat parameter vector (`outer.ParameterLayout`): its outer step, its all-reduce
buffer and its momentum are those of that range alone. One fragment is the whole model, whatever its names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

#: A decoder layer's index in a parameter name (`model.layers.3.mlp.up_proj.weight` -> 3).
LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class FragmentError(ValueError):
    """The model cannot be cut into the fragments asked for."""


@dataclass(frozen=True)
class Fragment:
    """One fragment: its parameters (indices into the model's parameter list) and its flat range."""

    index: int
    first_param: int
    end_param: int
    start: int
    end: int

    @property
    def numel(self) -> int:
        return self.end - self.start


def cut_fragments(names: tuple[str, ...], numels: tuple[int, ...], n_fragments: int) -> list[Fragment]:
    """The `n_fragments` fragments of a model whose parameters, in order, are `names` with `numels` elements."""
    if n_fragments < 1:
        raise FragmentError(f"train.sync.fragments must be >= 1, got {n_fragments}")
    if n_fragments == 1:
        return [Fragment(0, 0, len(names), 0, int(sum(numels)))]
    layers = [int(m.group(1)) if (m := LAYER.search(name)) else None for name in names]
    ids = sorted({layer for layer in layers if layer is not None})
    if len(ids) < n_fragments:
        raise FragmentError(f"train.sync.fragments {n_fragments}: the model has {len(ids)} decoder layers "
                            f"(parameters named '...layers.<i>...'), at most that many fragments")
    group_of = {layer: g for g, chunk in enumerate(np.array_split(np.asarray(ids), n_fragments)) for layer in chunk}
    layered = [i for i, layer in enumerate(layers) if layer is not None]
    groups: list[int] = []
    for i, (name, layer) in enumerate(zip(names, layers)):
        group = (group_of[layer] if layer is not None else 0 if i < layered[0]
                 else n_fragments - 1 if i > layered[-1] else -1)  # embeddings first, norm and head last
        if group < 0 or (groups and group < groups[-1]):
            raise FragmentError(f"train.sync.fragments {n_fragments}: parameter '{name}' breaks the layer order "
                                "(a fragment must be one contiguous run of parameters)")
        groups.append(group)
    offsets = np.concatenate([[0], np.cumsum(numels)]).astype(int)
    fragments = []
    for g in range(n_fragments):
        members = [i for i, group in enumerate(groups) if group == g]
        first, end = members[0], members[-1] + 1
        fragments.append(Fragment(g, first, end, int(offsets[first]), int(offsets[end])))
    return fragments


__all__ = ["Fragment", "FragmentError", "LAYER", "cut_fragments"]
