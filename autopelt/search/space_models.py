"""A search space as one model family can take it: the methods it cannot apply (BitFit on Llama, which has no
biases) are left out of the space for that model, so no trial is drawn only to fail; on a decoder the head reads
the last token and T5's the last </s> (no mean pooling)."""

from __future__ import annotations

import dataclasses

from autopelt.delta.inject import why_not
from autopelt.delta.sites import architecture_of
from autopelt.delta.spec import METHODS
from autopelt.errors import UserError
from autopelt.search.space_tree import Choice, Fixed


def cannot_apply(method: str, config) -> str | None:
    """Why a method (at its defaults) cannot apply to models of `config`'s family; None when it can."""
    return why_not(METHODS[method](), architecture_of(config))


def for_model(space, config):
    """`space` without what the family of `config` cannot take; a one-line error when nothing is left."""
    arch = architecture_of(config)
    refused = {m for m in space.methods if cannot_apply(m, config)}
    tree = space.tree
    methods = {m: f for m, f in tree.methods.items() if m not in refused}
    combine = tree.combine
    if isinstance(combine, Choice):
        options = tuple(o for o in combine.options if not set(o.value) & refused)
        combine = dataclasses.replace(combine, options=options) if options else None
    if not methods or combine is None:
        reasons = "; ".join(f"{m}: {cannot_apply(m, config)}" for m in sorted(refused))
        raise UserError(f"search space {space.name} has nothing a {arch.family} model can take ({reasons})")
    head = dict(tree.head)
    if arch.reads_one_token and "pooling" in head:
        head["pooling"] = Fixed("cls")  # a decoder's classifier reads its last token, T5's its last </s>
    return dataclasses.replace(space, tree=dataclasses.replace(tree, methods=methods, combine=combine, head=head))


def cannot_apply_preset(name: str, config) -> str | None:
    """Why a baseline preset cannot apply to models of `config`'s family (its first method that cannot)."""
    from autopelt.delta.presets import PRESETS
    from autopelt.delta.spec import AdaMixConfig, parse_spec

    arch = architecture_of(config)
    for method in parse_spec(PRESETS[name]).methods:
        reason = why_not(method.delta if isinstance(method, AdaMixConfig) else method, arch)
        if reason:
            return reason
    return None
