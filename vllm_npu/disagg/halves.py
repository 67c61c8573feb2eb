"""What each half of a disaggregated request is sent, and what a prefill half's answer means.

The router sends the client's request twice under one transfer id: to a prefill instance
for one token (it computes the prompt's KV and keeps the blocks for the decode side to pull)
and to a decode instance (it pulls the KV and generates the answer).
"""
from __future__ import annotations

import httpx

# Request fields the prefill half goes without (see prefill_body); none changes the prompt
# (a chat's tools do: they stay).
PREFILL_DROPS = frozenset({
    "stream_options", "n", "stop", "stop_token_ids", "structured_outputs", "response_format",
    "guided_json", "guided_regex", "guided_choice", "guided_grammar"})


def prefill_body(body: dict, xfer: str) -> dict:
    """The prefill half: one token, run to its limit. The prefill instance sends the KV only
    of a request that ended at its token limit (vLLM 0.33's
    MooncakeConnectorScheduler.request_finished: any other status is "not processed"), while
    the decode half waits for it up to VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT (480 s). So
    nothing may end its one token early: EOS or a stop token (min_tokens), a stop string, a
    grammar's end. Its token is discarded; the decode half samples with all of them."""
    out = {k: v for k, v in body.items() if k not in PREFILL_DROPS}
    out.update(max_tokens=1, min_tokens=1, stream=False, kv_transfer_params={
        "do_remote_decode": True, "do_remote_prefill": False, "transfer_id": xfer})
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    return out


def decode_body(body: dict, engine_id: str, bootstrap: str, xfer: str) -> dict:
    """The decode half: the client's request, its KV pulled from the prefill engine."""
    return dict(body, kv_transfer_params={
        "do_remote_decode": False, "do_remote_prefill": True, "remote_engine_id": engine_id,
        "remote_bootstrap_addr": bootstrap, "transfer_id": xfer})


def fans_out(body: dict) -> bool:
    """More than one sample per prompt (n, or best_of above 1). vLLM 0.33 hands each sample
    the request's kv_transfer_params: each pulls the one transfer, and a second pull waits
    for KV the prefill side no longer has, failing after VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT
    (seen: n=2 answered 500 after 30 s). Such a request runs whole on a decode instance."""
    return any(isinstance(body.get(k), int) and body[k] > 1 for k in ("n", "best_of"))


def finish_reason(reply: httpx.Response) -> str | None:
    """A prefill half's finish_reason: 'length' is the only one whose KV is sent."""
    try:
        return reply.json()["choices"][0]["finish_reason"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
