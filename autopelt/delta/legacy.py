"""What a spec saved by an older autopelt meant, written in today's fields.

Format 1 (autopelt-delta/1) predates the methods' reference forms (each named method as its paper's code has it).
Its specs leave out fields that did not exist yet, and some values meant something else then:

- adapter placement "pfeiffer" was an adapter on the FFN projection output, before its dropout: today's "ffn";
- a gated prefix had two gate values per layer (keys, values): `split_gate: true`;
- BitFit left the pooler's bias frozen: `pooler: false`;
- AdaMix drew each expert independently (`expert_init: independent`), and mixed a houlsby/relu adapter of
  bottleneck 16 when its delta was left out.

A format-1 spec upgraded here builds the same modules and gives the same outputs as it did when it was saved.
"""

from __future__ import annotations

V1_DEFAULTS = {"prefix": {"split_gate": True}, "bitfit": {"pooler": False}, "adamix": {"expert_init": "independent"}}
V1_ADAPTER_NAMES = {  # format 1's adapter presets (the name set the placement and projection)
    "houlsby": {"placement": "houlsby"},
    "pfeiffer": {"placement": "pfeiffer"},
    "phm_adapter": {"placement": "houlsby", "projection": "phm"},
    "compacter": {"placement": "houlsby", "projection": "compacter"},
    "compacter++": {"placement": "pfeiffer", "projection": "compacter"},
}
V1_ADAPTER = {"placement": "houlsby", "activation": "relu"}  # format 1's AdapterConfig defaults that changed meaning
V1_ADAMIX_DELTA = {"method": "adapter", "placement": "houlsby", "bottleneck": 16, "activation": "relu"}


def upgrade_v1(spec: dict) -> dict:
    """A format-1 spec dict in today's fields (a new dict; entries it does not know are left to the parser)."""
    if not isinstance(spec, dict) or not isinstance(spec.get("methods"), list):
        return spec
    return {**spec, "methods": [_entry(entry) for entry in spec["methods"]]}


def _entry(entry):
    if not isinstance(entry, dict):
        return entry
    method = entry.get("method")
    if method == "adapter" or method in V1_ADAPTER_NAMES:
        return _adapter(entry)
    entry = {**V1_DEFAULTS.get(method, {}), **entry}
    if method == "adamix":
        entry["delta"] = _entry(entry.get("delta", V1_ADAMIX_DELTA))
    return entry


def _adapter(entry: dict) -> dict:
    fields = {**V1_ADAPTER, **V1_ADAPTER_NAMES.get(entry["method"], {}),
              **{k: v for k, v in entry.items() if k != "method"}}
    if fields["placement"] == "pfeiffer":
        fields["placement"] = "ffn"
    return {"method": "adapter", **fields}
