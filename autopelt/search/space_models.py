"""A search space as one model family can take it: the methods it cannot apply (BitFit on Llama, which has no
biases) are left out of the space for that model, so no trial is drawn only to fail; on a decoder the head reads
the last token and T5's the last </s> (no mean pooling). A portfolio learned on an encoder is taken the same way:
its members read the one token there, and a member the family cannot take is left out."""

from __future__ import annotations

import dataclasses

from autopelt.delta.inject import why_not
from autopelt.delta.registry import innermost
from autopelt.delta.families import architecture_of
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
    from autopelt.delta.spec import parse_spec

    return _refusal(parse_spec(PRESETS[name]), architecture_of(config))


def _refusal(spec, arch) -> str | None:
    """Why a parsed spec's first method that `arch` cannot take cannot (a wrapper, AdaMix: the delta it wraps);
    None if none."""
    return next((reason for method in spec.methods if (reason := why_not(innermost(method), arch))), None)


def configuration_for_model(member, config):
    """A portfolio configuration (portfolio.config.Config) as a model of `config`'s family runs it: on a decoder or
    T5 it reads the one token the family's classifier reads; None when the family cannot take one of its methods."""
    from autopelt.delta.spec import parse_spec

    arch = architecture_of(config)
    if _refusal(parse_spec(member.spec(int(config.num_hidden_layers))), arch):
        return None
    return dataclasses.replace(member, pooling="cls") if arch.reads_one_token and member.pooling != "cls" else member


def portfolio_for_model(portfolio, config) -> tuple[object, str]:
    """`portfolio` as a model of `config`'s family can run it (`configuration_for_model`: members read the family's
    one token, members with a method the family cannot take are left out); and a line saying what changed ("" when
    nothing did). A one-line error when no member is left."""
    arch = architecture_of(config)
    kept, dropped = [], []
    for member in portfolio.members:
        adapted = configuration_for_model(member, config)
        if adapted is None:
            dropped.append(member.name)
        else:
            kept.append(adapted)
    if not kept:
        raise UserError(f"no member of portfolio {portfolio.source} applies to a {arch.family} model; pass "
                        "--portfolio none")
    said = []
    if arch.reads_one_token and any(m.pooling != "cls" for m in portfolio.members):
        said.append(f"its members read the last {'</s>' if len(arch.stacks) == 2 else 'token'}, as a {arch.family} "
                    "classifier does (they were learned reading the mean)")
    if dropped:
        said.append(f"left out, as a {arch.family} model cannot take them: {', '.join(dropped)}")
    return dataclasses.replace(portfolio, members=tuple(kept)), ("portfolio on this model: " + "; ".join(said)
                                                                 if said else "")
