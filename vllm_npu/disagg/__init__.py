"""Prefill/decode disaggregated serving: the router and a one-command launcher."""
